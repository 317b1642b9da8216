"""The benchmark on the bundled trace: its JSON contract, and the targets it must show."""

import json

import pytest

from loadtest.bench import main

from helpers import BUNDLED_TRACE

KEYS = {"policy", "slo_attainment", "p99_queue_wait_s", "gpu_hours", "gpu_hours_vs_clairvoyant", "shed_fraction",
        "scaling_actions", "wall_s", "shed_time_s", "warm_pool_gpu_hours", "time_to_capacity_s"}


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
    policy without a warm pool: the sheddable class is shed for at most half as long and half as much."""
    args = ["--trace", "scenario:doubling", "--policies", "predictive,predictive-no-warm", "--json",
            "--policy-set", "warm_growth_min_ratio=1.0", "--policy-set", "max_warm_slots=32"]
    assert main(args) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    warm, cold = rows["predictive"], rows["predictive-no-warm"]
    assert warm["warm_pool_gpu_hours"] > 0 and cold["warm_pool_gpu_hours"] == 0
    assert warm["shed_time_s"]["sheddable"] <= 0.5 * cold["shed_time_s"]["sheddable"]
    assert warm["shed_by_class"]["sheddable"] <= 0.5 * cold["shed_by_class"]["sheddable"]
    assert warm["time_to_capacity_s"]["p50"] < 0.5 * cold["time_to_capacity_s"]["p50"]


def test_policy_settings_that_contradict_the_simulated_cluster_are_refused(capsys):
    assert main(["--policies", "predictive", "--policy-set", "replica_concurrency=4"]) == 2
    assert "replica_concurrency = 4" in capsys.readouterr().err
    assert main(["--policies", "predictive", "--policy-set", "max_replicas=-1"]) == 2
    assert "max_replicas" in capsys.readouterr().err
