"""The benchmark on the bundled trace: its JSON contract, and the targets it must show."""

import json

import pytest

from loadtest.bench import main

from helpers import BUNDLED_TRACE

KEYS = {"policy", "slo_attainment", "p99_queue_wait_s", "gpu_hours", "gpu_hours_vs_clairvoyant", "shed_fraction",
        "scaling_actions", "wall_s", "shed_time_s", "warm_pool_gpu_hours", "time_to_capacity_s", "warm_churn"}


@pytest.fixture(scope="module")
def rows(capsys_module=None):
    import io
    import contextlib

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["--trace", str(BUNDLED_TRACE), "--json"]) == 0
    return {row["policy"]: row for row in json.loads(buffer.getvalue())}


def test_json_has_every_policy_and_key(rows):
    assert set(rows) == {"predictive", "hpa", "kpa", "keda", "static", "clairvoyant"}
    for row in rows.values():
        assert KEYS <= set(row)
        assert set(row["slo_attainment"]) == {"critical", "standard", "sheddable"}
    assert rows["clairvoyant"]["gpu_hours_vs_clairvoyant"] == 1.0


def test_predictive_meets_the_targets_on_the_bundled_trace(rows):
    ours = rows["predictive"]
    assert ours["slo_attainment"]["critical"] >= 0.999
    assert ours["slo_attainment"]["standard"] >= 0.99
    assert ours["shed_by_class"]["sheddable"] <= 0.05
    assert ours["gpu_hours_vs_clairvoyant"] <= 1.25
    for name in ("hpa", "kpa", "keda", "static"):
        other = rows[name]
        if all(other["slo_attainment"][c] >= ours["slo_attainment"][c] for c in ("critical", "standard")):
            assert ours["gpu_hours"] < other["gpu_hours"], name


def test_bad_trace_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("nope\n")
    assert main(["--trace", str(bad)]) == 2
    assert "x.csv:1: header" in capsys.readouterr().err


def test_warm_capacity_halves_the_shedding_of_a_doubling(capsys):
    """The doubling drill (scenario:doubling), with the warm pool insuring a doubling against the same
    policy without a warm pool: the sheddable class is shed at most half as much and for at most 0.6 of the
    time. (Over arrival seeds 1-10 the warm pool sheds 0.14-0.36 as much for 0.37-0.56 of the time; "half as
    long" held on 8 of them, seed 1's 0.46 among them, and its 285 s against 615 became 300 s against 570 s
    when a burst's protected share became its own, by a tick of shedding at minute 27.25.)"""
    args = ["--trace", "scenario:doubling", "--policies", "predictive,predictive-no-warm", "--json",
            "--policy-set", "warm_growth_min_ratio=1.0", "--policy-set", "max_warm_slots=32"]
    assert main(args) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    warm, cold = rows["predictive"], rows["predictive-no-warm"]
    assert warm["warm_pool_gpu_hours"] > 0 and cold["warm_pool_gpu_hours"] == 0
    assert warm["shed_time_s"]["sheddable"] <= 0.6 * cold["shed_time_s"]["sheddable"]
    assert warm["shed_by_class"]["sheddable"] <= 0.5 * cold["shed_by_class"]["sheddable"]
    assert warm["time_to_capacity_s"]["p50"] < 0.5 * cold["time_to_capacity_s"]["p50"]


def test_policy_settings_that_contradict_the_simulated_cluster_are_refused(capsys):
    assert main(["--policies", "predictive", "--policy-set", "replica_concurrency=4"]) == 2
    assert "replica_concurrency = 4" in capsys.readouterr().err
    assert main(["--policies", "predictive", "--policy-set", "max_replicas=-1"]) == 2
    assert "max_replicas" in capsys.readouterr().err


def test_frontier_sweeps_each_policys_knob_and_finds_the_gpu_hours_at_target(capsys, tmp_path):
    png = tmp_path / "frontier.png"
    assert main(["--trace", str(BUNDLED_TRACE), "--frontier", "--policies", "hpa,static", "--workers", "2",
                 "--json", "--frontier-png", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["frontier"]) == {"hpa", "static", "clairvoyant"}
    assert [p["value"] for p in doc["frontier"]["hpa"]] == [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    static = sorted(doc["frontier"]["static"], key=lambda p: p["gpu_hours"])
    assert static[0]["slo_attainment"]["critical"] < 0.999 <= static[-1]["slo_attainment"]["critical"]
    at = doc["gpu_hours_at_target"]["static"]
    meeting = [p["gpu_hours"] for p in static if p["slo_attainment"]["critical"] >= 0.999
               and p["slo_attainment"]["standard"] >= 0.99]
    missing = [p["gpu_hours"] for p in static if p["gpu_hours"] < min(meeting)]
    assert max(missing) <= at <= min(meeting)  # interpolated between the last miss and the first meet
    assert doc["floor_gpu_hours"] < doc["clairvoyant_gpu_hours"]  # the floor is a lower bound
    assert png.stat().st_size > 10_000


def test_the_replica_bound_never_caps_a_trace():
    import numpy as np

    from loadtest.policyset import MIN_REPLICA_BOUND, replica_bound

    assert replica_bound(np.array([3, 40, 66])) == MIN_REPLICA_BOUND
    assert replica_bound(np.array([10, 403])) == 504  # 1.25 x the busiest tick


def test_by_default_node_gpu_hours_and_cost_are_the_gpu_hours(rows):
    for row in rows.values():
        assert row["node_gpu_hours"] == row["node_hours"] == row["cost"] == row["gpu_hours"]


def test_the_cluster_shape_and_price_give_node_gpu_hours_and_cost(capsys):
    args = ["--trace", str(BUNDLED_TRACE), "--policies", "static", "--gpus-per-replica", "3", "--gpus-per-node", "8",
            "--gpu-hour-price", "2.5"]
    assert main(args + ["--json"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"static", "clairvoyant"}
    for row in rows.values():
        # 2 replicas of 3 GPUs per 8-GPU node: at least 8/6 of the replica GPU-hours, 8 GPUs per node-hour
        assert row["node_gpu_hours"] >= 8 / 6 * row["gpu_hours"] - 0.01
        assert row["node_gpu_hours"] == pytest.approx(8 * row["node_hours"], abs=0.01)
        assert row["cost"] == pytest.approx(2.5 * row["node_gpu_hours"], abs=0.01)
    assert rows["static"]["gpu_hours"] == pytest.approx(3 * 63.25)  # its 66 replicas for the hour, in GPUs
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "3-GPU replicas on 8-GPU nodes (2 per node, 2 GPUs of each unusable)" in out
    assert "x 2.5 per GPU-hour" in out
    header = next(line for line in out.splitlines() if line.startswith("policy"))
    assert "node GPU-h" in header and "cost" in header


@pytest.mark.parametrize("flags,words", [
    (["--gpus-per-replica", "4", "--gpus-per-node", "2"], "gpus_per_replica = 4 is more than gpus_per_node = 2"),
    (["--gpus-per-node", "0"], "argument --gpus-per-node: expected a whole number >= 1, got '0'"),
    (["--gpu-hour-price", "-1"], "argument --gpu-hour-price: expected a finite number >= 0, got '-1'"),
])
def test_an_impossible_shape_or_price_is_a_clear_error(flags, words, capsys):
    try:
        status = main(["--policies", "static", *flags])
    except SystemExit as exc:  # argparse's own range checks exit 2 before main returns
        status = exc.code
    assert status == 2
    assert words in capsys.readouterr().err


def _row(policy, gpu_hours, node_gpu_hours, attainment=0.9995):
    return {"policy": policy, "slo_attainment": {"critical": attainment, "standard": attainment, "sheddable": 0.9},
            "shed_by_class": {"sheddable": 0.01}, "gpu_hours": gpu_hours, "node_gpu_hours": node_gpu_hours,
            "gpu_hours_vs_clairvoyant": None}


def test_on_multi_gpu_nodes_the_verdict_and_the_frontier_compare_what_nodes_cost():
    """Fewer replica GPU-hours but more node GPU-hours (replicas scattered over half-used nodes) is not
    cheaper when a node is paid for whole."""
    from autoscaler.sim.cluster import ClusterModel
    from loadtest.bench import verdict
    from loadtest.frontier import at_target

    rows = [_row("predictive", 100.0, 140.0), _row("static", 110.0, 120.0), _row("clairvoyant", 90.0, 100.0)]
    classes, sheddable = ("critical", "standard", "sheddable"), ("sheddable",)
    nodes = verdict(rows, classes, sheddable, cluster=ClusterModel(gpus_per_replica=4, gpus_per_node=8))
    assert "vs static (reaches our attainment): 140.0 vs 120.0 node GPU-h -> NOT fewer" in nodes
    assert "node GPU-hours vs clairvoyant: 1.400x (aim <= 1.25x)" in nodes
    replicas = verdict(rows, classes, sheddable, cluster=ClusterModel())
    assert "vs static (reaches our attainment): 100.0 vs 110.0 GPU-h -> fewer" in replicas
    points = [_row("x", 100.0, 140.0), _row("x", 90.0, 150.0, attainment=0.99)]
    assert at_target(points, classes, sheddable) == pytest.approx(99.474)  # between the miss at 90 and 100
    assert at_target(points, classes, sheddable, "node_gpu_hours") == 140.0  # the miss costs more nodes


def test_the_bench_reads_service_time_by_completion_only_when_asked_and_only_on_request_traces(tmp_path, capsys):
    """`--service-by-completion` hands the reading by completion (vLLM's, the closed loop's twins') to the
    simulator; a rate trace has no requests to complete, so the flag is refused there."""
    from autoscaler.sim.run import traffic_sim
    from loadtest import bench

    by_start = bench.prepare(bench.parse_args(["--trace", str(BUNDLED_TRACE)]))
    by_completion = bench.prepare(bench.parse_args(["--trace", str(BUNDLED_TRACE), "--service-by-completion"]))
    assert not traffic_sim(by_start.workload, by_start.config).service_by_completion
    assert traffic_sim(by_completion.workload, by_completion.config).service_by_completion
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.0,2.0,Gamma,1,1\n600,0,0,,0,0\n")
    assert main(["--trace", str(tmp_path), "--service-by-completion"]) == 2
    assert "--service-by-completion: modelled for request traces only" in capsys.readouterr().err
