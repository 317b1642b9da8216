"""The simulated cluster and its queueing, checked against Erlang C."""

from dataclasses import astuple

import numpy as np
import pytest

from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.rate import RateSim, _guarded_tail, tick_arrivals
from autoscaler.sim.request import RequestSim
from autoscaler.sim.workload import RateWorkload, RequestWorkload, scaled_cv2
from policies.queueing import erlang_c, mean_wait


def _poisson_workload(rate: float, service: float, span: float, seed: int = 11) -> RequestWorkload:
    rng = np.random.default_rng(seed)
    n = int(rate * span * 1.2)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    arrivals = arrivals[arrivals < span]
    n = len(arrivals)
    return RequestWorkload(
        name="mmc", scale=1.0, arrival_s=arrivals, service_s=rng.exponential(service, n),
        output_tokens=np.ones(n), priority=np.ones(n, dtype=np.int8), uniform=rng.random(n), span_s=span,
    )


@pytest.mark.parametrize("servers,rho", [(4, 0.75), (16, 0.85), (32, 0.9)])
def test_request_simulation_matches_erlang_c(servers, rho):
    """M/M/c with fixed servers: P(wait > 0) and E[W] within 10 % (relative) of Erlang C. Tolerance covers
    the sampling error of ~10^5 requests and the cold (empty) start."""
    service = 1.0
    rate = rho * servers / service
    span = 120000.0 / rate
    workload = _poisson_workload(rate, service, span)
    cluster = SimCluster.started(ClusterModel(), replicas=servers, now=0.0)
    sim = RequestSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    t = 0.0
    while t < span:
        sim.serve(t, t + 15.0, cluster, {})
        t += 15.0
    sim.finish(span)
    waits = sim.wait[~np.isnan(sim.wait)]
    offered = rate * service
    assert (waits > 0).mean() == pytest.approx(erlang_c(servers, offered), rel=0.1)
    assert waits.mean() == pytest.approx(mean_wait(servers, offered, service), rel=0.1)


def test_rate_simulation_relaxes_to_erlang_c():
    """Held load: the rate-level queue reaches the stationary M/M/c waiting probability."""
    n = 400
    tick = 15.0
    rate, service, slots = 10.0, 3.0, 36
    workload = RateWorkload(
        name="flat", scale=1.0, window_s=tick, rate_per_s=np.full(n, rate), client_rate_per_s=np.full((1, n), rate),
        client_cv2=np.full((1, n), 1e-6), service_s=np.full(n, service), output_tokens=np.zeros(n),
        priority_mix=(0.2, 0.5, 0.3), span_s=n * tick,
    )
    cluster = SimCluster.started(ClusterModel(), replicas=slots, now=0.0)
    sim = RateSim(workload, concurrency=1, slo_s=2.0, tick_s=tick)
    for i in range(n):
        sim.serve(i * tick, (i + 1) * tick, cluster, {})
    assert sim.c_eff == pytest.approx(erlang_c(slots, rate * service), rel=0.02)
    assert sim.backlog == 0.0


def test_new_replica_waits_for_a_node_unless_a_warm_slot_is_free():
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0)
    cluster = SimCluster.started(model, replicas=1, now=0.0)
    cluster.scale_to(2)
    assert cluster.pods[-1].ready_s == pytest.approx(400.0)
    cluster.warm_to(1)  # placeholder needs a node too
    cluster.advance(300.0)
    assert cluster.state().warm_slots_ready == 1
    cluster.scale_to(3)
    assert cluster.pods[-1].ready_s == pytest.approx(400.0)  # 300 + start-up only
    assert cluster.warm_slots == 0


def test_a_twin_replays_the_live_node_waits_and_start_ups_its_requests_meet():
    """Nodes requested at 100 s take the live nodes requested within a minute, in order of request however the
    series is ordered, and arrive when those did (90 + 200 s, 95 + 250 s: the provisioner's batches are on its
    clock); the third finds none within a minute and takes the configured 300 s; one requested far from any
    live request does too. Start-ups last as long as the live one met: 80 s, then the configured 100 s."""
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0,
                         node_waits=((1000.0, 10.0), (90.0, 200.0), (95.0, 250.0)), startups=((130.0, 80.0),))
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.advance(100.0)
    cluster.scale_to(3)
    assert sorted(p.ready_s for p in cluster.pods) == pytest.approx([90 + 200 + 80, 95 + 250 + 100, 100 + 300 + 100])
    cluster.advance(500.0)
    cluster.scale_to(4)  # 500 s: the live request at 1000 s is too far off
    assert cluster.pods[-1].ready_s == pytest.approx(500 + 300 + 100)
    assert model.worst_cold_start_s == pytest.approx(100 + 300)  # no replayed time is slower than the configured
    slow = ClusterModel(node_waits=((0.0, 900.0),), node_jitter_ratio=0.0, startup_jitter_ratio=0.0)
    assert slow.worst_cold_start_s == pytest.approx(120 + 900)
    with pytest.raises(ValueError, match="node_waits"):
        ClusterModel(node_waits=((0.0, -1.0),))


def test_a_node_wait_recorded_with_its_replicas_start_up_replays_the_two_together():
    """Two live replicas ordered at 100 s: the one whose node came at 300 s started up in 150 s, the one whose
    node came at 400 s in 50 s. Matched apart, the twin's first node (300 s) took the first start-up in order
    (50 s) and both replicas were Ready at 350 and 550 s; recorded together, they are Ready when the live ones
    were, 450 s each, and the start-ups they took are not matched again: a third replica gets the one left."""
    waits = ((100.0, 200.0, 150.0), (100.0, 300.0, 50.0))
    startups = ((100.0, 50.0), (100.0, 150.0), (100.0, 70.0))
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0,
                         node_waits=waits, startups=startups)
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.advance(100.0)
    cluster.scale_to(2)
    assert [p.ready_s for p in cluster.pods] == pytest.approx([450.0, 450.0])
    cluster.advance(120.0)
    cluster.scale_to(3)  # a node drawn (no wait left); the start-up the pairs left, 70 s (50 s if not taken)
    assert cluster.pods[-1].ready_s == pytest.approx(120 + 300 + 70)
    apart = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0,
                         node_waits=tuple(w[:2] for w in waits), startups=startups)
    cluster = SimCluster.started(apart, replicas=0, now=0.0)
    cluster.advance(100.0)
    cluster.scale_to(2)
    assert sorted(p.ready_s for p in cluster.pods) == pytest.approx([350.0, 550.0])
    with pytest.raises(ValueError, match="node_waits"):
        ClusterModel(node_waits=((0.0, 1.0, -1.0),))
    with pytest.raises(ValueError, match="startups"):
        ClusterModel(startups=((0.0, 1.0, 1.0),))


def test_the_first_replica_on_a_node_a_placeholder_requested_takes_that_nodes_recorded_start_up():
    """A placeholder ordered at 100 s takes the live node wait (arrives at 300 s) recorded with a 150-s start-up;
    a replica ordered at 120 s goes to that node while it is provisioned and starts up for 150 s, not for the
    startups series' first, 50 s."""
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0,
                         node_waits=((100.0, 200.0, 150.0),), startups=((100.0, 50.0), (100.0, 150.0)))
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.advance(100.0)
    cluster.warm_to(1)
    cluster.advance(120.0)
    cluster.scale_to(1)
    assert cluster.pods[0].ready_s == pytest.approx(300.0 + 150.0)


def test_a_replay_leaves_the_drawn_times_of_the_rest_as_they_were():
    """With jitter, replicas the series does not meet get the very times they get without a series: the
    replay takes its values without moving the seeded draws."""
    def ready_times(**replay):
        cluster = SimCluster.started(ClusterModel(**replay), replicas=0, now=0.0)
        cluster.advance(100.0)
        cluster.scale_to(3)
        cluster.advance(5000.0)
        cluster.scale_to(5)
        return [p.ready_s for p in cluster.pods]

    plain = ready_times()
    assert len(set(plain)) == 5  # drawn with jitter
    assert ready_times(node_waits=((9000.0, 1.0),), startups=((9000.0, 1.0),)) == plain  # met by none
    replayed = ready_times(node_waits=((100.0, 200.0),), startups=((100.0, 80.0),))
    assert replayed[0] == pytest.approx(100 + 200 + 80)
    assert sorted(replayed[1:]) == sorted(plain[1:])


def test_a_replica_held_by_the_node_limit_replays_the_start_up_of_its_order():
    """Ordered at 100 s beyond a limit raised at 400 s: its start-up is the one recorded at its order."""
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=50.0, node_jitter_ratio=0.0,
                         node_limit=((0.0, 0), (400.0, 5)), startups=((100.0, 70.0), (400.0, 130.0)))
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.advance(100.0)
    cluster.scale_to(1)
    cluster.advance(400.0)
    assert cluster.pods[0].ready_s == pytest.approx(400 + 50 + 70)


def test_freed_slot_is_reused_before_a_new_node():
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0)
    cluster = SimCluster.started(model, replicas=3, now=0.0)
    cluster.advance(50.0)
    cluster.scale_to(2)
    cluster.scale_to(3)
    assert cluster.pods[-1].ready_s == pytest.approx(150.0)
    assert cluster.scaling_actions == 2


def test_costs_count_warming_serving_warm_and_idle():
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=0.0,
                         node_jitter_ratio=0.0, node_idle_timeout_s=600.0)
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.scale_to(1)  # warming 0-100, serving 100-1000
    cluster.advance(1000.0)
    cluster.scale_to(0)  # idle node 1000-1600
    cluster.advance(2000.0)
    costs = cluster.finish()
    assert costs.warming_s == pytest.approx(100.0)
    assert costs.serving_s == pytest.approx(900.0)
    assert costs.idle_s == pytest.approx(600.0)
    assert costs.replica_gpu_hours == pytest.approx(1600.0 / 3600.0)


def test_shedding_and_guard_reject_only_what_they_should():
    workload = _poisson_workload(rate=50.0, service=1.0, span=300.0)
    workload.priority[:] = np.arange(len(workload.priority)) % 3  # critical, standard, sheddable
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)
    sim = RequestSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    t = 0.0
    while t < 300.0:
        sim.serve(t, t + 15.0, cluster, {"sheddable": 0.5}, Guard({"sheddable": 5, "standard": 10}, 10, 10.0))
        t += 15.0
    sim.finish(300.0)
    outcome = sim.outcome()
    assert outcome["shed_by_class"]["critical"] == 0.0
    assert 0.5 < outcome["shed_by_class"]["sheddable"] <= 1.0
    assert outcome["shed_by_class"]["standard"] > 0.0  # overloaded 5x: the guard must act


def _rate_workload(client_rates: np.ndarray, client_cv2: np.ndarray, window: float = 600.0, service: float = 1.0):
    windows = client_rates.shape[1]
    return RateWorkload(
        name="rate", scale=1.0, window_s=window, rate_per_s=client_rates.sum(axis=0), client_rate_per_s=client_rates,
        client_cv2=client_cv2, service_s=np.full(windows, service), output_tokens=np.zeros(windows),
        priority_mix=(0.2, 0.5, 0.3), span_s=windows * window,
    )


def test_tick_arrivals_keep_each_window_count_and_the_burstiness():
    """A steady client and a batchy one: every window holds exactly the trace's requests; the batchy
    client's ticks spread about its dispersion (mean x ca2), the steady one's hardly at all."""
    windows = 200
    tick = 15.0
    steady = _rate_workload(np.full((1, windows), 10.0), np.full((1, windows), 1e-6))
    batchy = _rate_workload(np.full((1, windows), 10.0), np.full((1, windows), 50.0))
    for workload, dispersion in ((steady, 0.0), (batchy, 50.0)):
        counts = tick_arrivals(workload, tick)
        per_window = counts.reshape(windows, -1).sum(axis=1)
        np.testing.assert_allclose(per_window, 10.0 * 600.0)
        mean = 10.0 * tick
        assert counts.var() / mean == pytest.approx(dispersion, abs=0.05 + 0.15 * dispersion)
    bursty = _rate_workload(np.full((1, windows), 10.0), np.full((1, windows), 1e9))  # capped at the count
    counts = tick_arrivals(bursty, tick)
    assert counts.max() <= 6000.0 + 1e-6  # never more than the window's requests
    assert counts.max() > 0.5 * 6000.0  # but most of a window can land in one tick


def test_thinning_makes_counts_less_dispersed():
    """Counts with index of dispersion 40 (negative binomial), each request kept with p = 0.1: the kept
    counts' dispersion is p x 40 + 1 - p, which `scaled_cv2` predicts."""
    rng = np.random.default_rng(3)
    mean, dispersion, p = 200.0, 40.0, 0.1
    r = mean / (dispersion - 1.0)
    counts = rng.negative_binomial(r, r / (r + mean), size=200000)
    kept = rng.binomial(counts, p)
    assert kept.var() / kept.mean() == pytest.approx(float(scaled_cv2(np.array([dispersion]), p)[0]), rel=0.03)
    assert scaled_cv2(np.array([dispersion]), 3.0)[0] == dispersion  # copies keep the dispersion


def test_rate_guard_drains_a_backlog_above_its_depth():
    """A backlog above the sheddable depth: sheddable arrivals are rejected until it drains to the depth,
    critical ones are always admitted, and the backlog falls (capacity exceeds the unguarded arrivals)."""
    n = 4
    workload = _rate_workload(np.full((1, n), 8.0), np.full((1, n), 1e-6), window=15.0)
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)  # 10 req/s
    sim = RateSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.backlog = 200.0
    sim.serve(0.0, 15.0, cluster, {}, Guard({"sheddable": 50, "standard": 400}, 10, 10.0))
    outcome = sim.outcome()
    assert outcome["shed_by_class"]["sheddable"] == pytest.approx(1.0)  # above 50 the whole tick
    assert outcome["shed_by_class"]["standard"] == 0.0 and outcome["shed_by_class"]["critical"] == 0.0
    assert sim.backlog == pytest.approx(200.0 + (8.0 * 0.7 - 10.0) * 15.0)


def test_rate_guard_holds_the_backlog_at_the_depths():
    """100 req/s (20 critical, 50 standard, 30 sheddable) against 60 req/s: the backlog rises to the
    sheddable depth (5), then, sheddable rejected, to the standard depth (10), where just enough standard
    is admitted to hold it (40 of 50 req/s). Critical is always admitted and waits 10/60 s."""
    workload = _rate_workload(np.full((1, 1), 100.0), np.full((1, 1), 1e-6), window=15.0)
    cluster = SimCluster.started(ClusterModel(), replicas=60, now=0.0)
    sim = RateSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.serve(0.0, 15.0, cluster, {}, Guard({"sheddable": 5, "standard": 10}, 60, 60.0))
    outcome = sim.outcome()
    assert sim.backlog == pytest.approx(10.0)
    assert outcome["shed_by_class"]["sheddable"] == pytest.approx((15.0 - 5 / 40) / 15.0)
    assert outcome["shed_by_class"]["standard"] == pytest.approx(0.2 * (15.0 - 5 / 40 - 5 / 10) / 15.0)
    assert outcome["shed_by_class"]["critical"] == 0.0
    assert outcome["slo_attainment"]["critical"] == pytest.approx(1.0)


def test_rate_guard_cannot_hold_what_critical_alone_overloads():
    """Critical alone (20 req/s) above capacity (10 req/s), with a decision that gives no drain (so no
    overrun rule): the guarded classes are rejected past their depth and the backlog keeps growing with the
    critical excess."""
    workload = _rate_workload(np.full((1, 1), 100.0), np.full((1, 1), 1e-6), window=15.0)
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)
    sim = RateSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.serve(0.0, 15.0, cluster, {}, Guard({"sheddable": 5, "standard": 5}, 10, 0.0))
    assert sim.backlog == pytest.approx(5.0 + 10.0 * (15.0 - 5 / 90))
    assert sim.outcome()["shed_by_class"]["sheddable"] == pytest.approx((15.0 - 5 / 90) / 15.0)


def test_rate_overrun_rejects_every_guarded_class_from_the_start():
    """The same tick with the decision's drain (10 req/s): critical alone outruns it, so every guarded
    class's depth is 0: both are rejected the whole tick and the backlog is critical's excess alone."""
    workload = _rate_workload(np.full((1, 1), 100.0), np.full((1, 1), 1e-6), window=15.0)
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)
    sim = RateSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.serve(0.0, 15.0, cluster, {}, Guard({"sheddable": 5, "standard": 5}, 10, 10.0))
    assert sim.backlog == pytest.approx((20.0 - 10.0) * 15.0)
    shed = sim.outcome()["shed_by_class"]
    assert shed["sheddable"] == pytest.approx(1.0) and shed["standard"] == pytest.approx(1.0)
    assert shed["critical"] == 0.0


def test_rate_overrun_leaves_a_drain_critical_does_not_outrun():
    """Critical at 20 req/s against a drain of 20.5 req/s: no overrun, the guard's depths as before (the
    backlog held at the standard depth, sheddable rejected past its own)."""
    workload = _rate_workload(np.full((1, 1), 100.0), np.full((1, 1), 1e-6), window=15.0)
    cluster = SimCluster.started(ClusterModel(), replicas=20, now=0.0)
    sim = RateSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.serve(0.0, 15.0, cluster, {}, Guard({"sheddable": 5, "standard": 10}, 20, 20.5))
    assert sim.backlog == pytest.approx(10.0)
    assert 0.0 < sim.outcome()["shed_by_class"]["standard"] < 1.0


def test_request_guard_carries_the_reading_through_a_burst():
    """300 requests within 0.1 s on 10 idle 1-s slots, probe read at the first of them (empty): the guard
    still stops the guarded classes after 10 (free slots) + their depth, as the admission endpoint does,
    instead of admitting the whole burst until the next reading."""
    n = 300
    arrivals = 0.1 + np.arange(n) * (0.1 / n)
    workload = RequestWorkload(
        name="burst", scale=1.0, arrival_s=arrivals, service_s=np.ones(n), output_tokens=np.ones(n),
        priority=(np.arange(n) % 3).astype(np.int8), uniform=np.ones(n), span_s=15.0,
    )
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)
    sim = RequestSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.serve(0.0, 15.0, cluster, {}, Guard({"sheddable": 5, "standard": 10}, 10, 10.0))
    admitted = ~sim.shed
    assert admitted[workload.priority == 0].all()  # critical
    assert admitted[workload.priority != 0].sum() <= 10 + 10
    assert admitted.sum() < 10 + 10 + 100 + 5


def _critical_then_standard(critical: int) -> tuple[RequestWorkload, RequestSim]:
    """`critical` then 20 standard requests within 10 ms on 10 idle 1-s slots (10 req/s completed), the
    standard class guarded from 10 queued; served for one tick."""
    n = critical + 20
    workload = RequestWorkload(
        name="overrun", scale=1.0, arrival_s=0.1 + np.arange(n) * (0.01 / n), service_s=np.ones(n),
        output_tokens=np.ones(n), priority=np.array([0] * critical + [1] * 20, dtype=np.int8), uniform=np.ones(n),
        span_s=15.0,
    )
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)
    sim = RequestSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
    sim.serve(0.0, 15.0, cluster, {}, Guard({"standard": 10}, 10, 10.0))
    return workload, sim


def test_request_overrun_rejects_the_guarded_class_while_a_request_waits():
    """11 critical requests within the second against 10 completed a second outrun the drain: with one of
    them queued, every standard request is rejected; 10 critical leave the guard as it was (standard
    admitted until 10 queue)."""
    workload, sim = _critical_then_standard(11)
    assert (~sim.shed[workload.priority == 0]).all()
    assert (~sim.shed[workload.priority == 1]).sum() == 0
    workload, sim = _critical_then_standard(10)
    assert (~sim.shed[workload.priority == 1]).sum() >= 10  # 10 queued, plus what the 10 ms drained


def test_guarded_tail_is_the_birth_death_chain_of_the_guard():
    """M/M/c (10 slots, 1-s service, 9 req/s: 2 critical, 4 standard guarded at 8, 3 sheddable at 4): the
    closed form equals the stationary distribution of the chain solved numerically; without depths it is
    Erlang C's geometric tail."""
    c, rates, depth = 10, np.array([2.0, 4.0, 3.0]), np.array([np.inf, 8.0, 4.0])
    n_max = 400
    birth = np.array([rates[max(0, n - c) < depth].sum() for n in range(n_max)])
    death = np.minimum(np.arange(1, n_max + 1), c).astype(float)
    weights = np.concatenate([[1.0], np.cumprod(birth / death)])
    pi = weights / weights.sum()
    tail = _guarded_tail(c_eff=erlang_c(c, 9.0), rho=0.9, rates=rates, depth=depth)
    for q in (0, 3, 4, 6, 8, 12):
        assert tail(q) == pytest.approx(pi[c + q:].sum(), rel=1e-9)
    plain = _guarded_tail(c_eff=erlang_c(c, 9.0), rho=0.9, rates=rates, depth=np.full(3, np.inf))
    assert plain(0) == pytest.approx(erlang_c(c, 9.0)) and plain(5) == pytest.approx(erlang_c(c, 9.0) * 0.9**5)


def test_arrival_seed_moves_the_draws_not_the_window_counts():
    workload = _rate_workload(np.full((2, 20), 5.0), np.full((2, 20), 30.0))
    a, b = tick_arrivals(workload, 15.0, seed=5), tick_arrivals(workload, 15.0, seed=6)
    assert not np.allclose(a, b)
    np.testing.assert_allclose(a.reshape(20, -1).sum(axis=1), b.reshape(20, -1).sum(axis=1))


def test_tick_arrivals_are_drawn_once_per_workload_tick_and_seed():
    """Every policy of a benchmark (every point of a frontier) replays the same draws: drawn once, read-only."""
    workload = _rate_workload(np.full((2, 20), 5.0), np.full((2, 20), 30.0))
    a = tick_arrivals(workload, 15.0, seed=5)
    assert tick_arrivals(workload, 15.0, seed=5) is a and not a.flags.writeable
    assert tick_arrivals(workload, 15.0, seed=6) is not a and tick_arrivals(workload, 30.0, seed=5) is not a
    twin = _rate_workload(np.full((2, 20), 5.0), np.full((2, 20), 30.0))  # equal, but another workload
    b = tick_arrivals(twin, 15.0, seed=5)
    assert b is not a
    np.testing.assert_array_equal(a, b)


def test_the_simulators_follow_the_policys_classes():
    """Classes come from the spec, not a fixed three: two classes with other names, in both simulators, and a
    rate workload whose mix changes window by window (as a recording's per-priority series do)."""
    classes = ("gold", "bronze")
    requests = _poisson_workload(rate=50.0, service=1.0, span=120.0)
    requests = RequestWorkload(**{**requests.__dict__, "classes": classes,
                                  "priority": (np.arange(len(requests.priority)) % 2).astype(np.int8)})
    cluster = SimCluster.started(ClusterModel(), replicas=10, now=0.0)
    sim = RequestSim(requests, concurrency=1, slo_s=2.0, tick_s=15.0)
    for i in range(8):
        sim.serve(i * 15.0, (i + 1) * 15.0, cluster, {"bronze": 1.0}, Guard({"gold": 0}, 10, 10.0))
    sim.finish(120.0)
    outcome = sim.outcome()
    assert set(outcome["slo_attainment"]) == set(classes)
    assert outcome["shed_by_class"]["bronze"] == 1.0 and outcome["shed_by_class"]["gold"] > 0.0
    assert sim.signals(60.0, cluster).arrival_rate_by_priority.keys() == set(classes)

    windows = 4
    mix = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    rates = RateWorkload(
        name="mixed", scale=1.0, window_s=60.0, rate_per_s=np.full(windows, 4.0),
        client_rate_per_s=np.full((1, windows), 4.0), client_cv2=np.full((1, windows), 1e-6),
        service_s=np.full(windows, 1.0), output_tokens=np.zeros(windows), priority_mix=mix,
        span_s=windows * 60.0, classes=classes,
    )
    sim = RateSim(rates, concurrency=1, slo_s=2.0, tick_s=15.0)
    cluster = SimCluster.started(ClusterModel(), replicas=20, now=0.0)
    for i in range(16):
        sim.serve(i * 15.0, (i + 1) * 15.0, cluster, {})
    assert sim.total == pytest.approx([480.0, 480.0])  # the windows alternate between the two classes


def test_a_node_limit_leaves_replicas_pending_without_cost_until_it_is_raised():
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=50.0, node_jitter_ratio=0.0,
                         node_limit=((0.0, 3), (1000.0, 10)))
    cluster = SimCluster.started(model, replicas=2, now=0.0)
    cluster.scale_to(5)
    state = cluster.state()
    assert (state.spec_replicas, state.ready_replicas, state.no_capacity_pods) == (5, 2, 2)
    cluster.warm_to(2)  # no room for warm capacity either
    assert cluster.state().warm_slots_ready == 0 and cluster.warm_slots == 0
    cluster.advance(500.0)
    cluster.scale_to(4)  # an unplaced replica goes first, and costs nothing
    assert cluster.state().no_capacity_pods == 1
    cluster.advance(1000.0)  # the limit is raised: the last one gets a node, then starts
    assert cluster.state().no_capacity_pods == 0
    assert cluster.ready(1000.0 + 149.0) == 3 and cluster.ready(1000.0 + 150.0) == 4
    cluster.advance(2000.0)
    costs = cluster.finish()
    # 3 replicas placed at 0 (one on a new node), 1 placed at 1000: billed from 1000 only, not while Pending
    assert costs.serving_s + costs.warming_s == pytest.approx(3 * 2000.0 + 1000.0)
    assert cluster.capacity_lags_s[-1] == pytest.approx(1150.0)  # ordered at 0, Ready at 1150


def _shape(gpus_per_replica: int, gpus_per_node: int, **kw) -> ClusterModel:
    """No jitter: start-up 100 s, provisioning 300 s, empty nodes removed after 600 s."""
    base = dict(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=300.0, node_jitter_ratio=0.0,
                node_idle_timeout_s=600.0, gpus_per_replica=gpus_per_replica, gpus_per_node=gpus_per_node)
    return ClusterModel(**{**base, **kw})


def test_two_4_gpu_replicas_share_one_8_gpu_node():
    """The second replica takes the free slot of the node the first one's scale-up requested: one node,
    both Ready at provisioning + start-up; 8 GPUs for 1000 s, where 4-GPU nodes cost two nodes."""
    cluster = SimCluster.started(_shape(4, 8), replicas=0, now=0.0)
    cluster.scale_to(2)
    assert [p.ready_s for p in cluster.pods] == [400.0, 400.0]
    assert len(cluster.nodes) == 1
    cluster.advance(1000.0)
    costs = cluster.finish()
    assert costs.node_hours == pytest.approx(1000.0 / 3600.0)
    assert costs.node_gpu_hours == pytest.approx(8 * 1000.0 / 3600.0)
    assert costs.replica_gpu_hours == pytest.approx(2 * 4 * 1000.0 / 3600.0)

    apart = SimCluster.started(_shape(4, 4), replicas=0, now=0.0)
    apart.scale_to(2)
    apart.advance(1000.0)
    assert apart.finish().node_gpu_hours == pytest.approx(2 * 4 * 1000.0 / 3600.0)


def test_scale_down_empties_the_least_used_node_which_goes_after_the_idle_timeout():
    """3 replicas on 2-slot nodes: 2 on node A, 1 on node B. Scaling to 2 at 100 s removes B's replica; B's
    two slots are idle (observed as idle slots) until B is removed at 100 + 600 s."""
    cluster = SimCluster.started(_shape(4, 8), replicas=3, now=0.0)
    a, b = cluster.nodes
    assert (len(a.pods), len(b.pods)) == (2, 1)
    cluster.advance(100.0)
    cluster.scale_to(2)
    assert (len(a.pods), len(b.pods)) == (2, 0)
    assert cluster.state().idle_slots == 2
    cluster.advance(699.0)
    assert len(cluster.nodes) == 2
    cluster.advance(700.0)
    assert cluster.nodes == [a] and cluster.state().idle_slots == 0
    cluster.advance(1000.0)
    costs = cluster.finish()
    assert costs.node_s == pytest.approx(1000.0 + 700.0)
    assert costs.idle_s == pytest.approx(2 * 600.0)  # B's two slots while B was empty
    assert costs.spare_s == pytest.approx(100.0)  # B's free slot while its replica ran
    assert costs.warming_s + costs.serving_s == pytest.approx(2 * 1000.0 + 100.0)


def test_idle_gpus_of_a_partly_used_node_and_the_gpus_no_replica_fits_are_paid_for():
    half = SimCluster.started(_shape(4, 8), replicas=1, now=0.0)
    half.advance(1000.0)
    costs = half.finish()
    assert costs.replica_gpu_hours == pytest.approx(4 * 1000.0 / 3600.0)
    assert costs.spare_s == pytest.approx(1000.0)
    assert costs.node_gpu_hours == pytest.approx(8 * 1000.0 / 3600.0)  # the other 4 GPUs idle, paid for

    odd = SimCluster.started(_shape(3, 8), replicas=2, now=0.0)  # 2 per node, 2 GPUs of each left over
    odd.advance(1000.0)
    costs = odd.finish()
    assert costs.replica_gpu_hours == pytest.approx(6 * 1000.0 / 3600.0)
    assert costs.node_gpu_hours == pytest.approx(8 * 1000.0 / 3600.0)

    alone = SimCluster.started(_shape(6, 8), replicas=1, now=0.0)  # one per node
    alone.advance(1000.0)
    costs = alone.finish()
    assert (costs.replica_gpu_hours, costs.node_gpu_hours) == pytest.approx((6000.0 / 3600.0, 8000.0 / 3600.0))


def test_a_new_replica_takes_a_free_slot_of_an_existing_node_after_start_up_only():
    cluster = SimCluster.started(_shape(4, 8), replicas=1, now=0.0)
    cluster.advance(50.0)
    assert cluster.state().idle_slots == 1
    cluster.scale_to(2)
    assert cluster.pods[-1].ready_s == pytest.approx(150.0)  # no provisioning
    assert len(cluster.nodes) == 1
    cluster.scale_to(3)  # a new node: provisioning, then start-up
    assert cluster.pods[-1].ready_s == pytest.approx(50.0 + 300.0 + 100.0)
    cluster.scale_to(4)  # the free slot of the node being provisioned: its arrival, then start-up
    assert cluster.pods[-1].ready_s == pytest.approx(450.0)
    assert len(cluster.nodes) == 2 and cluster.capacity_lags_s == pytest.approx([100.0, 400.0, 400.0])


def test_warm_slots_on_nodes_go_to_free_slots_first_and_are_taken_first():
    cluster = SimCluster.started(_shape(2, 8), replicas=3, now=0.0)  # 4 slots per node
    cluster.warm_to(2)  # one on the free slot of the first node, one on a new node
    state = cluster.state()
    assert (state.warm_slots_ready, state.idle_slots, cluster.warm_slots, len(cluster.nodes)) == (1, 0, 2, 2)
    cluster.advance(300.0)  # the second node arrives: its placeholder is ready, its other 3 slots idle
    assert (cluster.state().warm_slots_ready, cluster.state().idle_slots) == (2, 3)
    cluster.scale_to(4)  # a ready warm slot first
    assert cluster.pods[-1].ready_s == pytest.approx(400.0) and cluster.warm_slots == 1


def test_the_node_limit_counts_nodes():
    cluster = SimCluster.started(_shape(4, 8, node_limit=((0.0, 1), (500.0, 2))), replicas=2, now=0.0)
    cluster.scale_to(3)
    state = cluster.state()
    assert (state.spec_replicas, state.ready_replicas, state.no_capacity_pods) == (3, 2, 1)
    cluster.warm_to(1)
    assert cluster.warm_slots == 0
    cluster.advance(500.0)  # a second node: the pending replica is placed, then starts
    assert cluster.state().no_capacity_pods == 0 and len(cluster.nodes) == 2
    assert cluster.pods[-1].ready_s == pytest.approx(900.0) and cluster.capacity_lags_s == [900.0]


def test_with_one_replica_per_node_node_gpu_hours_equal_gpu_hours():
    model = ClusterModel(startup_s=100.0, startup_jitter_ratio=0.0, node_provisioning_s=0.0,
                         node_jitter_ratio=0.0, node_idle_timeout_s=600.0)
    cluster = SimCluster.started(model, replicas=0, now=0.0)
    cluster.scale_to(1)
    cluster.advance(1000.0)
    cluster.scale_to(0)
    cluster.advance(2000.0)
    costs = cluster.finish()
    assert costs.node_gpu_hours == costs.replica_gpu_hours == pytest.approx(1600.0 / 3600.0)
    assert costs.node_hours == costs.replica_gpu_hours


def test_a_placeholder_withdrawn_before_its_node_arrives_leaves_the_node_to_idle_out():
    """One replica per node. The node requested at 0 for a placeholder withdrawn at 100 is not cancelled: a
    replica ordered at 200 takes its slot, Ready at its arrival (300) + start-up; removed at once, it leaves
    the node empty from 200, removed 600 s later: billed 800 s, 100 of them warm pool and 700 idle."""
    cluster = SimCluster.started(_shape(1, 1), replicas=0, now=0.0)
    cluster.warm_to(1)
    cluster.advance(100.0)
    cluster.warm_to(0)
    assert len(cluster.nodes) == 1 and cluster.state().idle_slots == 0  # not arrived: no slot to offer yet
    cluster.advance(200.0)
    cluster.scale_to(1)
    assert cluster.pods[-1].ready_s == pytest.approx(400.0) and len(cluster.nodes) == 1
    cluster.scale_to(0)
    cluster.advance(1000.0)
    assert not cluster.nodes
    costs = cluster.finish()
    assert costs.node_s == pytest.approx(800.0)  # requested at 0, emptied again at 200, removed at 800
    assert costs.warm_pool_s == pytest.approx(100.0) and costs.warming_s == 0.0
    assert costs.idle_s == pytest.approx(100.0 + 600.0)


def test_the_warm_pools_churn_counts_placeholders_created_deleted_and_preempted():
    """A pool moving 2, 1, 2 creates 3 placeholders (the third on the node the second left) and deletes 1; a
    replica takes one (preempted) and the other is deleted; once its node idled out, a new placeholder needs a
    new node; the pool emptied when the run ends is not churn."""
    cluster = SimCluster.started(_shape(1, 1), replicas=1, now=0.0)
    for slots in (2, 1, 2):
        cluster.warm_to(slots)
    cluster.advance(400.0)
    cluster.scale_to(2)
    cluster.warm_to(0)
    cluster.advance(1100.0)  # its node idled out (600 s)
    cluster.warm_to(1)
    cluster.finish()
    assert astuple(cluster.warm_churn) == (4, 2, 1, 3)  # created, deleted, preempted, of the created on a new node


def test_a_slot_freed_before_its_node_arrives_takes_a_replica_on_the_nodes_arrival():
    """One replica per node: a replica ordered at 0 (node at 300) and removed at 50 leaves a slot on a node
    still being provisioned; a replica ordered at 100 takes it and is Ready at 300 + start-up, not 100 +
    start-up as if the node were there."""
    cluster = SimCluster.started(_shape(1, 1), replicas=0, now=0.0)
    cluster.scale_to(1)
    cluster.advance(50.0)
    cluster.scale_to(0)
    cluster.advance(100.0)
    cluster.scale_to(1)
    assert cluster.pods[-1].ready_s == pytest.approx(400.0) and len(cluster.nodes) == 1


def _advance(clusters, now: float) -> None:
    for c in clusters:
        c.advance(now)


def test_a_borrowed_idle_node_takes_a_replica_after_start_up_and_the_bill_is_the_one_pool_s():
    """One node pool over two clusters: a's node emptied at 50 is borrowed by b at 100, whose replica is Ready
    at 200 (start-up only, no node provisioning). b bills the node from its request, its idle time included,
    so a and b together bill exactly what one cluster doing both models' scaling bills."""
    a, b = (SimCluster.started(_shape(1, 1), replicas=n, now=0.0) for n in (2, 0))
    one = SimCluster.started(_shape(1, 1), replicas=2, now=0.0)
    _advance((a, b, one), 50.0)
    a.scale_to(1)
    one.scale_to(1)
    _advance((a, b, one), 100.0)
    assert b.ready_room() == 0
    assert b.borrow(a, warm=False) == 1 and b.borrow(a, warm=False) == 0  # a's other node holds a replica
    assert (a.ready_room(), b.ready_room(), len(a.nodes), len(b.nodes)) == (0, 1, 1, 1)
    b.scale_to(1)
    one.scale_to(2)
    assert b.pods[-1].ready_s == pytest.approx(200.0) == one.pods[-1].ready_s
    _advance((a, b, one), 1000.0)
    costs = [c.finish() for c in (a, b, one)]
    assert costs[1].idle_s == pytest.approx(50.0) and costs[1].node_s == pytest.approx(1000.0)
    for name in ("warming_s", "serving_s", "warm_pool_s", "idle_s", "spare_s", "node_s"):
        assert getattr(costs[0], name) + getattr(costs[1], name) == pytest.approx(getattr(costs[2], name)), name


def test_a_borrowed_placeholder_node_is_taken_by_the_borrower_s_replica_and_billed_to_it():
    """A placeholder's node is lent once it has arrived (300), not while it is provisioned; it moves with its
    placeholder, which the borrower's next replica preempts: Ready after start-up, warm time billed to b."""
    a, b = (SimCluster.started(_shape(1, 1), replicas=0, now=0.0) for _ in range(2))
    a.warm_to(1)
    _advance((a, b), 100.0)
    assert b.borrow(a, warm=True) == 0  # its node is still being provisioned
    _advance((a, b), 400.0)
    assert b.borrow(a, warm=False) == 0  # not empty: it holds a placeholder
    assert b.borrow(a, warm=True) == 1
    assert (a.warm_slots, b.warm_slots, b.state().warm_slots_ready) == (0, 1, 1)
    b.scale_to(1)
    assert b.pods[-1].ready_s == pytest.approx(500.0) and b.warm_slots == 0
    _advance((a, b), 1000.0)
    costs_a, costs_b = a.finish(), b.finish()
    assert costs_b.warm_pool_s == pytest.approx(400.0) and costs_b.node_s == pytest.approx(1000.0)
    assert costs_a.warm_pool_s == costs_a.node_s == 0.0


def test_a_borrowed_node_keeps_the_nodes_in_order_of_request():
    """b's own placeholder waits for a node requested at 1000; the node it borrows at 1100 was requested at 0.
    Kept in order of request, the placeholder still counts as not ready (appended last, the count of arrived
    slots would stop at the old node and call it ready)."""
    a, b = (SimCluster.started(_shape(1, 1), replicas=n, now=0.0) for n in (1, 0))
    _advance((a, b), 1000.0)
    a.scale_to(0)
    b.warm_to(1)
    _advance((a, b), 1100.0)
    assert b.borrow(a, warm=False) == 1
    state = b.state()
    assert (b.ready_room(), state.warm_slots_ready, state.idle_slots) == (1, 0, 1)


def test_borrowing_a_node_of_another_shape_is_an_error():
    a, b = SimCluster.started(_shape(4, 8), replicas=0, now=0.0), SimCluster.started(_shape(1, 1), replicas=0, now=0.0)
    with pytest.raises(ValueError, match="not of this cluster's shape"):
        b.borrow(a, warm=False)


@pytest.mark.parametrize("shape,words", [
    (dict(gpus_per_replica=0), "gpus_per_replica = 0"),
    (dict(gpus_per_node=0), "gpus_per_node = 0"),
    (dict(gpus_per_replica=1.5, gpus_per_node=8), "gpus_per_replica = 1.5"),
    (dict(gpus_per_replica=4, gpus_per_node=2), "gpus_per_replica = 4 is more than gpus_per_node = 2"),
])
def test_an_impossible_shape_is_a_clear_error(shape, words):
    with pytest.raises(ValueError, match=words):
        ClusterModel(**shape)


def test_a_tick_is_sized_for_its_busiest_bin_by_the_policys_rule():
    """Two 7.5-s bins per 15-s tick: 30 requests in the first bin and 6 in the second make the tick's rate
    4 req/s (30 / 7.5), not 2.4 (36 / 15); without bins it is the whole tick's. The replicas each tick needs
    are `replicas_for_rate` of that rate, as the policy sizes."""
    from autoscaler.sim.run import SimConfig, needed_replicas, sizing_spec
    from autoscaler.sim.ticks import tick_demand
    from policies.engine import replicas_for_rate

    arrivals = np.concatenate([np.linspace(0.0, 7.0, 30), np.linspace(8.0, 14.0, 6), [20.0]])
    n = len(arrivals)
    workload = RequestWorkload(
        name="bins", scale=1.0, arrival_s=arrivals, service_s=np.full(n, 3.0), output_tokens=np.ones(n),
        priority=np.zeros(n, dtype=np.int8), uniform=np.ones(n), span_s=30.0,
    )
    rates, services = tick_demand(workload, 15.0, bin_s=7.5)
    assert rates.tolist() == [4.0, 1 / 7.5] and services.tolist() == [3.0, 3.0]
    assert tick_demand(workload, 15.0)[0].tolist() == [36 / 15, 1 / 15]
    config = SimConfig(slo_s=7.5)
    assert needed_replicas(workload, config).tolist() == [
        max(1, replicas_for_rate(sizing_spec(config), round(r, 3), 3.0)) for r in rates]
