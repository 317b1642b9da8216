"""The service time through a silence (stage learn): the drain's long last completions, read as traffic stops,
size neither the outage hold, nor the capacity kept through the silence, nor the return; traffic that only
declines, or goes quiet on an on/off pattern, learns as before.

Timelines of `decide` at 15-s ticks: 100 req/s (20 % critical, 50 % standard) served in 1.0 s each, then the
traffic stops and the mean service time by completion reads the drain, the longest requests last (live, on
the closed loop's `silence`: 11.6 to 26.5 s for a 10.1-s mean)."""

import re

import pytest

from policies import PolicySpec, decide, initial_state
from policies.sizing import replicas_for_rate
from policies.stages import forecast as fc
from policies.stages.reactive import MEASURED_SERVICE_WEIGHT

from helpers import signals

TICK_S = 15.0
MIX = {"critical": 20.0, "standard": 50.0, "sheddable": 30.0}  # per-class rates of 100 req/s
STEADY = {"rate": 100.0, "service": 1.0, "by_priority": MIX, "spec_replicas": 16}
QUIET = {"rate": 0.0, "service": None, "by_priority": {}, "spec_replicas": 16}


def _run(spec, ticks):
    """(now, decision, state) of each tick of `ticks` (keyword arguments of `helpers.signals`)."""
    state, out = initial_state(), []
    for i, kw in enumerate(ticks):
        now = i * TICK_S
        decision, state = decide(spec, state, signals(now, **kw), now)
        out.append((now, decision, state))
    return out


def _sized_with(decision) -> float:
    """The service time the tick sized with, as the reactive reason prints it ("R req/s x S s")."""
    found = re.search(r"req/s x ([0-9.]+) s", " | ".join(decision.reasons))
    assert found, decision.reasons
    return float(found.group(1))


def _predictive(decision) -> int:
    """The replicas the predictive stage asked for, as its reason prints them."""
    found = re.search(r"predictive: (\d+) replicas", " | ".join(decision.reasons))
    assert found, decision.reasons
    return int(found.group(1))


def _folded(readings):
    """The service time learned without a silence: each reading folded in with the measured weight."""
    learned, out = None, []
    for r in readings:
        if r is not None:
            learned = r if learned is None else learned + MEASURED_SERVICE_WEIGHT * (r - learned)
        out.append(learned)
    return out


def test_the_memory_is_a_rate_window_and_a_tick():
    from policies.stages.learn import remembered_ticks

    assert remembered_ticks(PolicySpec(rate_window_s=60.0)) == 5  # 4 ticks of window, and one
    assert remembered_ticks(PolicySpec()) == 2  # a rate per tick (the simulator's)
    assert remembered_ticks(PolicySpec(rate_window_s=5.0)) == 2  # a window shorter than a tick is a tick's


# As traffic stops at t = 1200 s: with a 60-s rate window (live) the rate falls over the window and the drop
# is read once it is empty, the drain already in the readings; with a rate per tick (the simulator) the drop
# is read on the next tick, and the drain comes after it.
STOPS = {
    "windowed rate (live)": (60.0, [75.0, 50.0, 25.0, 0.0, 0.0, 0.0], [1.3, 1.7, 2.3, 2.6, 2.0, None]),
    "rate per tick (simulator)": (None, [0.0, 0.0, 0.0, 0.0], [1.05, 1.5, 2.6, None]),
}


@pytest.mark.parametrize("window_s, rates, readings", STOPS.values(), ids=list(STOPS))
def test_the_drains_long_readings_do_not_size_the_hold_the_kept_capacity_or_the_return(window_s, rates, readings):
    """Before the change the learned service time followed the drain (1.89 s live, 1.59 s in the simulator,
    for the 1.0 s learned before) and froze there through the silence: the hold sized the expected 100 req/s
    on it (up to 13 and 11 replicas instead of 7) and so was the kept capacity (9 and 8 instead of 5). Now it
    is 1.0 s from the drop to the return, where learning resumes from it. The ticks between the stop and the
    drop being read (the live rate's window) cannot know it yet: what they order on the drain's first
    readings is kept one stabilization window (here one lead time, 420 s: steady traffic), not the hold."""
    spec = PolicySpec(rate_window_s=window_s, outage_hold_s=900.0)
    steady = [STEADY] * 81  # to t = 1200 s
    stop = [{**QUIET, "rate": r, "service": s} for r, s in zip(rates, readings)]
    silence = [QUIET] * 120  # 30 minutes: the hold (15) and 15 past it
    back = [{**STEADY, "service": 0.8}]  # the first to complete are short ones
    timeline = _run(spec, steady + stop + silence + back)
    before = timeline[80][1]
    drop = next(i for i, (now, _, state) in enumerate(timeline) if state.forecast.interrupted_at_s == now)
    assert 81 <= drop <= 84
    quiet = timeline[drop:-1]
    assert {state.service_time_s for _, _, state in quiet} == {1.0}
    assert {_sized_with(decision) for _, decision, _ in quiet} == {1.0}
    assert any("learn: traffic stopped: service time 1.00 s" in line for line in timeline[drop][1].reasons)
    held = [(now, d) for now, d, state in quiet if fc.outage_held(spec, state.forecast, now)]
    assert held and _predictive(before) == before.replicas == 7
    for now, decision in held:  # the held forecast (100 req/s, a little less once the stop's ticks are bucketed)
        assert _predictive(decision) == replicas_for_rate(spec, decision.forecast_upper_rate_per_s, 1.0) <= 7
        assert decision.replicas <= 7 or now < timeline[drop][0] + 420.0
    kept = [(now, d, s) for now, d, s in quiet if any("silence: keeping capacity" in line for line in d.reasons)]
    assert len(kept) > 40 and all(not fc.outage_held(spec, s.forecast, now) for now, _, s in kept)
    for now, decision, state in kept:
        rate = fc.kept_through_silence(spec, state.forecast, now)
        assert rate is not None and rate == pytest.approx(70.0, rel=0.05)
        assert _predictive(decision) == replicas_for_rate(spec, rate, 1.0)
    _, _, returned = timeline[-1]
    assert returned.forecast.returned_at_s == timeline[-1][0]
    assert returned.service_time_s == pytest.approx(1.0 + MEASURED_SERVICE_WEIGHT * (0.8 - 1.0))


def test_a_slow_decline_learns_its_readings_as_before():
    """Demand that falls 2 % a tick for 50 minutes (100 -> 1.8 req/s) is followed by the model, never an
    implausible drop: every reading is learned, the long ones of a thinning traffic too."""
    spec = PolicySpec(outage_hold_s=300.0)
    n = 200
    readings = [1.0 + i / n for i in range(n)]
    ticks = [{**STEADY, "rate": 100.0 * 0.98 ** i, "service": r, "by_priority": {}} for i, r in enumerate(readings)]
    timeline = _run(spec, ticks)
    assert all(state.forecast.interrupted_at_s is None for _, _, state in timeline)
    assert [state.service_time_s for _, _, state in timeline] == _folded(readings)


def test_an_on_off_traces_quiet_ticks_learn_their_readings_as_before():
    """2 minutes on at 100 req/s, 1 minute off, for 90 minutes: the quiet ticks are routine in the model's
    recent ratios from its first level on (the forecaster takes none for an outage), so their readings, the
    long last completions of each burst, are learned as on any tick; weighting them by the rate would not."""
    spec = PolicySpec(outage_hold_s=300.0)
    cycle = [1.0] * 8 + [2.5, 3.0, None, None]
    readings = cycle * 30
    ticks = [{**STEADY, "rate": 100.0 if i % 12 < 8 else 0.0, "service": r, "by_priority": {}}
             for i, r in enumerate(readings)]
    timeline = _run(spec, ticks)
    assert all(state.forecast.interrupted_at_s is None for _, _, state in timeline)
    assert [state.service_time_s for _, _, state in timeline] == pytest.approx(_folded(readings))
