"""A held rise that still climbs is sized for the rate it reaches when capacity ordered now serves
(forecast.rise_ahead); a level shift, a ramp's end and a tick's spike add no growth.

The rates are the fleet drill's ticks (1.5-s ticks, a 6-s window, a 14-s start-up, as tests/test_held_rise.py):
steady at 11 req/s with a small fixed jitter, then the shape under test from tick 120."""

import pytest

from policies.engine import decide, initial_state
from policies.stages import forecast as fc
from policies.types import ForecastState

from helpers import signals
from test_held_rise import SPEC, STARTUP_S, TICK_S, _live_rates

LEAD_S = STARTUP_S  # a free slot: a replica ordered now serves after its start-up
JITTER = (0.4, -0.3, 0.1, -0.5, 0.3, 0.0, -0.2, 0.5, -0.1, 0.2)
START = 120


def _rates(after, ticks: int = 200) -> list[float]:
    return [11.0 + JITTER[k % len(JITTER)] + (after(k - START) if k >= START else 0.0) for k in range(ticks)]


def _ramp(k: int) -> float:
    return 1.0 * k  # +1 req/s a tick, on and on


def _first_held(rates: list[float]) -> tuple[ForecastState, float, float]:
    """The forecaster's state, the time and the held level at the first tick a rise held."""
    fs = ForecastState()
    for k, r in enumerate(rates):
        now = (k + 1) * TICK_S
        fs = fc.observe(SPEC, fs, r, now)
        held = fc.held_rise(SPEC, fs, STARTUP_S)
        if held is not None:
            return fs, now, held[0]
    raise AssertionError("no rise held")


def test_a_rise_that_still_climbs_is_sized_where_it_will_be_when_capacity_serves():
    rates = _rates(_ramp)
    fs, now, held = _first_held(rates)
    ahead = fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=LEAD_S)
    assert ahead is not None
    reached, why = ahead
    k_now = round(now / TICK_S) - 1
    truth = rates[k_now] + LEAD_S / TICK_S  # the ramp's rate one lead time on
    # above the held level (the hold's mean, a few ticks behind) and the rate now; not above the truth:
    # the slope counts one standard error below its estimate
    assert held < rates[k_now] < reached <= truth
    # most of the lag's growth is in it (65 %: the rest is the slope's one standard error)
    assert reached - rates[k_now] > 0.5 * (truth - rates[k_now])
    assert "when capacity ordered now serves" in why and "scale-down window" in why


def test_a_line_is_not_carried_further_ahead_than_it_was_seen():
    fs, _, _ = _first_held(_rates(_ramp))
    near = fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=6.0)
    far = fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=600.0)
    capped = fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=60.0)
    assert near is not None and far is not None and capped is not None
    assert near[0] < far[0] == capped[0]  # the hold spans 9 ticks (13.5 s): 60 s and 600 s both stop there


@pytest.mark.parametrize("shape", [
    lambda k: 11.0,  # a level shift (a doubling at once)
    lambda k: min(11.0, k * 11.0 / 3),  # a short ramp that ended before the hold did
])
def test_a_level_shift_or_a_ramps_end_adds_no_growth(shape):
    fs, _, _ = _first_held(_rates(shape))
    assert fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=LEAD_S) is None
    for k in range(1, 20):  # nor on any later tick of the plateau
        fs = fc.observe(SPEC, fs, 22.0 + JITTER[k % len(JITTER)], (START + 60 + k) * TICK_S)
        if fc.held_rise(SPEC, fs, STARTUP_S) is not None:
            assert fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=LEAD_S) is None


def test_one_ticks_spike_on_a_plateau_does_not_tilt_the_slope():
    rates = _rates(lambda k: 11.0, ticks=START + 20)
    rates[-1] += 15.0  # the hold's last tick
    fs = ForecastState()
    for k, r in enumerate(rates):
        fs = fc.observe(SPEC, fs, r, (k + 1) * TICK_S)
    assert fc.held_rise(SPEC, fs, STARTUP_S) is not None
    assert fc.rise_ahead(SPEC, fs, startup_s=STARTUP_S, ahead_s=LEAD_S) is None


def test_through_decide_the_upper_bound_is_the_rate_the_lag_will_see():
    """On a live-like noisy ramp (11 to 44 req/s over 90 s, seed 1), the tick the rise is carried ahead the
    decision sizes for where it will be one lead time on, above the level it held, and says so."""
    rates = _live_rates(1, lambda t: 11.0 + 33.0 * min(1.0, max(0.0, (t - 180.0) / 90.0)), 200)
    state = initial_state()
    for k, r in enumerate(rates):
        now = (k + 1) * TICK_S
        decision, state = decide(SPEC, state, signals(now, rate=r, service=1.0, spec_replicas=4), now)
        if any("when capacity ordered now serves" in line for line in decision.reasons):
            break
    else:
        raise AssertionError("the rise was never carried ahead")
    why = " ".join(decision.reasons)
    held = float(why.split("demand rose to ")[1].split(" req/s")[0])
    reached = float(why.split("sized for the ")[1].split(" req/s")[0])
    assert held < reached
    assert decision.forecast_upper_rate_per_s is not None and decision.forecast_upper_rate_per_s >= reached
    assert f"upper bound raised to the {reached:.1f} req/s the rise holds at +" in why
