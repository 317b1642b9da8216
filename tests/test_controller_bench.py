"""`make bench-controller` run briefly: every part prints its figures (a local Prometheus, the KEDA gRPC server
and the simulated-time memory run), so the benchmark cannot silently break again."""

import re

from loadtest import controller_bench


def test_controller_bench_runs_every_part(capsys):
    assert controller_bench.main(["--ticks", "5", "--rps", "20", "--seconds", "1", "--memory-ticks", "4,300"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"loop tick against local Prometheus \(5 ticks\): p50 [\d.]+ ms, p99 [\d.]+ ms", out), out
    assert re.search(r"KEDA GetMetrics at 20 req/s for 1 s \(20 ok, 0 failed\)", out), out
    # 300 ticks = 75 simulated minutes: past the first statsmodels fit (12 buckets of 5 min).
    assert re.search(r"resident memory \(refits in a child process\): \d+ MB at start; \d+ MB after 4 simulated "
                     r"ticks .*; \d+ MB after 300 simulated ticks \(1.25 h\); a second model's controller over as many "
                     r"ticks adds -?[\d.]+ MB", out), out
    # The first fit (12 buckets) of each of the two controllers, in the child. Whether this process holds
    # statsmodels depends on the tests run before in it (test_fitchild.py checks a fresh controller process).
    assert re.search(r"the refits' child process: 2 fits, peak \d+ MB; statsmodels in the controller's process: "
                     r"(yes|no)", out), out
    alone = re.search(r"a fresh process with only `autoscaler run`'s imports: (\d+) MB after them, (\d+) MB after 300 "
                      r"simulated ticks \(1.25 h\), refits in a child process \(1 fits, peak \d+ MB\); the refit's "
                      r"stack in that process: none", out)
    assert alone and 0 < int(alone[1]) <= int(alone[2]), out


def test_the_fleet_scale_bench_runs_and_emits_its_figures(capsys):
    """--targets 3: the real apiserver and Prometheus, the fleet controller through FleetPrometheus and KubeCache."""
    import json

    assert controller_bench.main(["--targets", "3", "--fleet-ticks", "2", "--json"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert {"targets", "tick_p50_ms", "tick_p99_ms", "cpu_s_per_tick", "promql_queries_per_tick",
            "apiserver_requests_per_tick", "rss_mb"} <= set(row)
    assert row["targets"] == 3 and row["models_decided_on_every_signal"] == 3
    assert row["promql_queries_per_tick"] == row["signals"] == 7  # one query per signal, not per model
    assert row["apiserver_requests_per_tick"] == 0 and row["apiserver_writes_per_tick"] == 0
    assert 0 < row["tick_p50_ms"] <= row["tick_p99_ms"] and row["cpu_s_per_tick"] > 0 and row["rss_mb"] > 0


def test_the_fleet_table_prints_what_one_more_model_costs_in_resident_memory():
    from loadtest.fleetscale import FleetFigures, table

    def row(targets: int, rss_mb: float) -> FleetFigures:
        return FleetFigures(targets=targets, ticks=2, tick_p50_ms=1.0, tick_p99_ms=2.0, cpu_s_per_tick=0.01,
                            promql_queries_per_tick=7, apiserver_requests_per_tick=0, apiserver_writes_per_tick=0,
                            rss_mb=rss_mb, signals=7, models_decided_on_every_signal=targets, pods=False)

    # 500 models at 250 MB, one at 150.2 MB: (250 - 150.2) / 499 MB = 204.8 KB a model.
    assert table([row(1, 150.2), row(50, 160.0), row(500, 250.0)]).splitlines()[-1] == (
        "resident memory per model: 205 KB (250 MB at 500 models, 150.2 MB at 1)")
    assert "per model" not in table([row(50, 160.0)])  # one N: no slope
