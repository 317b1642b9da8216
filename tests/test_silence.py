"""A silence that outlasts the outage hold: the capacity of the classes never shed is kept through it, and
when the traffic comes back the lower classes are guarded hard while the rest of the fleet comes."""

from dataclasses import replace

import pytest

from autoscaler.sim.workload import CLASSES, DEFAULT_MIX
from policies import PolicySpec
from policies.stages import forecast as fc
from policies.stages import predictive, shedding
from policies.stages.sanitize import sanitize
from policies.types import ForecastState, PolicyState, Tick

from helpers import signals

PROTECTED = 0.7  # the share of the classes never shed (critical, standard) before the silence


def _observed(spec, rates, *, fs=None, start=0.0, protected=PROTECTED):
    fs = fs or ForecastState()
    t = start
    for r in rates:
        fs = fc.observe(spec, fs, r, t, protected if r > 0 else None)
        t += 15.0
    return fs, t


def _tick(spec, fs, now, *, rate=0.0, queue=0.0, ready=1, decided=None, unplaceable=0, startup_s=120.0,
          node_s=300.0, slot_free=False, service_s=1.0, by_priority=None):
    """A tick at the shedding stage: `ready` replicas Ready of `decided` (default: 4 more on the way), of which
    `unplaceable` can get no node."""
    decided = ready + 4 if decided is None else decided
    sig = signals(now, rate=rate, queue=queue, service=service_s, spec_replicas=decided, ready=ready,
                  by_priority=by_priority)
    clean, _ = sanitize(spec, sig, None, now)
    return Tick(signals=sig, now=now, state=PolicyState(forecast=fs), clean=clean, service_s=service_s,
                replicas=decided,
                unplaceable=unplaceable, startup_s=startup_s, node_s=node_s,
                lead_s=startup_s + (0.0 if slot_free else node_s))


def test_through_a_silence_past_the_hold_the_protected_classes_keep_their_capacity_for_a_day_at_most():
    spec = PolicySpec(outage_hold_s=300.0)
    fs, now = _observed(spec, [100.0] * 80)
    fs, now = _observed(spec, [0.0] * 120, fs=fs, start=now)  # 30 min: the hold is long over, zeros learned
    assert fc.point(fs, 1) < 10.0 and fs.interrupted_protected_ratio == PROTECTED
    kept = predictive.stage(spec, _tick(spec, fs, now))
    assert kept.predicted is not None and kept.predicted[1] == pytest.approx(PROTECTED * fs.interrupted_per_s)
    assert any("keeping capacity for the" in line and "classes never shed" in line for line in kept.reasons)
    assert fc.kept_through_silence(spec, fs, fs.interrupted_at_s + spec.season_s) is None  # a day: let go
    unknown = predictive.stage(spec, _tick(spec, replace(fs, interrupted_protected_ratio=None), now))
    assert unknown.predicted[1] < 10.0  # no class mix measured: nothing to keep


def test_a_cold_return_guards_the_lower_classes_hard_a_short_one_does_not():
    spec = PolicySpec(outage_hold_s=300.0)
    fs, now = _observed(spec, [100.0] * 80)
    quiet, back_s = _observed(spec, [0.0] * 120, fs=fs, start=now)
    cold = fc.observe(spec, quiet, 90.0, back_s, PROTECTED)
    tick = _tick(spec, cold, back_s, rate=90.0, queue=50.0, ready=10)
    guarded = shedding.stage(spec, tick)
    assert guarded.saturation_depths and set(guarded.saturation_depths.values()) == {1}
    assert any("guarded at a queue of 1" in line for line in guarded.reasons)
    later = shedding.stage(spec, _tick(spec, cold, back_s + 420.0, rate=90.0, queue=50.0, ready=10))
    assert min(later.saturation_depths.values()) > 1  # a start-up and a node's provisioning on: the usual guard
    short, back_s = _observed(spec, [0.0] * 10, fs=fs, start=now)  # within the hold: capacity was kept
    short = fc.observe(spec, short, 90.0, back_s, PROTECTED)
    assert fc.returning(short, back_s, 420.0) is not None and not fc.returning_cold(spec, short, back_s, 420.0)
    assert min(shedding.stage(spec, _tick(spec, short, back_s, rate=90.0, queue=50.0, ready=10))
               .saturation_depths.values()) > 1


def test_the_protected_share_is_learned_only_from_per_class_rates():
    from policies.stages.learn import _protected

    spec = PolicySpec()
    assert _protected(spec, {}) is None and _protected(spec, {"critical": 0.0, "standard": 0.0}) is None
    assert _protected(spec, {"critical": 2.0, "standard": 5.0, "sheddable": 3.0}) == pytest.approx(0.7)


def test_the_hard_guard_lasts_until_the_replicas_ordered_at_the_return_are_ready_not_one_lead_time_of_each_tick():
    """Live (closed loop `silence`, run 2): 4 Ready at the return, 7 decided, lead time 550 s (140 s start-up
    + 410 s for a node). 6.2 minutes on the warm pool's placeholders were Ready, the lead time fell to 140 s,
    and the guard, lasting one lead time of each tick, ended 1.1 and 2.5 minutes before the ordered replicas
    were Ready: a critical request waited 3.02 s behind standard ones. Before, `later` below was not guarded."""
    spec = PolicySpec(outage_hold_s=300.0)
    fs, now = _observed(spec, [100.0] * 80)
    quiet, back_s = _observed(spec, [0.0] * 120, fs=fs, start=now)
    cold = fc.observe(spec, quiet, 90.0, back_s, PROTECTED)
    times = {"startup_s": 140.0, "node_s": 410.0}

    def at(after_s, *, ready, slot_free=False, decided=7, unplaceable=0):
        tick = _tick(spec, cold, back_s + after_s, rate=90.0, queue=50.0, ready=ready, decided=decided,
                     unplaceable=unplaceable, slot_free=slot_free, **times)
        return set(shedding.stage(spec, tick).saturation_depths.values()) == {1}

    assert at(0.0, ready=4)  # the return: 3 replicas on the way, lead time 550 s
    later = at(372.0, ready=4, slot_free=True)  # placeholders Ready: the tick's lead time is 140 s
    assert later and at(480.0, ready=6, slot_free=True)  # still 1 of the 7 to come
    assert not at(522.0, ready=7, slot_free=True)  # all 7 Ready: the usual guard
    assert not at(555.0, ready=4)  # never Ready: at most a start-up plus a node's provisioning (550 s)
    assert not at(30.0, ready=7, decided=7)  # nothing on the way: the usual guard from the start
    assert not at(480.0, ready=6, unplaceable=1)  # the last one can get no node: not on the way


def _mix(rate):
    """`rate` split over the classes in the benchmark's shares (20 % critical, 50 % standard, 30 % sheddable)."""
    return {c: share * rate for c, share in zip(CLASSES, DEFAULT_MIX)}


def test_behind_per_replica_queues_the_hard_guard_keeps_a_slot_for_the_highest_class():
    """Live (closed loop `silence`, runs 11 and 12): at a queue of 0 the lower classes took the last of the 32
    Ready slots and the next critical request waited 2.7 and 3.4 s for its server's next completion. At 90
    req/s of 1 s on 160 slots the reserve's own sizing keeps none."""
    fs, now = _observed(PolicySpec(outage_hold_s=300.0), [100.0] * 80)
    for queues in ("per-replica", "shared"):
        spec = PolicySpec(outage_hold_s=300.0, gateway_queues=queues)
        quiet, back_s = _observed(spec, [0.0] * 120, fs=fs, start=now)
        cold = fc.observe(spec, quiet, 90.0, back_s, PROTECTED)
        guarded = shedding.stage(spec, _tick(spec, cold, back_s, rate=90.0, ready=10, by_priority=_mix(90.0)))
        settled = shedding.stage(spec, _tick(spec, cold, back_s + 420.0, rate=90.0, ready=10,
                                             by_priority=_mix(90.0)))
        assert settled.saturation_reserve == 0  # the guard over: the reserve's own sizing, none at this load
        kept = [line for line in guarded.reasons if "kept for critical while the guard is hard" in line]
        if queues == "shared":  # a request that finds every slot busy waits for any slot's completion
            assert guarded.saturation_reserve == 0 and not kept
        else:
            assert guarded.saturation_reserve == 1 and kept == [
                "shedding: 1 of 160 Ready slots kept for critical while the guard is hard: behind per-replica "
                "gateway queues a critical request that finds every slot busy waits for its server's next "
                "completion; the guarded classes rejected while 159 are busy"]
    spec = PolicySpec(outage_hold_s=300.0, gateway_queues="per-replica", replica_concurrency=8)
    quiet, back_s = _observed(spec, [0.0] * 120, fs=fs, start=now)
    cold = fc.observe(spec, quiet, 90.0, back_s, PROTECTED)
    for rate, sized in ((2.5, 1), (4.0, 2)):  # 4 Ready of 8 slots, 9-s requests: the sizing keeps slots itself
        at = _tick(spec, cold, back_s, rate=rate, ready=4, service_s=9.0, by_priority=_mix(rate))
        loaded = shedding.stage(spec, at)
        assert loaded.saturation_reserve == sized  # the sizing's own reserve (and reason), not the floor's
        assert any(f"{sized} of 32 Ready slots kept for critical (" in line for line in loaded.reasons)
        assert not any("while the guard is hard" in line for line in loaded.reasons)
    assert shedding.stage(spec, _tick(spec, cold, back_s, rate=90.0, ready=0)).saturation_reserve == 0
    assert shedding.hard_guard_reserve(PolicySpec(gateway_queues="per-replica", replica_concurrency=3), 0) == (0, [])


def test_a_hard_guard_that_starts_after_the_return_lasts_from_its_own_start():
    """Live (closed loop `silence`, run 15, sized per replica): the return met 5 Ready replicas, enough until the
    windowed rate showed the level, so 8 were decided and the guard started 98 s after the return; bounded
    from the return, it ended after 450 s, 184 s before the 8 were Ready (732 s after the return), short of
    the lead time (540-550 s) that the replicas it waited for were ordered with."""
    spec = PolicySpec(outage_hold_s=300.0)
    fs, now = _observed(spec, [100.0] * 80)
    quiet, back_s = _observed(spec, [0.0] * 120, fs=fs, start=now)
    cold = fc.observe(spec, quiet, 90.0, back_s, PROTECTED)
    times = {"startup_s": 140.0, "node_s": 410.0}  # 550 s

    def at(after_s, state):
        tick = _tick(spec, cold, back_s + after_s, rate=90.0, ready=5, decided=8, **times)
        tick = replace(tick, state=replace(state, forecast=cold))
        out = shedding.stage(spec, tick)
        return set(out.saturation_depths.values()) == {1}, out.state

    on, state = at(98.0, PolicyState())
    assert on and state.hard_guard_since_s == back_s + 98.0
    assert at(600.0, state)[0]  # 502 s from its start: still on (from the return it had ended at 550 s)
    assert at(98.0 + 549.9, state)[0] and not at(98.0 + 550.0, state)[0]  # at most a start-up plus a node's
    assert not at(650.0, state)[0]  # provisioning from its start
    assert not at(600.0, PolicyState())[0]  # not started within 550 s of the return: never starts
    earlier = replace(state, hard_guard_since_s=back_s - 3600.0)  # an earlier return's guard
    assert not at(600.0, earlier)[0] and at(98.0, earlier)[1].hard_guard_since_s == back_s + 98.0
