"""The simulator's dispatch: one shared queue, or a queue per replica behind least connections."""

import numpy as np
import pytest

from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.dispatch import LeastConn
from autoscaler.sim.request import RequestSim
from autoscaler.sim.run import traffic_sim
from autoscaler.sim.workload import RequestWorkload
from loadtest import bench, queuebalance
from policies.queueing import erlang_c, mean_wait

from helpers import BUNDLED_TRACE

TICK_S = 15.0


def _workload(*, rate: float, span: float, seed: int = 11, classes: int = 1) -> RequestWorkload:
    """Poisson arrivals, exponential service of mean 1 s; classes drawn 20/50/30 when there are three."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * span * 1.2)))
    arrivals = arrivals[arrivals < span]
    n = len(arrivals)
    priority = rng.choice(3, n, p=queuebalance.MIX) if classes == 3 else np.ones(n)
    return RequestWorkload(
        name="mmc", scale=1.0, arrival_s=arrivals, service_s=rng.exponential(1.0, n), output_tokens=np.ones(n),
        priority=priority.astype(np.int8), uniform=rng.random(n), span_s=span,
    )


def _served(workload: RequestWorkload, *, replicas: int, slots: int, **options) -> RequestSim:
    cluster = SimCluster.started(ClusterModel(), replicas=replicas, now=0.0)
    sim = RequestSim(workload, concurrency=slots, slo_s=2.0, tick_s=TICK_S, **options)
    t = 0.0
    while t < workload.span_s:
        sim.serve(t, t + TICK_S, cluster, {})
        t += TICK_S
    sim.finish(workload.span_s)
    return sim


@pytest.mark.parametrize("server_priority", [False, True])
def test_one_replica_behind_least_connections_is_the_shared_queue_and_erlang_c(server_priority):
    """One replica of 16 slots at 85 %: its own queue is the one queue, request for request; and M/M/16."""
    workload = _workload(rate=13.6, span=6000.0, classes=3)
    split = _served(workload, replicas=1, slots=16, dispatch="least-conn", server_priority=server_priority)
    shared = _served(workload, replicas=1, slots=16, server_priority=server_priority)
    np.testing.assert_array_equal(split.wait, shared.wait)
    waits = split.wait[~np.isnan(split.wait)]
    assert (waits > 0).mean() == pytest.approx(erlang_c(16, 13.6), rel=0.1)
    assert waits.mean() == pytest.approx(mean_wait(16, 13.6, 1.0), rel=0.15)


def test_several_replicas_behind_least_connections_wait_more_as_queuebalance_says():
    """Four 8-slot replicas at 22 req/s (exponential service of 1 s, critical first): the share of
    critical requests waiting past 0.2 s is near `loadtest.queuebalance`'s for least connections, and many
    times the shared queue's."""
    workload = _workload(rate=22.0, span=6000.0, classes=3)
    late = {}
    for dispatch in ("shared", "least-conn"):
        sim = _served(workload, replicas=4, slots=8, dispatch=dispatch, server_priority=True)
        critical = workload.priority == 0
        late[dispatch] = float((sim.wait[critical] > 0.2).mean())
    expected = queuebalance.late_shares(rate_per_s=22.0, servers=4, slots=8, service_s=1.0, slo_s=0.2,
                                        requests=len(workload.arrival_s), seed=1, exponential=True)["critical"]
    assert late["least-conn"] == pytest.approx(expected, rel=0.4)  # ~0.5 %: 0.39 % here, 0.46 % there
    assert late["least-conn"] > 5 * max(late["shared"], 1e-4)


def _four_requests() -> RequestWorkload:
    n = 6
    return RequestWorkload(
        name="drain", scale=1.0, arrival_s=np.array([0.0, 0.1, 0.2, 0.3, 2.0, 2.1]), service_s=np.full(n, 10.0),
        output_tokens=np.ones(n), priority=np.ones(n, dtype=np.int8), uniform=np.ones(n), span_s=60.0,
    )


def test_a_removed_replica_serves_its_own_queue_and_takes_no_new_request():
    """Two 1-slot replicas: requests 0 and 2 go to the first, 1 and 3 to the second (the first of the
    fewest); the second is removed at 1 s and still serves request 3 at 10.1 s; the arrivals at 2 s and 2.1 s
    queue at the first, behind request 2."""
    cluster = SimCluster.started(ClusterModel(), replicas=2, now=0.0)
    sim = RequestSim(_four_requests(), concurrency=1, slo_s=2.0, tick_s=1.0, dispatch="least-conn")
    sim.serve(0.0, 1.0, cluster, {})
    cluster.advance(1.0)
    cluster.scale_to(1)
    sim.serve(1.0, 60.0, cluster, {})
    starts = sim.wait + sim.w.arrival_s
    np.testing.assert_allclose(starts, [0.0, 0.1, 10.0, 10.1, 20.0, 30.0])
    # request 3 was queued on it; it served 9.1 s of request 1 and 10 s of request 3 after its removal
    assert sim.outcome()["drain"] == {"queued_at_removal": 1, "replica_hours_after_removal": round(19.1 / 3600, 3)}


def test_arrivals_with_no_replica_ready_join_the_first_that_turns_ready():
    """Two replicas turn Ready together at 10 s: the requests that found none spread over both."""
    model = ClusterModel(startup_s=5.0, startup_jitter_ratio=0.0, node_provisioning_s=5.0, node_jitter_ratio=0.0)
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.scale_to(2)
    sim = RequestSim(_four_requests(), concurrency=1, slo_s=2.0, tick_s=1.0, dispatch="least-conn")
    sim.serve(0.0, 1.0, cluster, {})
    assert sim.signals(1.0, cluster).queue_depth.value == 4  # waiting for a replica: queued
    sim.serve(1.0, 120.0, cluster, {})
    np.testing.assert_allclose(sim.wait + sim.w.arrival_s, [10.0, 10.0, 20.0, 20.0, 30.0, 30.0])


def test_a_dispatch_it_does_not_know_is_an_error():
    with pytest.raises(ValueError, match="dispatch: expected one of shared, least-conn"):
        RequestSim(_four_requests(), concurrency=1, slo_s=2.0, tick_s=1.0, dispatch="random")


def test_the_bench_hands_its_dispatch_to_the_simulator():
    setup = bench.prepare(bench.parse_args(["--trace", str(BUNDLED_TRACE), "--dispatch", "least-conn"]))
    assert isinstance(traffic_sim(setup.workload, setup.config)._queue, LeastConn)  # noqa: SLF001
    setup = bench.prepare(bench.parse_args(["--trace", str(BUNDLED_TRACE)]))
    assert not isinstance(traffic_sim(setup.workload, setup.config)._queue, LeastConn)  # noqa: SLF001


def test_the_bench_refuses_least_conn_on_a_rate_trace(tmp_path, capsys):
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.0,2.0,Gamma,1,1\n600,0,0,,0,0\n")
    assert bench.main(["--trace", str(tmp_path), "--dispatch", "least-conn"]) == 2
    assert "--dispatch least-conn: modelled for request traces only" in capsys.readouterr().err
