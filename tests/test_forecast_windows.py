"""The burst envelope's windows kept sorted tick by tick hold, at every index, the float `sorted` gives."""

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicySpec
from policies.stages import forecast
from policies.types import ForecastState

# Few distinct values, signed zeros among them: equal values are where an order could differ.
_VALUES = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.5, 50.0]), st.floats(0.0, 100.0, allow_nan=False))


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Equal float for float, the sign of a zero included."""
    return len(a) == len(b) and all(x == y and math.copysign(1.0, x) == math.copysign(1.0, y) for x, y in zip(a, b))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_VALUES, max_size=60), kept=st.integers(1, 12))
def test_the_slid_window_is_the_sorted_window_at_every_step(values, kept):
    window: tuple[float, ...] = ()
    ordered: tuple[float, ...] = ()
    for seen, value in enumerate(values, start=1):
        window, ordered = forecast._slide(window, ordered, value, kept=kept)
        assert window == tuple(values[max(0, seen - kept) : seen])
        assert _same(ordered, tuple(sorted(window))), (window, ordered)


def test_a_window_without_its_sorted_copy_is_sorted_once_then_kept():
    window = (3.0, -0.0, 1.0, 0.0, 2.0)
    unsorted_state = ForecastState(rates=window)  # built by hand: no sorted copy
    spec = PolicySpec()
    ordered_window, ordered = forecast._slide(window, unsorted_state.rates_sorted, 0.0, kept=5)
    assert ordered_window == (-0.0, 1.0, 0.0, 2.0, 0.0)
    assert _same(ordered, tuple(sorted(ordered_window)))
    rates = tuple(float(i % 7) for i in range(20))
    by_hand = ForecastState(ratios=rates, rates=rates)
    kept = replace(by_hand, ratios_sorted=tuple(sorted(rates)), rates_sorted=tuple(sorted(rates)))
    assert forecast.envelope(spec, by_hand) == forecast.envelope(spec, kept) == (6.0, 6.0)


def test_observe_keeps_the_sorted_windows_in_step_with_the_windows():
    spec = PolicySpec()
    fs = ForecastState()
    for tick in range(400):
        rate = 10.0 + (tick * 7919 % 23) - (0.0 if tick % 5 else 10.0)
        fs = forecast.observe(spec, fs, rate, tick * spec.tick_s)
        assert _same(fs.rates_sorted, tuple(sorted(fs.rates)))
        assert _same(fs.ratios_sorted, tuple(sorted(fs.ratios)))
    assert len(fs.rates) == int(spec.burst_lookback_s / spec.tick_s)


def test_a_leaving_value_missing_from_a_hand_built_sorted_copy_removes_nothing_past_its_end():
    """A sorted copy of the window's length that does not hold the window's values (built by hand): the
    leaving value would go past the end, where nothing is removed, as the tuple's slices did."""
    window, ordered = forecast._slide((9.0, 1.0), (1.0, 2.0), 0.5, kept=2)
    assert window == (1.0, 0.5)
    assert ordered == (0.5, 1.0, 2.0)
