"""`autoscaler analyze`: the four preflight answers on demand with known answers, every trace, and the
recommended policy section accepted by run, replay and the benchmark (which checks it meets the targets)."""

import csv
import json
from pathlib import Path

import pytest

from autoscaler.analyze.report import _classes_line, _plot_classes, summary
from autoscaler.cli import main
from autoscaler.config import load_config, load_policy_spec
from loadtest.bench import main as bench

from helpers import BUNDLED_TRACE, ROOT

SHARED = ROOT.parent / "shared" / "traces"
TICK = 15.0
SERVICE = 1.0  # s per request: with 8 slots per replica, 40 req/s is 40 busy slots


def _recording(path: Path) -> None:
    """Eight hours at 15-s ticks: 40 req/s (6 replicas at the SLO), with three planted bursts to 80 req/s of
    60 s (shorter than a 120-s start-up), 240 s (within the 420-s cold start) and 900 s (longer); 10
    replicas loaded throughout and 6 busy: a residency of 10 / 6."""
    bursts = [(2 * 3600, 60), (4 * 3600, 240), (6 * 3600, 900)]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "arrival_rate_per_s", "in_flight", "service_time_s", "spec_replicas", "ready_replicas",
                         "arrival_rate_critical", "arrival_rate_standard", "arrival_rate_sheddable"])
        t = 0.0
        while t < 8 * 3600:
            rate = 80.0 if any(s <= t < s + d for s, d in bursts) else 40.0
            writer.writerow([t, rate, 6.0 if rate == 40 else 10.0, SERVICE, 10, 10, 0.2 * rate, 0.5 * rate, 0.3 * rate])
            t += TICK


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("analyze")
    _recording(folder / "rec.csv")
    policy = folder / "policy.yaml"
    policy.write_text("replica_concurrency: 8\n")
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["analyze", str(folder / "rec.csv"), "--policy", str(policy), "--json", "--out", str(folder),
                     "--write-config", str(folder / "recommended.yaml")]) == 0
    return json.loads(buffer.getvalue()), folder


def test_the_floor_and_the_bands(answers):
    a, _ = answers
    floor = a["concurrency_floor"]
    needed = a["concurrency_bands"]["replicas"]["p50"]
    assert floor["1h"]["replicas_p10"] == pytest.approx(needed) and floor["replicas"] == int(needed)
    assert floor["1h"]["concurrency_p10"] == pytest.approx(6.0)  # the recorded in-flight, not Little's law
    bands = a["concurrency_bands"]["bands"]
    assert sum(b["share_of_time"] for b in bands.values()) == pytest.approx(1.0)
    assert bands["above p99"]["share_of_time"] < 0.05  # the bursts' peaks
    assert max(b["mean_stay_s"] for b in bands.values()) > 3600  # the steady level holds for hours


def test_planted_bursts_are_found_and_classed_against_the_cold_start(answers):
    a, _ = answers
    found = sorted((b["start_s"], b["duration_s"], b["class"]) for b in a["bursts"])
    assert found == [(7200.0, 60.0, "noise"), (14400.0, 240.0, "warm"), (21600.0, 900.0, "capacity")]
    assert a["cold_start_window_s"]["total"] == 420.0
    assert a["burst_ceiling"]["ceiling_replicas"] > a["concurrency_floor"]["1h"]["replicas_p10"]  # the 900-s one
    assert a["burst_ceiling"]["ceiling_reached_times"] == 3  # every burst reached that level, one held it


def test_residency_against_compute(answers):
    a, _ = answers
    r = a["residency"]
    assert r["loaded_from"] == "recorded ready replicas"
    assert r["loaded_gpu_hours"] == pytest.approx(80.0, rel=0.01)  # 10 replicas x 8 h
    burst_h = (60 + 240 + 900) / 3600
    busy = 6 * (8 - burst_h) + 10 * burst_h  # 6 replicas busy, all 10 during the bursts
    assert r["busy_gpu_hours"] == pytest.approx(busy, rel=0.01)
    assert r["residency_over_compute"] == pytest.approx(80.0 / busy, rel=0.01)
    assert r["idle_loaded_gpu_hours"] == pytest.approx(80.0 - busy, rel=0.02)
    # what links busy and slot use: the requests a busy replica holds (6 of 8 slots at the steady level)
    in_flight_h = 6 * (8 - burst_h) + 10 * burst_h
    assert r["in_flight_per_busy_replica"] == pytest.approx(in_flight_h / busy, rel=0.01)


def test_the_burst_ceiling_is_never_below_the_floor(capsys):
    """The bundled trace at scale 1: no level above one replica lasts a cold start (the longest held is 0
    replicas), while the floor keeps 1 loaded; the ceiling is the floor and the summary says why."""
    assert main(["analyze", str(BUNDLED_TRACE), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    ceiling = a["burst_ceiling"]
    assert ceiling["held_longer_than_cold_start_replicas"] < a["concurrency_floor"]["replicas"]
    assert ceiling["ceiling_replicas"] == a["concurrency_floor"]["replicas"] and ceiling["ceiling_raised_to_floor"]
    assert "burst ceiling 1 replicas (the floor: no higher level lasted a cold start)" in summary(a)
    # the recommendation sizes from the level itself: the floor is kept anyway
    assert f"held longer than a cold start needs {ceiling['held_longer_than_cold_start_replicas']:.0f} replicas" \
        in a["recommended"]["why"]["max_replicas"]


def test_a_recording_without_classes_says_so_in_words_and_in_panel_four():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = {"source": "no per-priority series in the recording", "per_class": {}}
    assert "4. classes: not in the data (no per-priority series in the recording)" in _classes_line(classes)
    fig, ax = plt.subplots()
    _plot_classes(ax, classes)
    assert any("not in the data" in t.get_text() for t in ax.texts) and not ax.patches  # words, not empty axes
    plt.close(fig)


def test_only_the_sheddable_classes_are_offered_what_shedding_saves():
    per = {"critical": {"share_of_requests": 0.2, "sheddable": False, "replicas_saved_at_peak_if_shed": 3},
           "sheddable": {"share_of_requests": 0.3, "sheddable": True, "replicas_saved_at_peak_if_shed": 2}}
    line = _classes_line({"source": "test", "per_class": per})
    assert "critical 20% of requests, never shed" in line
    assert "sheddable 30% of requests, shedding it saves 2 replicas at the peak" in line


def test_classes_from_the_recorded_per_priority_rates(answers):
    a, _ = answers
    per = a["classes"]["per_class"]
    assert a["classes"]["source"] == "recorded per-priority arrival rates"
    assert per["sheddable"]["share_of_requests"] == pytest.approx(0.3) and per["sheddable"]["sheddable"]
    assert not per["critical"]["sheddable"] and per["critical"]["replicas_saved_at_peak_if_shed"] >= 1
    assert set(a["duration_variance"]["service_s"]) == {"p50", "p90", "p99"}


def test_the_recommended_section_is_accepted_by_run_replay_and_the_benchmark(answers, tmp_path):
    a, folder = answers
    written = folder / "recommended.yaml"
    rec = a["recommended"]
    assert set(rec["policy"]) <= set(rec["why"]) | {"priorities", "saturation_wait_max_ratio"}
    assert rec["policy"]["min_replicas"] == a["concurrency_floor"]["replicas"]
    assert rec["policy"]["max_warm_slots"] >= 1  # the 240-s burst: longer than a start-up, shorter than a cold start
    spec = load_policy_spec(written)  # replay --policy
    assert spec.min_replicas == rec["policy"]["min_replicas"] and spec.max_replicas == rec["policy"]["max_replicas"]
    config = tmp_path / "controller.yaml"  # run: the section pasted into a controller config
    config.write_text("target: {namespace: llm, name: model}\nprometheus: {url: 'http://prom:9090'}\n"
                      + written.read_text())
    policy = load_config(config).policy  # run fills the rate window in from its prometheus section
    assert policy.rate_window_s == 60.0 and spec.rate_window_s is None
    assert policy.model_copy(update={"rate_window_s": None}) == spec
    assert bench(["--trace", str(BUNDLED_TRACE), "--policies", "predictive", "--concurrency", "8",
                  "--policy-config", str(written), "--json"]) == 0


def test_the_bundled_trace(tmp_path, capsys):
    assert main(["analyze", str(BUNDLED_TRACE), "--peak-replicas", "40", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert set(a) >= {"concurrency_floor", "concurrency_bands", "bursts", "burst_ceiling", "cold_start_window_s",
                      "residency", "classes", "duration_variance", "recommended"}
    assert a["residency"]["loaded_from"].startswith("not in the data")
    assert a["duration_variance"]["source"] == "per request" and "output_tokens" in a["duration_variance"]


@pytest.mark.parametrize("name", ["azure-llm-2023-code", "mooncake-conversation", "servegen-deepseek-r1",
                                  "servegen-m-small"])
def test_every_trace_is_analyzed_and_its_recommendation_meets_the_targets(name, tmp_path, capsys):
    """As the benchmark scales traces (the busiest minute needs 40 replicas), so does the analysis here."""
    path = BUNDLED_TRACE.parent if name == "azure-llm-2023-code" else SHARED / name
    if not path.exists():
        pytest.skip("the shared traces are research data beside the project")
    config = tmp_path / "recommended.yaml"
    assert main(["analyze", str(path), "--peak-replicas", "40", "--json", "--write-config", str(config)]) == 0
    json.loads(capsys.readouterr().out)
    assert bench(["--trace", str(path), "--policies", "predictive", "--policy-config", str(config), "--json"]) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["policy"] == "predictive"]
    a = row["slo_attainment"]
    assert a["critical"] >= 0.999 and a["standard"] >= 0.99 and row["shed_by_class"]["sheddable"] <= 0.05, row


def _gaps_recording(path: Path, gaps_s: list[float], busy_s: float = 600.0) -> None:
    """1 req/s (one replica) for `busy_s`, then each silence of `gaps_s` in turn, then `busy_s` again."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "arrival_rate_per_s", "in_flight", "service_time_s", "ready_replicas"])
        t = 0.0
        for gap in [*gaps_s, 0.0]:
            for end, rate in ((t + busy_s, 1.0), (t + busy_s + gap, 0.0)):
                while t < end:
                    writer.writerow([t, rate, rate * SERVICE, SERVICE, 1])
                    t += TICK


def _analyze_json(path: Path, capsys, *args: str) -> dict:
    assert main(["analyze", str(path), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_idle_after_s_is_recommended_from_the_gaps_and_the_cold_start(tmp_path, capsys):
    """Ten silences of 30 min and thirty of 5 min, a cold start of 120 s start-up + 300 s for a node: a wake
    costs 540 s. Scale to zero after 60 s (the shortest, 4 ticks) saves 24,600 GPU-s over 40 wakes costing
    21,600; after 315 s (one tick past the 5-min gaps) only the ten long silences go to zero: 14,850 saved
    against 5,400, the most. With the 5-min silences alone nothing pays: off."""
    _gaps_recording(tmp_path / "rec.csv", [1800.0, *[300.0] * 3] * 10)
    a = _analyze_json(tmp_path / "rec.csv", capsys, "--write-config", str(tmp_path / "policy.yaml"))
    capsys.readouterr()
    idle = a["idle"]
    assert idle["gaps"] == 40 and idle["longest_gap_s"] == 1800.0 and idle["wake_cost_s"] == 540.0
    by_window = {c["idle_after_s"]: c for c in idle["candidates"]}
    assert by_window[60.0]["net_s"] == pytest.approx(24600 - 21600)
    assert idle["best"] == {"idle_after_s": 315.0, "wakes": 10, "saved_gpu_s": 14850.0, "cost_s": 5400.0,
                            "net_s": 9450.0}
    assert a["recommended"]["policy"]["idle_after_s"] == 315.0
    assert "after 315 s idle, 10 of them go to zero" in a["recommended"]["why"]["idle_after_s"]
    assert "CHECK THE GAPS" not in a["idle"]["why"]  # one replica's demand before each gap: idling
    assert load_policy_spec(tmp_path / "policy.yaml").idle_after_s == 315.0  # the written file loads

    _gaps_recording(tmp_path / "short.csv", [300.0] * 30)
    a = _analyze_json(tmp_path / "short.csv", capsys)
    assert a["idle"]["idle_after_s"] is None and "idle_after_s" not in a["recommended"]["policy"]
    assert "pays only beyond idle_after_s + 540 s" in a["idle"]["why"]
    assert "5. idle gaps: 30 (longest 300 s); scale to zero off" in summary(a)


def test_gaps_after_demand_of_many_replicas_are_possible_holes_in_the_data_and_not_recommended(tmp_path, capsys):
    """The same silences in a model busy at 20 req/s (3 replicas at 8 slots): a collection gap, most likely, or
    an outage whose traffic returns at once. Scale to zero would hold every request of each return for a cold
    start, so it is left off; the reason says what it would save if the gaps were real idle time."""
    path = tmp_path / "holes.csv"
    _gaps_recording(path, [1800.0] * 10)
    path.write_text(path.read_text().replace(",1.0,1.0,1.0,1\n", ",20.0,20.0,1.0,3\n"))
    a = _analyze_json(path, capsys, "--policy", str(_policy(tmp_path)), "--write-config", str(tmp_path / "rec.yaml"))
    assert a["idle"]["idle_after_s"] is None and a["idle"]["best"]["net_s"] > 0
    assert "idle_after_s" not in a["recommended"]["policy"]
    assert load_policy_spec(tmp_path / "rec.yaml").idle_after_s is None
    why = a["idle"]["why"]
    assert why.startswith("the demand stops from 3 replicas' worth (median) in one tick")
    assert "CHECK THE GAPS FIRST" in why
    assert "leave idle_after_s unset" in why and "10 of them go to zero" in why
    assert "scale to zero off: the demand stops from 3 replicas' worth" in summary(a)


def _policy(folder: Path) -> Path:
    policy = folder / "policy.yaml"
    policy.write_text("replica_concurrency: 8\n")
    return policy
