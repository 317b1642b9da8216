"""The rate simulator's queue reading is bounded by what arrived, however close the load is to the slots.

Near saturation the stationary M/M/c mean queue C a / (c - a) has no bound (c - a ~ 1e-15 once gave a
queue of 3.9e15 requests and an order of 6e14 replicas); the reading the policy sees must never hold
more requests than the previous reading plus the tick's admitted arrivals, nor than ever arrived."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.rate import RateSim
from autoscaler.sim.workload import RateWorkload

TICK_S = 15.0


def _steady(rates: list[float], service: float) -> RateWorkload:
    """One steady client whose rate may change every tick."""
    ticks = len(rates)
    return RateWorkload(
        name="steady", scale=1.0, window_s=TICK_S, rate_per_s=np.array(rates),
        client_rate_per_s=np.array([rates]), client_cv2=np.full((1, ticks), 1e-6),
        service_s=np.full(ticks, service), output_tokens=np.zeros(ticks), priority_mix=(0.2, 0.5, 0.3),
        span_s=ticks * TICK_S,
    )


# Loads as a fraction of the ready slots: anywhere, and within a few ulps under and over saturation.
loads = st.one_of(
    st.floats(min_value=0.0, max_value=3.0),
    st.sampled_from([1.0 - 2.0**-52, 1.0 - 2.0**-50, 1.0 - 1e-12, 1.0, 1.0 + 1e-12]),
)
depths = st.one_of(
    st.none(),
    st.fixed_dictionaries({"sheddable": st.integers(0, 10_000), "standard": st.integers(0, 10_000)}),
)


@settings(max_examples=200, deadline=None)
@given(
    load_by_tick=st.lists(loads, min_size=1, max_size=5),
    replicas=st.integers(min_value=0, max_value=200),
    concurrency=st.integers(min_value=1, max_value=32),
    service_s=st.floats(min_value=1e-3, max_value=600.0),
    depth=depths,
    backlog=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1e4)),
)
def test_the_queue_reading_never_exceeds_what_arrived(load_by_tick, replicas, concurrency, service_s, depth, backlog):
    slots = replicas * concurrency
    rates = [load * max(slots, 1) / service_s for load in load_by_tick]
    sim = RateSim(_steady(rates, service_s), concurrency=concurrency, slo_s=2.0, tick_s=TICK_S)
    sim.backlog = backlog
    cluster = SimCluster.started(ClusterModel(), replicas=replicas, now=0.0)
    guard = Guard(depth, slots, slots / service_s) if depth is not None else None
    arrived = backlog  # everything ever queued: the backlog the test starts with and every admitted arrival
    for i in range(len(rates)):
        start = max(sim.last[0], sim.backlog)
        before = float(sim.total.sum() - sim.shed.sum())
        sim.serve(i * TICK_S, (i + 1) * TICK_S, cluster, {}, guard)
        admitted = float(sim.total.sum() - sim.shed.sum()) - before
        arrived += admitted
        reading = sim.last[0]
        assert math.isfinite(reading) and reading >= 0.0
        assert reading <= start + admitted + 1e-9 * (1.0 + start + admitted), (reading, start, admitted)
        assert reading <= arrived * (1.0 + 1e-9) + 1e-9


def test_a_hair_under_saturation_reads_a_queue_of_at_most_one_tick_of_arrivals():
    """The case seen on a 14-day trace: an overloaded tick, then admitted load a hair under the ready slots
    (the waiting probability is still ~1 and c - a ~ 1e-13)."""
    slots, service_s = 640, 2.0
    full, hair = slots / service_s, slots * (1.0 - 2.0**-45) / service_s
    sim = RateSim(_steady([full * 1.1, hair], service_s), concurrency=16, slo_s=2.0, tick_s=TICK_S)
    cluster = SimCluster.started(ClusterModel(), replicas=slots // 16, now=0.0)
    sim.serve(0.0, TICK_S, cluster, {})
    backlog = sim.backlog
    sim.serve(TICK_S, 2 * TICK_S, cluster, {})
    assert sim.last[0] <= backlog + hair * TICK_S * (1.0 + 1e-9)
