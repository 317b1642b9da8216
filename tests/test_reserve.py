"""Slots kept for the top class behind per-replica gateway queues (`policies/reserve.py`): the chain, its
sizing against the event simulation of least connections, the shedding stage, the admission endpoint at its
clock seam and both simulators. The live check is the closed-loop `fleet` scenario (docs/closed-loop.md)."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.admission import Admission
from autoscaler.clock import ManualClock
from autoscaler.signals.queueprobe import QueueReading
from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.rate import RateSim
from autoscaler.sim.request import RequestSim
from autoscaler.sim.workload import RateWorkload, RequestWorkload
from loadtest import queuebalance
from policies import Decision, PolicySpec, decide, initial_state
from policies.admission import reserve_rejects
from policies.reserve import reserve_slots, top_waits
from policies.stages.sanitize import sanitize
from policies.stages.shedding import top_reserve

from helpers import endpoint_serving, signals

# The fleet drill's chat at factor 10: 4 Ready replicas of 8 slots, 1-s requests, a 0.2-s objective
CHAT = dict(slots=32, server_slots=8, service_s=1.0, wait_s=0.2, miss=0.001, max_reserve=8)


@pytest.mark.parametrize("reserve", [1, 2, 5])
def test_the_closed_form_is_the_chain_solved_numerically(reserve):
    """Births a below c - r, a_top from there; deaths min(n, c): P(n >= c - r) and P(n >= c) from the
    stationary distribution solved on 600 states."""
    c, a, a_top = 32, 22.0, 4.4
    n = np.arange(600)
    birth = np.where(n < c - reserve, a, a_top)
    death = np.minimum(n + 1, c).astype(float)
    pi = np.concatenate([[1.0], np.cumprod(birth / death)])
    pi /= pi.sum()
    rejected, busy = top_waits(slots=c, reserve=reserve, offered=a, top_offered=a_top)
    assert rejected == pytest.approx(pi[c - reserve:].sum(), rel=1e-9)
    assert busy == pytest.approx(pi[c:].sum(), rel=1e-9)


def test_no_reserve_at_light_load_more_as_the_load_nears_the_slots():
    reserves = [reserve_slots(rate_per_s=rate, top_rate_per_s=0.2 * rate, **CHAT) for rate in (12, 18, 22, 26, 29)]
    assert reserves[0] == reserves[1] == 0
    assert reserves == sorted(reserves) and reserves[2] >= 1
    assert reserve_slots(rate_per_s=22.0, top_rate_per_s=0.0, **CHAT) == 0  # no top class: nothing to keep
    assert reserve_slots(rate_per_s=40.0, top_rate_per_s=8.0, **{**CHAT, "max_reserve": 3}) == 3  # at most


def test_the_reserve_sized_holds_the_top_class_in_the_event_simulation_of_least_connections():
    """At 22 req/s (20 % critical) the sizing asks for one slot: in the event simulation of nginx's least
    connections over 4 servers of 8 slots, critical waits past the objective about ten times less often than
    without it, within the target, and the lower classes are rejected about as often as the chain says."""
    reserve = reserve_slots(rate_per_s=22.0, top_rate_per_s=4.4, **CHAT)
    assert reserve == 1
    common = dict(rate_per_s=22.0, servers=4, slots=8, service_s=1.0, slo_s=0.2, requests=100_000, seed=2)
    late, _ = queuebalance.outcomes(**common)
    kept_late, kept_rejected = queuebalance.outcomes(reserve=reserve, **common)
    assert late["critical"] > 0.003 and kept_late["critical"] < 0.0015
    rejected, _ = top_waits(slots=32, reserve=reserve, offered=22.0, top_offered=4.4)
    assert kept_rejected["standard"] == pytest.approx(rejected, rel=0.35)


RATES = {"critical": 4.4, "standard": 11.0, "sheddable": 6.6}


def test_the_shedding_stage_keeps_slots_only_behind_per_replica_queues():
    shared = PolicySpec(replica_concurrency=8, slo_queue_wait_s=0.2, tick_s=1.5)
    per_replica = shared.model_copy(update={"gateway_queues": "per-replica"})
    sig = signals(0.0, rate=22.0, service=1.0, spec_replicas=4, by_priority=RATES)
    clean, _ = sanitize(per_replica, sig, None, 0.0)
    depths = {"standard": 5, "sheddable": 3}
    reserve, why = top_reserve(per_replica, clean, 1.0, {}, depths)
    assert reserve == 1 and "1 of 32 Ready slots kept for critical" in why[0]
    assert top_reserve(shared, clean, 1.0, {}, depths) == (0, [])
    assert top_reserve(per_replica, clean, 1.0, {}, {}) == (0, [])  # nothing guarded: nothing to reject
    # what is shed is not admitted: sheddable shed whole leaves 15.4 req/s, within the slots without a reserve
    assert top_reserve(per_replica, clean, 1.0, {"sheddable": 1.0}, depths)[0] == 0


def test_the_decision_carries_the_reserve():
    spec = PolicySpec(replica_concurrency=8, slo_queue_wait_s=0.2, tick_s=1.5, gateway_queues="per-replica",
                      initial_service_time_s=1.0, min_replicas=4)
    decision, _ = decide(spec, initial_state(), signals(0.0, rate=22.0, service=1.0, spec_replicas=4,
                                                        by_priority=RATES), 0.0)
    assert decision.valid and decision.saturation_slots == 32 and decision.saturation_reserve >= 1
    assert any("slots kept for critical" in r for r in decision.reasons)
    shared, _ = decide(spec.model_copy(update={"gateway_queues": "shared"}), initial_state(),
                       signals(0.0, rate=22.0, service=1.0, spec_replicas=4, by_priority=RATES), 0.0)
    assert shared.saturation_reserve == 0


# The endpoint at its clock seam: 4 Ready replicas of 8 slots completing 32 req/s, 2 slots kept for critical
SERVING = Decision(replicas=4, saturation_slots=32, saturation_drain_per_s=32.0, saturation_reserve=2,
                   saturation_queue_depth={"sheddable": 3, "standard": 5})


def _endpoint(reading: list) -> tuple[ManualClock, Admission]:
    return endpoint_serving(SERVING, reading)


def test_the_endpoint_rejects_the_guarded_classes_in_the_kept_slots():
    assert reserve_rejects(busy=30.0, slots=32, reserve=2) and not reserve_rejects(busy=29.5, slots=32, reserve=2)
    assert not reserve_rejects(busy=None, slots=32, reserve=2) and not reserve_rejects(busy=31.0, slots=32, reserve=0)
    reading = [QueueReading(queue=0.0, in_flight=29.0, at=100.0)]
    clock, admission = _endpoint(reading)
    assert admission.rejection("standard") is None  # 29 busy: the 30th slot is not kept
    reason = admission.rejection("sheddable")  # 30 busy (29 + the one just admitted): the last 2 are kept
    assert reason is not None and reason.startswith("keeping 2 of 32 slots for the top class: 30 busy")
    assert admission.rejection("critical") is None
    clock.t += 0.1  # 3.2 completed since the reading: 31 - 3.2 busy
    assert admission.rejection("standard") is None


def test_the_endpoint_without_an_in_flight_reading_rejects_nothing_by_the_reserve():
    _, admission = _endpoint([QueueReading(queue=0.0, in_flight=None, at=100.0)])
    assert all(admission.rejection("sheddable") is None for _ in range(3))  # fail open (the depths still apply)


def test_the_request_simulator_keeps_the_slots_as_the_endpoint_does():
    """20 standard and 5 critical requests within 10 ms on 10 idle 1-s slots, standard guarded from 10 queued:
    with 2 slots kept, standard takes 8, critical every one; without, standard fills the slots and queues.
    (The decision's drain here is 0, so the carried reading counts no completion within the 10 ms.)"""
    n = 25
    workload = RequestWorkload(
        name="reserve", scale=1.0, arrival_s=0.1 + np.arange(n) * (0.01 / n), service_s=np.ones(n),
        output_tokens=np.ones(n), priority=np.array([1] * 20 + [0] * 5, dtype=np.int8), uniform=np.ones(n),
        span_s=15.0,
    )
    admitted = {}
    for reserve in (0, 2):
        sim = RequestSim(workload, concurrency=1, slo_s=2.0, tick_s=15.0)
        sim.serve(0.0, 15.0, SimCluster.started(ClusterModel(), replicas=10, now=0.0), {},
                  Guard({"standard": 10}, 10, 0.0, reserve))
        admitted[reserve] = ~sim.shed
    assert admitted[2][workload.priority == 1].sum() == 8 and admitted[2][workload.priority == 0].all()
    assert admitted[0][workload.priority == 1].sum() >= 18


def test_the_rate_simulator_counts_what_the_kept_slots_cost_the_guarded_classes():
    """One tick at 22 req/s on 32 1-s slots: with 2 slots kept the guarded classes are rejected while 30 are
    busy (a few percent), critical never."""
    window = 15.0
    workload = RateWorkload(
        name="rate", scale=1.0, window_s=window, rate_per_s=np.array([22.0]), client_rate_per_s=np.full((1, 1), 22.0),
        client_cv2=np.full((1, 1), 1e-6), service_s=np.ones(1), output_tokens=np.zeros(1),
        priority_mix=(0.2, 0.5, 0.3), span_s=window,
    )
    shed = {}
    for reserve in (0, 2):
        sim = RateSim(workload, concurrency=8, slo_s=0.2, tick_s=15.0)
        sim.c_eff = 0.031  # Erlang C(32, 22), as a steady tick has it
        sim.serve(0.0, 15.0, SimCluster.started(ClusterModel(), replicas=4, now=0.0), {},
                  Guard({"sheddable": 3, "standard": 5}, 32, 32.0, reserve))
        shed[reserve] = sim.outcome()["shed_by_class"]
    assert shed[2]["critical"] == 0.0
    assert 0.01 < shed[2]["standard"] < 0.2 and shed[2]["standard"] > 2 * shed[0]["standard"]


def test_a_request_released_from_a_hold_is_not_rejected_by_the_reserve():
    """The release paced it to the room the Ready replicas have: it is answered by the depths, not the reserve."""
    _, admission = _endpoint([QueueReading(queue=0.0, in_flight=31.0, at=100.0)])
    assert admission.rejection("standard") is not None
    assert admission.rejection("standard", released=True) is None
