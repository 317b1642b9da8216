"""The forecast stage's hand-summed least squares give numpy's results bit for bit (replays stay identical)."""

import math
import random
from types import SimpleNamespace

import numpy as np

from policies.stages.forecast import RAMP_T_STAT, RAMP_TICKS, climb


def _numpy_climb(rates: tuple[float, ...], tick_s: float, horizon_s: float) -> float | None:
    """The climb detector as written with numpy arrays."""
    y = np.asarray(rates[-RAMP_TICKS:], dtype=float)
    x = np.arange(RAMP_TICKS, dtype=float) - (RAMP_TICKS - 1) / 2
    slope = float((x * (y - y.mean())).sum() / (x * x).sum())
    if slope <= 0:
        return None
    line_sse = float(((y - (y.mean() + slope * x)) ** 2).sum())
    se = math.sqrt(line_sse / (RAMP_TICKS - 2) / float((x * x).sum()))
    if se > 0 and slope / se < RAMP_T_STAT:
        return None
    step_sse = min(float(((y[:k] - y[:k].mean()) ** 2).sum() + ((y[k:] - y[k:].mean()) ** 2).sum())
                   for k in range(2, RAMP_TICKS - 1))
    if step_sse <= line_sse:
        return None
    return float(y.mean() + slope * (x[-1] + horizon_s / tick_s))


def test_climb_is_bit_identical_to_the_numpy_least_squares():
    rng = random.Random(11)
    spec = SimpleNamespace(tick_s=15.0)
    found = 0
    for i in range(20000):
        base = 10 ** rng.uniform(-1, 4)
        if i % 2:  # ramps with noise: the detector fires on many
            rates = tuple(base * (1 + rng.uniform(0, 0.1) * j) + rng.gauss(0, base * 0.02) for j in range(10))
        else:  # noise and steps, rounded like real rates
            rates = tuple(round(base * rng.random(), rng.randint(0, 3)) for _ in range(RAMP_TICKS))
        expected = _numpy_climb(rates, 15.0, 120.0)
        found += expected is not None
        assert climb(spec, SimpleNamespace(rates=rates), 120.0) == expected, rates
    assert found > 500  # the full path (line, t statistic, step comparison) was exercised


def test_climb_needs_a_full_window():
    spec = SimpleNamespace(tick_s=15.0)
    assert climb(spec, SimpleNamespace(rates=(1.0, 2.0, 3.0)), 60.0) is None
