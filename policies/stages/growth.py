"""The risk of growth no forecast sees: how much demand has grown, at most, within one node-provisioning time.

Warm capacity is insurance against exactly this. The forecaster's history (bucket means, `forecast_bucket_s`
apart) gives, for every bucket i, the growth over the horizon that followed it:
    g_i = max(history[i+1 .. i+h]) / history[i] - 1,    h = node_provisioning_s / forecast_bucket_s buckets,
relative to the level at the start of the window (a level under 2 % of the history's peak counts as that
floor: a near-silent night would otherwise make every morning an "infinite" growth). The risk is the
`warm_growth_quantile` of these (by default the 99th percentile: "cover growth up to the p99 of past
increases over the provisioning time"). Once the history spans `seasonal_min_cycles` seasons (days), only
windows that started at this time of day (within `forecast_bucket_s` x 6 either side, across days) count,
so the insurance follows the risk: mornings, when traffic rises, get more than nights.
`warm_growth_min_ratio` sets a floor the history cannot lower (e.g. 1.0 to be ready for a doubling).

E.g. 5-min buckets, 300 s provisioning (h = 1): buckets 100, 100, 140, 150 give growths 0, 0.4, 0.07; their
99th percentile is ~0.4: warm capacity for 40 % more demand than now, beyond what is already decided.
"""

from __future__ import annotations

import math

import numpy as np

from policies.spec import PolicySpec
from policies.types import ForecastState

_FLOOR_OF_PEAK = 0.02
_TIME_OF_DAY_BUCKETS = 6  # either side of now's time of day: +-30 min at 5-min buckets


def horizon_buckets(spec: PolicySpec, node_s: float | None = None) -> int:
    return max(1, math.ceil((spec.node_provisioning_s if node_s is None else node_s) / spec.forecast_bucket_s))


def growth_samples(spec: PolicySpec, history: tuple[float, ...], node_s: float | None = None) -> np.ndarray:
    """g_i for every bucket i with a whole horizon after it (see the module docstring)."""
    h = horizon_buckets(spec, node_s)
    y = np.asarray(history, dtype=float)
    if len(y) <= h:
        return np.zeros(0)
    n = len(y) - h  # windows y[i+1 .. i+h], i < n
    start = y[:n]
    floor = max(_FLOOR_OF_PEAK * float(y.max()), 1e-9)
    growth: np.ndarray = np.maximum(_window_peaks(y, h, n) / np.maximum(start, floor) - 1.0, 0.0)
    return growth


def _window_peaks(y: np.ndarray, h: int, n: int) -> np.ndarray:
    """max(y[i+1 .. i+h]) for i < n, as the element-wise maximum of h shifted slices. The same figures as
    `sliding_window_view(y[1:], h).max(axis=1)`, which reduces its short strided axis one window at a time
    (about 50 times slower at h = 2, once per forecast bucket over 2,016 buckets): a maximum is one of its
    values whatever the order, and only an equal zero's sign could differ, which `growth_samples` turns into
    -1.0 either way (zero over the floor, less one)."""
    peak = y[1 : 1 + n]
    for k in range(2, h + 1):
        peak = np.maximum(peak, y[k : k + n])
    return peak


def growth_risk(spec: PolicySpec, fs: ForecastState, now: float, node_s: float | None = None) -> tuple[float, str]:
    """The growth to insure against now (a ratio, e.g. 0.4 = +40 %), and where it came from. `node_s`: the
    node provisioning time (learned; default `spec.node_provisioning_s`)."""
    node_s = spec.node_provisioning_s if node_s is None else node_s
    # The oldest bucket is left out as a window's start: the history began there, in the middle of it,
    # while the controller's rate windows were still filling (a low start, then every later bucket a "rise").
    samples = growth_samples(spec, fs.history, node_s)[1:]
    floor = spec.warm_growth_min_ratio
    if len(samples) == 0 or fs.bucket_start_s is None:
        return floor, "no history of growth yet"
    where = "all history"
    if len(fs.history) >= spec.seasonal_min_cycles * spec.season_buckets:
        # bucket i of the history started at bucket_start_s - (len - i) x width
        width = spec.forecast_bucket_s
        starts = fs.bucket_start_s - (len(fs.history) - np.arange(1, len(samples) + 1)) * width
        phase = np.mod(starts - now, spec.season_s)
        distance = np.minimum(phase, spec.season_s - phase)
        near = distance <= _TIME_OF_DAY_BUCKETS * width
        if near.any():
            samples, where = samples[near], "this time of day"
    risk = float(np.quantile(samples, spec.warm_growth_quantile))
    why = f"p{spec.warm_growth_quantile * 100:g} of {len(samples)} past increases over {node_s:.0f} s ({where})"
    return max(risk, floor), why
