"""`python -m loadtest.e2e.twin DIR`: a finished closed-loop run's twin recomputed from its result.json."""

import json
from dataclasses import replace

import pytest

from autoscaler.sim.run import initial_replicas, needed_replicas
from loadtest import scenarios
from loadtest.e2e import twin
from loadtest.e2e.config import E2EConfig

TIMING = {"provisioning_s": 410.0, "provisioning_p90_s": 410.0, "waits": 23, "removal_extra_s": 237.7,
          "removals": 12}


def recorded(tmp_path, name="scale-to-zero"):
    config = replace(E2EConfig(factor=10.0), **scenarios.SCENARIOS[name].config)
    workload, _ = twin.requests_of(name, config)
    initial = initial_replicas(needed_replicas(workload, config.sim_config()), config.sim_config())
    _, simulated = twin.twin(config, workload, initial, TIMING)
    doc = {"scenario": name, "factor": 10.0, "initial_replicas": initial, "simulated": simulated,
           "slo_attainment": {"critical": 0.5}, "gpu_hours": 7.5}
    (tmp_path / "result.json").write_text(json.dumps(doc))
    return doc


def test_the_twin_of_a_run_is_recomputed_from_its_folder(tmp_path, capsys):
    doc = recorded(tmp_path)
    out = twin.rerun(tmp_path)
    assert out["recomputed"] == out["recorded"] == {"critical": doc["simulated"]["slo_attainment"]["critical"],
                                                     "gpu_hours": doc["simulated"]["gpu_hours"]}
    assert out["hold"]["held_requests"] > 0  # the twin models the hold at the gateway
    assert twin.main([str(tmp_path)]) == 0
    assert "recomputed twin: critical" in capsys.readouterr().out


def test_a_run_that_started_elsewhere_or_a_fleet_is_refused(tmp_path):
    doc = recorded(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({**doc, "initial_replicas": doc["initial_replicas"] + 1}))
    with pytest.raises(ValueError, match="started from"):
        twin.rerun(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({**doc, "scenario": "fleet"}))
    with pytest.raises(ValueError, match="single-model"):
        twin.rerun(tmp_path)


def test_what_ifs_change_the_twins_queues_and_policy_and_bad_ones_are_refused(tmp_path, capsys):
    doc = recorded(tmp_path, name="short-burst")
    same = twin.rerun(tmp_path, dispatch="least-conn")
    assert same["recomputed"] == same["recorded"]  # the scenario's own queues: the recorded twin
    shared = twin.rerun(tmp_path, dispatch="shared", policy={"gateway_queues": "shared"})
    assert shared["recomputed"]["gpu_hours"] < doc["simulated"]["gpu_hours"]  # k slots a replica, not k - 1: fewer
    assert twin.main([str(tmp_path), "--policy-set", "gateway_queues=per-server"]) == 2
    assert "gateway_queues" in capsys.readouterr().err
    assert twin.main([str(tmp_path), "--policy-set", "no-equals-sign"]) == 2
    assert "expected FIELD=VALUE" in capsys.readouterr().err


def test_the_twin_replays_the_node_waits_and_start_ups_a_run_recorded(tmp_path):
    """scale-to-zero: the wake's first nodes came 70 s sooner than the median and its first replicas started
    in 105 s: the twin's held requests are served sooner, and more critical ones meet the SLO."""
    doc = recorded(tmp_path)
    wake_s = 35 * 60.0
    timing = {**TIMING, "wait_series": [[wake_s + i, 340.0] for i in range(8)],
              "startup_series": [[wake_s + i, 105.0] for i in range(8)]}
    simulated = {**doc["simulated"], "node_timings": timing}
    (tmp_path / "result.json").write_text(json.dumps({**doc, "simulated": simulated}))
    out = twin.rerun(tmp_path)
    assert out["recomputed"]["critical"] > out["recorded"]["critical"] + 0.02
    assert out["hold"]["hold_p50_s"] < doc["simulated"]["hold"]["hold_p50_s"]


def test_with_from_lifetimes_the_series_are_derived_again_from_the_folders_lifetimes(tmp_path, capsys):
    """The same wake as above, kept as the pods' and nodes' lifetimes (wall clock, factor 10, started at 1000 s)
    and not in result.json: `--from-lifetimes` replays it; a folder without lifetimes.jsonl is a clear error."""
    doc = recorded(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({**doc, "started_at": 1000.0}))
    wake = 1000.0 + 35 * 60.0 / 10
    rows = [{"kind": "node", "uid": "n", "name": "node-a", "created": wake + 10.0, "ready": None, "gone": None}]
    rows += [{"kind": "model", "uid": f"p{i}", "name": f"p{i}", "created": wake + i / 10, "placed": wake + 34.0,
              "node": "node-a", "ready": wake + 44.6, "ready_at": wake + 44.5, "gone": None} for i in range(8)]
    (tmp_path / "lifetimes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain, derived = twin.rerun(tmp_path), twin.rerun(tmp_path, from_lifetimes=True)
    assert plain["recomputed"] == plain["recorded"]
    assert derived["recomputed"]["critical"] > plain["recorded"]["critical"] + 0.02
    (tmp_path / "lifetimes.jsonl").unlink()
    assert twin.main([str(tmp_path), "--from-lifetimes"]) == 2
    assert "lifetimes.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [[[1.0, None]], [[1.0]], [[1.0, -5.0]], [["a", 1.0]], "x", [[1.0, float("nan")]]])
def test_a_malformed_series_in_a_folder_is_a_clear_error(tmp_path, capsys, bad):
    doc = recorded(tmp_path, name="short-burst")
    simulated = {**doc["simulated"], "node_timings": {**TIMING, "wait_series": bad}}
    (tmp_path / "result.json").write_text(json.dumps({**doc, "simulated": simulated}))
    assert twin.main([str(tmp_path)]) == 2
    assert "node_timings.wait_series" in capsys.readouterr().err


def test_api_times_truncated_to_the_second_are_narrowed_by_the_listings_that_first_showed_them():
    import math
    import random

    from loadtest.e2e.stack import seen_between

    rng = random.Random(3)
    errors, truncated = [], []
    for _ in range(2000):
        true = 1000.0 + rng.uniform(0, 100)
        before = true - rng.uniform(0, 0.5)  # the listings that missed it began then
        by = before + 0.5 + rng.uniform(0, 0.1)  # the next sample's listings, done by then, showed it
        stamp = float(math.floor(true))
        errors.append(seen_between(stamp, before, by) - true)
        truncated.append(stamp - true)
    assert abs(sum(truncated) / len(truncated) + 0.5) < 0.05  # the stamp alone: half a second early on average
    assert abs(sum(errors) / len(errors)) < 0.03 and max(map(abs, errors)) <= 0.5
    # seen with no listing before it, or already there when first listed: the middle of its second
    assert seen_between(1000.0, None, 1000.3) == 1000.15
    assert seen_between(1000.0, 1004.0, 1004.5) == 1000.5
