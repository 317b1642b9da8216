"""Refits of a demand history seen before come from the fit memo, bit for bit what statsmodels fits."""

import math

import numpy as np

from policies.spec import PolicySpec
from policies.stages import forecast
from policies.types import ForecastState


def _history(n: int, bump: float = 0.0) -> tuple[float, ...]:
    return tuple(50.0 + 20.0 * math.sin(i / 5.0) + 0.37 * i + (bump if i == n - 1 else 0.0) for i in range(n))


def test_a_refit_of_the_same_history_is_served_from_the_memo_with_the_same_bits():
    spec = PolicySpec()
    forecast._fitted.cache_clear()
    fs = ForecastState(history=_history(40), kind="level", level=50.0)
    first = forecast._fit(spec, fs, now=1000.0)
    again = forecast._fit(spec, fs, now=2000.0)
    info = forecast._fitted.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert first.kind == "holt" and again.fitted_at_s == 2000.0
    fresh = forecast._fitted.__wrapped__(np.asarray(fs.history, dtype=float).tobytes(), spec.season_buckets, False)
    for name, value in zip(("alpha", "beta", "phi", "level", "trend"), fresh):
        assert getattr(again, name) == value and getattr(first, name) == value, name


def test_a_history_that_differs_in_one_bit_is_fitted_anew():
    spec = PolicySpec()
    forecast._fitted.cache_clear()
    history = _history(40)
    forecast._fit(spec, ForecastState(history=history), now=0.0)
    last = history[-1]
    nudged = history[:-1] + (math.nextafter(last, math.inf),)
    forecast._fit(spec, ForecastState(history=nudged), now=0.0)
    assert forecast._fitted.cache_info().misses == 2
