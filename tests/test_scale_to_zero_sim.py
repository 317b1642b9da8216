"""Scale to zero in the simulators and the benchmark: requests arriving while no replica is ready are held
until the first Ready replica, their wait counts against the SLO, and they are reported apart. With one
replica a queue per replica (`least-conn`) is the shared queue: the tests that wake one run with both."""

import json

import numpy as np
import pytest

from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.dispatch import DISPATCHES
from autoscaler.sim.guard import Guard
from autoscaler.sim.hold import Holds
from autoscaler.sim.rate import RateSim
from autoscaler.sim.request import RequestSim
from autoscaler.sim.workload import RateWorkload, RequestWorkload
from loadtest import bench

MODEL = ClusterModel(startup_s=60.0, node_provisioning_s=0.0, startup_jitter_ratio=0.0, node_jitter_ratio=0.0)


def requests(arrival_s, service_s=1.0):
    n = len(arrival_s)
    return RequestWorkload(name="t", scale=1.0, arrival_s=np.asarray(arrival_s, dtype=float),
                           service_s=np.full(n, service_s), output_tokens=np.zeros(n), priority=np.zeros(n, dtype=int),
                           uniform=np.full(n, 0.99), span_s=200.0)


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_requests_at_zero_are_held_until_the_first_ready_replica(dispatch):
    """At zero from t=0, three requests arrive at 5, 6 and 7 s; a replica ordered at 15 s is Ready at 75 s:
    each is held until then (70, 69, 68 s), misses the 2-s SLO, and none is dropped (max hold 100 s)."""
    sim = RequestSim(requests([5.0, 6.0, 7.0, 100.0]), concurrency=4, slo_s=2.0, tick_s=15.0, max_hold_s=100.0,
                     dispatch=dispatch)
    cluster = SimCluster.started(MODEL, replicas=0, now=0.0)
    for now in np.arange(0.0, 200.0, 15.0):
        cluster.advance(now)
        signals = sim.signals(now, cluster)
        if now == 15.0:
            assert signals.held_requests.value == 3  # what the gateway holds, for the policy's wake
            cluster.scale_to(1)
        sim.serve(now, now + 15.0, cluster, {})
    sim.finish(200.0)
    outcome = sim.outcome()
    np.testing.assert_allclose(sim.wait[:3], [70.0, 69.0, 68.0])
    assert outcome["hold"] == {"held_requests": 3.0, "hold_p50_s": 69.0, "hold_p99_s": 70.0, "dropped_held": 0.0,
                               "max_hold_s": 100.0,
                               "by_start": {"node": {"held_requests": 3.0, "hold_p50_s": 69.0, "hold_p99_s": 70.0}}}
    assert outcome["slo_attainment"]["critical"] == pytest.approx(0.25)  # only the request at 100 s met it


def mixed(arrival_s, priority, service_s):
    n = len(arrival_s)
    return RequestWorkload(name="t", scale=1.0, arrival_s=np.asarray(arrival_s, dtype=float),
                           service_s=np.full(n, service_s), output_tokens=np.zeros(n),
                           priority=np.asarray(priority, dtype=int), uniform=np.full(n, 0.99), span_s=200.0)


def wake(sim, *, until_s=200.0, probe=None, replicas=1, guard=None):
    """At zero; `replicas` (one: 2 slots) ordered at 15 s are Ready at 75 s. `probe(now, signals)` each tick;
    `guard`: the saturation guard of every tick's decision."""
    cluster = SimCluster.started(MODEL, replicas=0, now=0.0)
    for now in np.arange(0.0, until_s, 15.0):
        cluster.advance(now)
        signals = sim.signals(now, cluster)
        if probe is not None:
            probe(now, signals)
        if now == 15.0:
            cluster.scale_to(replicas)
        sim.serve(now, now + 15.0, cluster, {}, guard)
    sim.finish(until_s)
    return sim.outcome()


# four standard requests at 5-8 s, then two critical at 9 and 10 s; 30 s of service each
HELD = ([5.0, 6.0, 7.0, 8.0, 9.0, 10.0], [1, 1, 1, 1, 0, 0])


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_held_requests_are_released_by_ready_capacity_critical_first(dispatch):
    """The Ready replica's 2 slots take the two critical requests at 75 s (held 66 and 65 s), then two
    standard ones as each pair completes (105 s, 135 s), in arrival order; the rest stay held meanwhile and the
    policy sees them as `held_requests`. Before, all six went to the replica at once, first come first served
    (the critical ones last, started at 135 s) and `held_requests` read 0 once a replica was Ready."""
    seen = {}
    sim = RequestSim(mixed(*HELD, 30.0), concurrency=2, slo_s=2.0, tick_s=15.0, max_hold_s=300.0, dispatch=dispatch)
    outcome = wake(sim, probe=lambda now, signals: seen.setdefault(now, signals))
    np.testing.assert_allclose(sim.wait, [100.0, 99.0, 128.0, 127.0, 66.0, 65.0])  # old: [70, 69, 98, 97, 126, 125]
    np.testing.assert_allclose(sim.hold_s, sim.wait)  # released to a free slot: no queue wait at the replica
    assert seen[90.0].held_requests.value == 4 and seen[120.0].held_requests.value == 2
    assert seen[90.0].queue_depth.value == 0  # the replica's queue: the held ones are at the gateway
    assert outcome["hold"] == {"held_requests": 6.0, "hold_p50_s": 99.0, "hold_p99_s": 128.0, "dropped_held": 0.0,
                               "max_hold_s": 300.0,
                               "by_start": {"node": {"held_requests": 6.0, "hold_p50_s": 99.0, "hold_p99_s": 128.0}}}


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_the_release_sees_a_replica_ready_at_the_loops_next_tick(dispatch):
    """With `ready_seen_every_s` 10 (the loop's held tick, at factor 10), the replica Ready at 75 s releases
    the held requests from 80 s: every hold 5 s longer."""
    sim = RequestSim(mixed(*HELD, 30.0), concurrency=2, slo_s=2.0, tick_s=15.0, max_hold_s=300.0, dispatch=dispatch,
                     ready_seen_every_s=10.0)
    wake(sim)
    np.testing.assert_allclose(sim.hold_s, [105.0, 104.0, 133.0, 132.0, 71.0, 70.0])


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_a_request_held_after_a_replica_turned_ready_wakes_the_loop_which_then_sees_it(dispatch):
    """As above, with one more critical request at 77 s: held (others are), it wakes the loop at once, whose
    tick publishes the replica Ready at 75 s, so the release comes at 77 s, not at the next tick (80 s)."""
    arrival, priority = HELD
    sim = RequestSim(mixed([*arrival, 77.0], [*priority, 0], 30.0), concurrency=2, slo_s=2.0, tick_s=15.0,
                     max_hold_s=300.0, dispatch=dispatch, ready_seen_every_s=10.0)
    wake(sim)
    np.testing.assert_allclose(sim.hold_s[4:6], [68.0, 67.0])  # released at 77 s (80 s without the wake: 71, 70)


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_a_release_meets_the_guard_with_its_own_queue_and_depths_for_the_replicas_it_counts(dispatch):
    """Four critical and ten standard requests held; three replicas of 2 slots Ready at 75 s, while the guard's
    decision was made with one (depth 1 for standard, 2 slots: an allowance of 1 a replica), so the release
    takes 3 x (2 + 1) = 9. The four critical go, then standard as the queue the release counts stays below the
    depth for three replicas (3): five. Judged by the decision's depth for one replica, the third would have met
    a queue of 1 and every standard request held would have been shed at once (the release goes on past a
    shed one); the live loop decides again on each held arrival, with the replicas Ready then."""
    sim = RequestSim(mixed([5.0, 6.0, 7.0, 8.0, *np.arange(9.0, 19.0)], [0] * 4 + [1] * 10, 30.0), concurrency=2,
                     slo_s=2.0, tick_s=15.0, max_hold_s=300.0, dispatch=dispatch)
    wake(sim, until_s=90.0, replicas=3, guard=Guard({"standard": 1}, slots=2, drain_per_s=2 / 30.0))
    released = np.flatnonzero(np.isclose(sim.w.arrival_s + sim.hold_s, 75.0))
    assert not sim.shed.any()
    assert sorted(released) == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # at 75 s: the four critical and five standard


def test_a_held_request_counts_as_an_arrival_when_its_hold_starts():
    """The live endpoint counts a request's class when it starts holding it: the wake sees the demand that is
    waiting (0.4 req/s in the tick to 15 s, by class), not what the Ready replicas take. A released request
    does not count again. Before, the simulator counted a held request only when it was answered: 0 req/s
    until the release, then the released ones (2/15 req/s of critical in the tick to 90 s)."""
    seen = {}
    wake(RequestSim(mixed(*HELD, 30.0), concurrency=2, slo_s=2.0, tick_s=15.0, max_hold_s=300.0),
         probe=lambda now, signals: seen.setdefault(now, signals))
    assert seen[15.0].arrival_rate_per_s.value == pytest.approx(6 / 15) and seen[15.0].held_requests.value == 6
    assert seen[15.0].arrival_rate_by_priority == {"critical": pytest.approx(2 / 15),
                                                   "standard": pytest.approx(4 / 15), "sheddable": 0.0}
    assert seen[90.0].arrival_rate_per_s.value == 0.0  # released at 75 s: not counted a second time
    assert seen[120.0].arrival_rate_by_priority == {"critical": 0.0, "standard": 0.0, "sheddable": 0.0}


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_a_request_held_past_max_hold_s_is_dropped_and_never_served(dispatch):
    """max_hold_s 110: the standard requests of 7 and 8 s, still held at 120 s, get the gateway's 503; the
    replica serves the other four only. Before, a drop was only counted and the request still served."""
    sim = RequestSim(mixed(*HELD, 30.0), concurrency=2, slo_s=2.0, tick_s=15.0, max_hold_s=110.0, dispatch=dispatch)
    outcome = wake(sim)
    assert list(sim.dropped) == [False, False, True, True, False, False]
    assert np.isnan(sim.wait[2:4]).all()  # never served
    np.testing.assert_allclose(sim.hold_s, [100.0, 99.0, 110.0, 110.0, 66.0, 65.0])
    assert outcome["hold"]["dropped_held"] == 2.0 and outcome["hold"]["hold_p99_s"] == 110.0


def test_the_service_time_signal_by_completion():
    """With `service_by_completion` the mean service time is of the requests completed in the last minute (as
    vLLM's inference-time histogram reports it), and missing when none completed: when traffic stops, the last
    reading is of the longest requests. By arrival (the default) both requests count from the start."""
    work = RequestWorkload(name="t", scale=1.0, arrival_s=np.array([1.0, 2.0]), service_s=np.array([40.0, 2.0]),
                           output_tokens=np.zeros(2), priority=np.zeros(2, dtype=int), uniform=np.full(2, 0.99),
                           span_s=200.0)
    by_arrival, by_completion = (RequestSim(work, concurrency=4, slo_s=2.0, tick_s=15.0, service_by_completion=flag)
                                 for flag in (False, True))
    cluster = SimCluster.started(MODEL, replicas=1, now=0.0)
    readings: dict[float, tuple] = {}
    for now in np.arange(0.0, 150.0, 15.0):
        cluster.advance(now)
        readings[now] = tuple(sim.signals(now, cluster).service_time_s for sim in (by_arrival, by_completion))
        for sim in (by_arrival, by_completion):
            sim.serve(now, now + 15.0, cluster, {})
    assert readings[30.0][0].value == 21.0 and readings[30.0][1].value == 2.0  # the 2-s one done at 4 s
    assert readings[45.0][1].value == 21.0  # the 40-s one done at 41 s
    assert readings[90.0][1].value == 40.0  # only the long one in (30, 90]
    assert readings[120.0][1] is None  # nothing completed in (60, 120]


def test_the_holds_say_whether_the_wake_landed_on_a_free_slot_or_waited_for_a_node():
    """Node provisioning 240 s, start-up 60 s. One replica goes at 0 s and its node stays idle for 600 s: a
    request at 30 s wakes the model onto that idle slot (ordered at 45 s, Ready at 105 s: held 75 s). Back to
    zero at 150 s, the node is gone at 750 s: a request at 800 s waits for a new node too (ordered at 810 s,
    Ready at 1110 s: held 310 s). The figures say which wake each hold waited for."""
    model = ClusterModel(startup_s=60.0, node_provisioning_s=240.0, startup_jitter_ratio=0.0, node_jitter_ratio=0.0,
                         node_idle_timeout_s=600.0)
    sim = RequestSim(requests([30.0, 800.0]), concurrency=4, slo_s=2.0, tick_s=15.0, max_hold_s=900.0)
    cluster = SimCluster.started(model, replicas=1, now=0.0)
    cluster.scale_to(0)
    for now in np.arange(0.0, 1200.0, 15.0):
        cluster.advance(now)
        if now in (45.0, 810.0):
            cluster.scale_to(1)
        if now == 150.0:
            cluster.scale_to(0)
        sim.signals(now, cluster)
        sim.serve(now, now + 15.0, cluster, {})
    sim.finish(1200.0)
    hold = sim.outcome()["hold"]
    assert sim.wake_start == ["slot", "node"]
    assert hold["by_start"] == {"slot": {"held_requests": 1.0, "hold_p50_s": 75.0, "hold_p99_s": 75.0},
                                "node": {"held_requests": 1.0, "hold_p50_s": 310.0, "hold_p99_s": 310.0}}


def test_without_max_hold_s_nothing_is_reported_or_signalled():
    sim = RequestSim(requests([5.0]), concurrency=4, slo_s=2.0, tick_s=15.0)
    cluster = SimCluster.started(MODEL, replicas=0, now=0.0)
    assert sim.signals(15.0, cluster).held_requests is None
    assert "hold" not in sim.outcome()


def test_the_rate_simulator_holds_a_ticks_arrivals_until_the_first_ready():
    windows = 2
    workload = RateWorkload(name="r", scale=1.0, window_s=600.0, rate_per_s=np.array([1.0, 1.0]),
                            client_rate_per_s=np.ones((1, windows)), client_cv2=np.full((1, windows), 1e-6),
                            service_s=np.full(windows, 1.0), output_tokens=np.zeros(windows),
                            priority_mix=(1.0, 0.0, 0.0), span_s=1200.0)
    sim = RateSim(workload, concurrency=4, slo_s=2.0, tick_s=15.0, max_hold_s=300.0)
    cluster = SimCluster.started(MODEL, replicas=0, now=0.0)
    cluster.scale_to(1)  # Ready at 60 s: the ticks from 0, 15, 30 and 45 s are held 52.5, 37.5, 22.5, 7.5 s
    for now in np.arange(0.0, 120.0, 15.0):
        cluster.advance(now)
        if now == 30.0:
            assert sim.signals(now, cluster).held_requests.value == pytest.approx(30.0, rel=1e-3)
        sim.serve(now, now + 15.0, cluster, {})
    sim.finish(120.0)
    hold = sim.outcome()["hold"]
    assert hold["held_requests"] == pytest.approx(60.0, rel=1e-3)
    assert hold["hold_p50_s"] == 22.5 and hold["hold_p99_s"] == 52.5 and hold["dropped_held"] == 0.0


def test_weighted_hold_quantiles():
    holds = Holds(max_hold_s=10.0)
    holds.add(1.0, 98.0)
    holds.add(20.0, 2.0)
    assert holds.figures() == {"held_requests": 100.0, "hold_p50_s": 1.0, "hold_p99_s": 20.0, "dropped_held": 2.0,
                               "max_hold_s": 10.0}
    assert Holds(max_hold_s=1.0).figures()["hold_p99_s"] is None


ARGS = ["--trace", "scenario:on-off-4h", "--peak-replicas", "2", "--policies", "predictive", "--json"]


def test_bench_with_idle_after_s_runs_predictive_zero_and_reports_holds(capsys):
    assert bench.main(ARGS) == 0
    off = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in off] == ["predictive", "clairvoyant"] and all("hold" not in r for r in off)
    assert bench.main(ARGS + ["--idle-after-s", "300"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == ["predictive", "predictive-zero", "clairvoyant"]
    zero, kept = rows["predictive-zero"]["hold"], rows["predictive"]["hold"]
    assert kept["held_requests"] == 0  # never at zero
    assert zero["held_requests"] > 0 and 0 < zero["hold_p50_s"] <= zero["hold_p99_s"]
    assert zero["hold_p50_s"] >= 0.5 * 120.0  # at least a pod start-up (of the jittered 120 s) per wake
    for name in ("predictive", "clairvoyant"):  # the flag changes nothing else
        assert {k: v for k, v in rows[name].items() if k not in ("hold", "wall_s")} == \
            {k: v for k, v in next(r for r in off if r["policy"] == name).items() if k != "wall_s"}


def test_bench_refuses_a_too_short_idle_window_and_max_hold_without_it(capsys):
    assert bench.main(ARGS + ["--idle-after-s", "30"]) == 2
    assert "idle_after_s (30) must be at least 4 ticks" in capsys.readouterr().err
    assert bench.main(ARGS + ["--max-hold-s", "100"]) == 2
    assert "--max-hold-s needs --idle-after-s" in capsys.readouterr().err


def test_with_two_replicas_the_held_requests_go_one_to_each_as_the_replicas_take_them():
    """Two replicas of one slot Ready at 75 s: the two critical requests leave first, one to each (held 66
    and 65 s), then the standard ones as the slots free, in arrival order; the same as one shared queue."""
    holds = {}
    for dispatch in DISPATCHES:
        sim = RequestSim(mixed(*HELD, 30.0), concurrency=1, slo_s=2.0, tick_s=15.0, max_hold_s=300.0,
                         dispatch=dispatch)
        wake(sim, replicas=2)
        holds[dispatch] = sim.hold_s.copy()
        np.testing.assert_allclose(sim.hold_s, [100.0, 99.0, 128.0, 127.0, 66.0, 65.0])
    np.testing.assert_array_equal(holds["shared"], holds["least-conn"])
