"""Dry-run replay: recordings in every accepted format, both modes, and clear errors for bad input."""

import csv
import json
import math

import pytest

from autoscaler.cli import main
from autoscaler.config import load_policy_spec
from autoscaler.errors import ConfigError
from autoscaler.replay.openloop import open_loop
from autoscaler.replay.recording import RecordingError, read_recording
from policies import PolicySpec

from helpers import BUNDLED_TRACE


def _diurnal_rows(hours=2.0, step=15.0):
    rows = []
    t = 0.0
    while t <= hours * 3600:
        rate = 40 + 30 * math.sin(2 * math.pi * t / 7200.0)
        rows.append({"t_s": t, "arrival_rate_per_s": round(rate, 3), "queue_depth": 0, "in_flight": round(rate, 1),
                     "service_time_s": 1.0, "p99_latency_s": 0.1, "spec_replicas": 12, "ready_replicas": 12,
                     "arrival_rate_sheddable": round(0.3 * rate, 3)})
        t += step
    return rows


def _write_csv(path, rows):
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _query_range(rows, field, scale=1.0, series=1):
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"pod": f"p{i}"}, "values": [[r["t_s"], str(r[field] * scale)] for r in rows]} for i in range(series)
    ]}}


def test_csv_jsonl_and_prometheus_recordings_give_the_same_decisions(tmp_path):
    rows = _diurnal_rows()
    _write_csv(tmp_path / "rec.csv", rows)
    (tmp_path / "rec.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    prom = tmp_path / "prom"
    prom.mkdir()
    for field in ("arrival_rate_per_s", "queue_depth", "in_flight", "service_time_s", "p99_latency_s",
                  "spec_replicas", "ready_replicas", "arrival_rate_sheddable"):
        # per-pod series are summed for rates and counts: export the in-flight as two halves
        if field == "in_flight":
            body = _query_range(rows, field, scale=0.5, series=2)
        else:
            body = _query_range(rows, field)
        (prom / f"{field}.json").write_text(json.dumps(body))
    spec = PolicySpec(replica_concurrency=8)
    results = [open_loop(read_recording(p), spec) for p in (tmp_path / "rec.csv", tmp_path / "rec.jsonl", prom)]
    replicas = [[r["replicas"] for r in rows_] for rows_ in results]
    assert replicas[0] == replicas[1] == replicas[2]
    assert len(replicas[0]) == len(rows)
    assert max(replicas[0]) > min(replicas[0])  # it follows the cycle


def test_a_gap_in_the_recording_is_stale_data_not_zero(tmp_path):
    rows = _diurnal_rows(hours=1.0)
    gap = [r for r in rows if not (1200 <= r["t_s"] < 2400)]
    _write_csv(tmp_path / "gap.csv", gap)
    out = open_loop(read_recording(tmp_path / "gap.csv"), PolicySpec(replica_concurrency=8))
    before = [r for r in out if r["t_s"] < 1200][-1]
    during = [r for r in out if 1300 <= r["t_s"] < 2400]
    # every signal, the cluster state included, is stale: each decision is an invalid hold that leaves the
    # replicas where they were, and says why
    assert during and all(not r["valid"] and "no usable cluster state" in r["reasons"] for r in during)
    assert all("stale" in r["reasons"] for r in during)
    assert all(r["replicas"] == before["replicas"] for r in during)


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("a.csv", "t_s,arrival_rate_per_s\n0,1\n15,abc\n", r"a\.csv:3: field 'arrival_rate_per_s': not a number"),
        ("b.csv", "t_s,bogus_signal\n0,1\n", r"b\.csv:2: unknown signal 'bogus_signal'"),
        ("c.csv", "t_s,queue_depth\n30,1\n15,1\n", r"c\.csv:3: field 't_s': time goes backwards"),
        ("d.csv", "queue_depth\n1\n", r"d\.csv:2: no time field"),
        ("e.jsonl", '{"t_s": 0, "queue_depth": 1}\n[1,2]\n', r"e\.jsonl:2: expected a JSON object"),
        ("f.json", '{"queue_depth": {"status": "error"}}', r"f\.json: signal 'queue_depth': field 'status'"),
        ("g.json",
         '{"queue_depth": {"status": "success", "data": {"resultType": "matrix", '
         '"result": [{"values": [[0, "1"], [15]]}]}}}',
         r"g\.json: signal 'queue_depth': series 0 point 1: field 'values'"),
        ("h.json", '{"queue_depth": ', r"h\.json:1: not JSON"),
    ],
)
def test_malformed_recordings_name_file_line_and_field(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(RecordingError, match=match):
        read_recording(path)


def test_policy_file_errors_name_the_field_and_value(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("max_replicas: 0\nreplica_concurrency: 16\n")
    with pytest.raises(ConfigError, match=r"policy\.yaml: field 'max_replicas'.*got 0"):
        load_policy_spec(path)
    path.write_text("min_replicas: 9\nmax_replicas: 4\n")
    with pytest.raises(ConfigError, match=r"min_replicas \(9\) must not exceed max_replicas \(4\)"):
        load_policy_spec(path)
    path.write_text("unknown_knob: 1\n")
    with pytest.raises(ConfigError, match="unknown_knob"):
        load_policy_spec(path)


def test_cli_open_loop_and_simulated_write_timeline_and_plot(tmp_path, capsys):
    _write_csv(tmp_path / "rec.csv", _diurnal_rows(hours=1.0))
    assert main(["replay", str(tmp_path / "rec.csv"), "--out", str(tmp_path / "ol")]) == 0
    assert (tmp_path / "ol" / "timeline.csv").stat().st_size > 0
    assert (tmp_path / "ol" / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["replay", str(tmp_path / "rec.csv"), "--mode", "simulated", "--out", str(tmp_path / "sim")]) == 0
    printed = capsys.readouterr().out
    assert "predictive" in printed and "recorded" in printed
    with (tmp_path / "sim" / "timeline.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {"replicas", "recorded_replicas", "arrival_rate_per_s"} <= set(rows[0])


def test_cli_replays_a_trace(tmp_path, capsys):
    assert main(["replay", str(BUNDLED_TRACE), "--format", "trace", "--out", str(tmp_path), "--no-plot"]) == 0
    assert "SLO critical" in capsys.readouterr().out


def test_cli_bad_input_exits_2_with_the_location(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,queue_depth\n0,oops\n")
    assert main(["replay", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.csv:2: field 'queue_depth'" in capsys.readouterr().err


def test_simulated_replay_splits_demand_as_the_recording_does(tmp_path, capsys):
    """The per-priority series decide the classes' shares tick by tick; without them every request is in
    the default class (as the admission endpoint counts requests without a priority header)."""
    from autoscaler.replay.simulated import class_mix

    rows = _diurnal_rows(hours=0.5)
    for i, row in enumerate(rows):
        row["arrival_rate_critical"] = round(0.5 * row["arrival_rate_per_s"], 3) if i % 2 else 0.0
        row["arrival_rate_standard"] = 0.0
    _write_csv(tmp_path / "rec.csv", rows)
    spec = PolicySpec(replica_concurrency=8)
    recording = read_recording(tmp_path / "rec.csv")
    mix = class_mix(recording, spec, 15.0, len(rows), "standard")
    assert spec.classes == ("critical", "standard", "sheddable")
    odd, even = mix[1], mix[2]
    assert odd == pytest.approx([0.5 / 0.8, 0.0, 0.3 / 0.8], rel=1e-3) and even == pytest.approx([0.0, 0.0, 1.0])
    plain = tmp_path / "plain.csv"
    _write_csv(plain, [{k: v for k, v in r.items() if not k.startswith("arrival_rate_") or k == "arrival_rate_per_s"}
                       for r in rows])
    assert class_mix(read_recording(plain), spec, 15.0, 3, "standard").tolist() == [[0.0, 1.0, 0.0]] * 3
    assert main(["replay", str(plain), "--mode", "simulated", "--no-plot", "--out", str(tmp_path / "s")]) == 0
    assert "none recorded: every request counted as 'standard'" in capsys.readouterr().out
    with pytest.raises(RecordingError, match=r"per-priority series for \['critical'.*the policy does not have"):
        class_mix(recording, PolicySpec(priorities={"gold": 1, "bronze": -1}), 15.0, 3, "gold")
    assert main(["replay", str(plain), "--mode", "simulated", "--default-priority", "gold", "--no-plot",
                 "--out", str(tmp_path / "s")]) == 2


def test_replay_writes_to_a_temporary_folder_when_the_working_directory_is_read_only(tmp_path, monkeypatch):
    from autoscaler.replay.command import output_folder

    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.chdir(locked)
    assert output_folder(None) == __import__("pathlib").Path("replay-out")
    # (the tests run as root, whom permissions do not stop: the check itself is made to say "read-only")
    monkeypatch.setattr("os.access", lambda path, mode: str(path) != ".")
    out = output_folder(None)
    assert out.is_dir() and out.name.startswith("replay-out-") and locked not in out.parents
