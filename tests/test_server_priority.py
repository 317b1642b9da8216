"""Server priority scheduling in the request-level simulator (vLLM's `--scheduling-policy priority`): the
queue is served by (class, arrival), highest class first; without it, first come first served. And the
benchmark's `--server-priority` and `--seeds` options."""

import json

import numpy as np
import pytest

from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.request import RequestSim
from autoscaler.sim.run import SimConfig, run
from autoscaler.sim.workload import RateWorkload, RequestWorkload
from loadtest import policyset
from loadtest.bench import main, seed_range


def _queued_behind_one_slot(server_priority):
    """One slot, held 10 s by request 0; then sheddable (2), standard (1), sheddable, critical (0) arrive
    1 s apart and queue. The order they get the slot in, by their wait."""
    priority = np.array([2, 2, 1, 2, 0], dtype=np.int8)
    workload = RequestWorkload(name="q", scale=1.0, arrival_s=np.arange(5, dtype=float),
                               service_s=np.array([10.0, 1.0, 1.0, 1.0, 1.0]), output_tokens=np.ones(5),
                               priority=priority, uniform=np.ones(5), span_s=60.0)
    sim = RequestSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0, server_priority=server_priority)
    cluster = SimCluster.started(ClusterModel(), replicas=1, now=0.0)
    sim.serve(0.0, 60.0, cluster, {})
    sim.finish(60.0)
    started = sim.wait + workload.arrival_s
    return [int(j) for j in np.argsort(started)][1:], sim


def test_server_priority_serves_a_later_critical_request_first():
    order, sim = _queued_behind_one_slot(True)
    assert order == [4, 2, 1, 3]
    assert sim.wait[4] == pytest.approx(6.0)  # arrived at 4 s, served when request 0 ended at 10 s
    assert sim.outcome()["slo_attainment"]["critical"] == 0.0  # 6 s > the 2 s SLO: still a miss


def test_without_server_priority_the_queue_is_first_come_first_served():
    order, sim = _queued_behind_one_slot(False)
    assert order == [1, 2, 3, 4]
    assert sim.wait[4] == pytest.approx(9.0)


def test_seed_ranges():
    assert seed_range("1-3") == [1, 2, 3] and seed_range("1-2,6") == [1, 2, 6] and seed_range("4") == [4]
    for bad in ("3-1", "a", "1-", ""):
        with pytest.raises(Exception, match="expected seeds"):
            seed_range(bad)


def test_seeds_print_each_seed_and_the_worst_seeds_verdict(capsys):
    assert main(["--trace", "scenario:doubling", "--seeds", "1-2"]) == 0
    out = capsys.readouterr().out
    assert "seed 1: critical" in out and "seed 2: critical" in out
    assert "worst seed " in out and "targets:" in out and "of 2 seeds" in out
    one = main(["--trace", "scenario:doubling", "--seed", "2", "--policies", "predictive", "--json"])
    assert one == 0  # --seeds 2 is --seed 2: the same row
    row = json.loads(capsys.readouterr().out)[0]
    assert f"{row['slo_attainment']['critical']:.4%}" in out.split("seed 2: critical ")[1].split(",")[0]


def test_server_priority_flag_reaches_the_simulation_and_is_refused_on_rate_traces(capsys):
    assert main(["--trace", "scenario:doubling", "--policies", "hpa", "--json"]) == 0
    fcfs = capsys.readouterr().out
    assert main(["--trace", "scenario:doubling", "--policies", "hpa", "--json", "--server-priority"]) == 0
    prio = capsys.readouterr().out
    a_fcfs, a_prio = (json.loads(t)[0]["slo_attainment"] for t in (fcfs, prio))
    assert a_prio["critical"] > a_fcfs["critical"] and a_prio["sheddable"] < a_fcfs["sheddable"]
    n, tick = 8, 15.0
    rate = RateWorkload(name="flat", scale=1.0, window_s=tick, rate_per_s=np.full(n, 1.0),
                        client_rate_per_s=np.full((1, n), 1.0), client_cv2=np.full((1, n), 1.0),
                        service_s=np.full(n, 1.0), output_tokens=np.zeros(n), priority_mix=(0.2, 0.5, 0.3),
                        span_s=n * tick)
    policy = policyset.build(SimConfig(), np.ones(n, dtype=int), ("static",), predictive=None, max_replicas=4)[0]
    with pytest.raises(ValueError, match="request traces"):
        run(policy, rate, SimConfig(server_priority=True), initial_replicas=1)


def test_the_worst_seed_is_the_tightest_margin_then_the_next():
    from loadtest.measure import margins

    classes, sheddable = ("critical", "standard", "sheddable"), ("sheddable",)
    a = {"slo_attainment": {"critical": 1.0, "standard": 0.995, "sheddable": 0.9}, "shed_by_class": {"sheddable": 0.01}}
    b = {"slo_attainment": {"critical": 1.0, "standard": 0.999, "sheddable": 0.9}, "shed_by_class": {"sheddable": 0.01}}
    assert margins(a, classes, sheddable) == pytest.approx([0.001, 0.005, 0.04])
    assert min((b, a), key=lambda r: margins(r, classes, sheddable)) is a
