"""The decision table `autoscaler replay` prints: changed ticks only (every tick with --all), one reason
each, held ticks as "held (reason)", and a summary whose shed figure names what it is a share of."""

import csv
import re

from autoscaler.cli import main
from autoscaler.replay import table

from helpers import BUNDLED_TRACE


def _row(t_s, replicas, reasons, *, valid=True, warm=0, shed=0.0, ready=4, rate=10.0):
    return {"t_s": t_s, "arrival_rate_per_s": rate, "replicas": replicas, "ready": ready, "warm_slots": warm,
            "shed_critical": 0.0, "shed_standard": 0.0, "shed_sheddable": shed, "valid": valid,
            "reasons": " | ".join(reasons)}


LEAD = "lead time: start-up 120 s + node provisioning 300 s; no warm or idle slot free"
ROWS = [
    _row(0, 4, [LEAD, "reactive: 4 replicas for 10 req/s", "predictive: 3 replicas for upper forecast 8 req/s",
                "combine: current load needs 4"]),
    _row(15, 4, [LEAD, "reactive: 4 replicas for 10 req/s", "combine: current load needs 4"]),
    _row(30, 8, [LEAD, "reactive: 5 replicas", "predictive: 9 replicas for upper forecast 30 req/s",
                 "combine: forecast needs 9", "bounds: scale-up limited to 8 this tick",
                 "warm pool: 2 slots beyond 8 replicas for forecast peak of 10 within node provisioning"], warm=2),
    _row(45, 8, [LEAD, "predictive: 9 replicas", "combine: forecast needs 9",
                 "shedding: 20% of sheddable (40.0 req/s demand > 32.0 ready)"], warm=2, shed=0.2, rate=40.0),
    _row(60, 8, ["hold: no cluster state (spec_replicas missing)"], valid=False, warm=0, shed=0.2, rate=40.0),
    _row(75, 8, ["hold: no cluster state (spec_replicas missing)"], valid=False, warm=0, shed=0.2, rate=40.0),
    _row(90, 6, [LEAD, "reactive: 6 replicas for 20 req/s", "combine: current load needs 6"], warm=0, rate=20.0),
]


def test_only_the_ticks_that_changed_each_with_the_reason_for_its_kind():
    found = table.changes(ROWS)
    assert [c.t_s for c in found] == [0, 30, 45, 60, 90]
    start, up, shed_on, held, back = found
    assert start.what == "start" and start.reason.startswith("reactive: 4 replicas")
    assert up.what == "scale up, warm slots" and up.previous == 4 and up.replicas == 8
    assert "predictive: 9 replicas" in up.reason and "bounds: scale-up limited to 8" in up.reason
    assert "warm pool: 2 slots" in up.reason and "lead time" not in up.reason
    assert shed_on.what == "shedding on" and shed_on.reason.startswith("shedding: 20% of sheddable")
    assert held.what == "held (no cluster state (spec_replicas missing))"
    assert back.what == "resumed, scale down, shedding off"  # warm slots: 0 on the held ticks already
    assert "reactive: 6 replicas" in back.reason and "shedding: ready capacity meets demand" in back.reason


def test_the_printed_table_says_held_with_its_reason_not_a_replica_range():
    text = table.format_table(table.changes(ROWS), start_s=0.0)
    assert "0:00:30       4->8" in text and "held (no cluster state" in text
    assert "min 0" not in text and "max 0" not in text


def test_every_tick_with_all():
    assert [c.t_s for c in table.changes(ROWS, every_tick=True)] == [r["t_s"] for r in ROWS]


def test_the_summary_counts_changes_and_names_what_the_shed_share_is_of():
    shed = table.open_loop_shed(ROWS, ("critical", "standard", "sheddable"))
    # 20 % in force on the three ticks at 40 req/s (held ticks keep the last levels), of 170 req/s-ticks in all
    assert abs(shed["sheddable"] - 0.2 * 120 / 170) < 1e-9 and shed["critical"] == 0.0
    text = table.summary(ROWS, tick_s=15.0, sheddable=("sheddable",), shed_by_class=shed, shed_basis="open loop")
    assert "1 scale-ups, 1 scale-downs, 1 warm-slot changes, 1 shedding episodes, 2 ticks held (1 times)" in text
    assert "shed: 14.12% of sheddable requests (open loop)" in text


def step_recording(path, *, last_queue=0):
    """An hour at 15-s samples, the rate stepping up half way (the policy scales up); the queue `last_queue`
    deep in the last 100 s."""
    rows, t = [], 0.0
    while t <= 3600:
        rate = 10.0 if t < 1800 else 40.0
        rows.append({"t_s": t, "arrival_rate_per_s": rate, "queue_depth": last_queue if t >= 3500 else 0,
                     "in_flight": rate, "service_time_s": 1.0, "spec_replicas": 2, "ready_replicas": 2})
        t += 15.0
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_cli_prints_the_table_and_all_prints_every_tick(tmp_path, capsys):
    step_recording(tmp_path / "rec.csv")
    assert main(["replay", str(tmp_path / "rec.csv"), "--no-plot", "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    row = r"0:30:\d\d\s+\d+->\d+\s+2\s+\d+\s+-\s+scale up[a-z, ]*\s+(reactive|predictive): "
    assert re.search(row, printed), printed
    assert "of sheddable requests (open loop" in printed
    changed = [line for line in printed.splitlines() if re.match(r"\s*\d+:\d\d:\d\d ", line)]
    assert main(["replay", str(tmp_path / "rec.csv"), "--no-plot", "--all", "--out", str(tmp_path / "o")]) == 0
    every = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\s*\d+:\d\d:\d\d ", line)]
    assert len(every) == 241 and len(changed) < len(every)


def test_a_simulated_replay_reports_the_sheddable_share_as_the_benchmark_does(tmp_path, capsys):
    assert main(["replay", str(BUNDLED_TRACE), "--format", "trace", "--out", str(tmp_path), "--no-plot"]) == 0
    printed = capsys.readouterr().out
    share = re.search(r"shed: ([\d.]+)% of sheddable requests \(simulated", printed)
    assert share, printed
    # the one-line result says the same share, of the same class (it was the share of all requests)
    assert f"shed {share.group(1)}% of sheddable requests" in printed
