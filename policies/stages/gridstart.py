"""The refits' starting values: statsmodels' own grid search, its choice bit for bit, in a compiled loop.

statsmodels' `ExponentialSmoothing.fit()` first looks for starting values of the smoothing weights: it
evaluates its smoother's sum of squared one-step errors at every point of a grid over (alpha, beta) or
(alpha, beta, gamma) (`_setup_brute`: 1,345 points for the forecaster's Holt fit, 10,426 for its seasonal
one), with the initial level, trend, season and damping fixed at their heuristic values, and starts its
optimizer from the first point with the smallest sum. One call of its smoother per point: 93 % of a
seasonal refit on a week of 5-min buckets (0.31 of 0.34 s, docs/speed.md).

`model_class()` gives an `ExponentialSmoothing` whose grid search evaluates the same grid in one compiled
loop (numba, about 5x faster) and chooses the same point. Why it is the same point:
- every one-step error is the same double as statsmodels': the same operations in the same order as its
  smoother (`_exponential_smoothers.pyx`, compiled without fused multiply-adds; numba fuses none without
  `fastmath`), from the same parameters, the same initial values and the same data;
- only the sums differ: statsmodels adds the squares with BLAS's dot product, the loop here in sequence.
  All terms are non-negative, so each sum is within n * eps (relative) of the exact sum of the same
  terms; a point whose sum here exceeds the smallest sum here by more than `_SLACK_EPS` * n * eps
  cannot be statsmodels' minimum;
- the points left (usually one) are evaluated again with statsmodels' own smoother and sum, in grid
  order, keeping the first strictly smaller one, as statsmodels' loop does.
The fit then continues in statsmodels' code from the same parameter vector: the same fit, bit for bit
(tests/test_gridstart.py compares it with the stock fit on recorded histories).

Where numba is not installed (the controller's image: it comes with the `replay` extra) the stock class
is used: the same bits, slower; the controller fits a few times a day, a replay 61 times on 14 days. The
controller's refit child turns the compiled search off (`use_compiled`) where numba is installed too: the
child lives for one batch of refits, and compiling the loop (about 1 s) costs more than a few fits save,
on the fit's own deadline. Any other grid search (another model, fixed parameters, a sum that is not
finite, a compiled loop that fails) is statsmodels' own.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

# A sum of n non-negative doubles, added in any order, is within gamma_n = n*u / (1 - n*u) of the exact sum
# (u = eps / 2). Two sums of the same terms are then within 4 * gamma_n < 4 * n * eps of each other (for
# n * eps < 1/2); 8 leaves room for the rounding of the squares themselves.
_SLACK_EPS = 8.0
# Points per block of the compiled loop: the block's season ring (288 x 256 doubles, 0.6 MB) stays in cache.
_BLOCK = 256


_compiled = {"on": True}


def use_compiled(enabled: bool) -> None:
    """Whether `model_class` compiles the grid search where numba is installed (on by default); for the whole
    process, set before its first fit."""
    _compiled["on"] = enabled
    model_class.cache_clear()


@functools.cache
def _kernels() -> tuple[Any, Any] | None:
    """The compiled (holt, holt-winters) sums of squared errors; None without numba."""
    try:
        import numba
    except Exception:  # noqa: BLE001 - not installed, or broken (a numpy it does not support): statsmodels' search
        return None
    jit = numba.njit(cache=False, nogil=True)  # no file written from the pure core: compiled once a process
    return jit(_holt_sse), jit(_holt_winters_sse)


def _holt_sse(y: Any, points: Any, p: Any) -> Any:  # pragma: no cover - compiled
    """Sum of squared one-step errors of statsmodels' `holt_add_dam` at each (alpha, beta) point."""
    k, n = points.shape[0], y.shape[0]
    l0, b0, phi = p[3], p[4], p[5]
    out = np.empty(k)
    for j in range(k):
        alpha, beta = points[j, 0], points[j, 1]
        alphac, betac = 1 - alpha, 1 - beta
        lvl, b = l0, b0
        e = y[0] - (lvl + phi * b)
        acc = e * e
        for i in range(1, n):
            lvl_new = (alpha * y[i - 1]) + (alphac * (lvl + phi * b))
            b = (beta * (lvl_new - lvl)) + (betac * phi * b)
            lvl = lvl_new
            e = y[i] - (lvl + phi * b)
            acc += e * e
        out[j] = acc
    return out


def _holt_winters_sse(y: Any, points: Any, p: Any, block: int) -> Any:  # pragma: no cover - compiled
    """Sum of squared one-step errors of statsmodels' `holt_win_add_add_dam` at each (alpha, beta, gamma)
    point; a block of points at a time, the points innermost (independent: the loop vectorises). The season
    is a ring of m values per point: step i reads s[i-1] and writes s[i+m-1] in the same slot. Scalar loops
    only (no array expressions): they compile in a third of the time."""
    k, n = points.shape[0], y.shape[0]
    l0, b0, phi = p[3], p[4], p[5]
    m = p.shape[0] - 6
    out = np.empty(k)
    alpha, beta, gamma = np.empty(block), np.empty(block), np.empty(block)
    lvl, b, acc = np.empty(block), np.empty(block), np.empty(block)
    ring = np.empty((m, block))
    for start in range(0, k, block):
        w = min(block, k - start)
        for q in range(w):
            alpha[q], beta[q], gamma[q] = points[start + q, 0], points[start + q, 1], points[start + q, 2]
            lvl[q], b[q] = l0, b0
            e = y[0] - (l0 + phi * b0 + p[6])
            acc[q] = e * e
        for r in range(m):
            for q in range(w):
                ring[r, q] = p[6 + r]
        for i in range(1, n):
            y_prev, y_now = y[i - 1], y[i]
            prev, now = (i - 1) % m, i % m
            for q in range(w):
                a, be, g = alpha[q], beta[q], gamma[q]
                s_prev, l_prev, b_prev = ring[prev, q], lvl[q], b[q]
                # statsmodels' lines, with alphac = 1 - alpha etc. (the same double) written in place
                l_new = (a * y_prev) - (a * s_prev) + ((1 - a) * (l_prev + phi * b_prev))
                b_new = (be * (l_new - l_prev)) + ((1 - be) * phi * b_prev)
                ring[prev, q] = g * y_prev - (g * (l_prev + phi * b_prev)) + ((1 - g) * s_prev)
                lvl[q], b[q] = l_new, b_new
                e = y_now - (l_new + phi * b_new + ring[now, q])
                acc[q] += e * e
        for q in range(w):
            out[start + q] = acc[q]
    return out


def _sums(kernels: tuple[Any, Any], *, seasonal: bool, y: Any, points: Any, params: Any) -> Any:
    holt, holt_winters = kernels
    y = np.ascontiguousarray(y, dtype=float)
    points = np.ascontiguousarray(points, dtype=float)
    params = np.ascontiguousarray(params, dtype=float)
    return holt_winters(y, points, params, _BLOCK) if seasonal else holt(y, points, params)


def candidates(sums: Any, n: int) -> Any | None:
    """Indices of the points that may hold statsmodels' smallest sum, in grid order; None when the smallest sum
    is not finite enough to bound (then statsmodels' own loop decides). A NaN sum here is NaN there (the same
    terms), which statsmodels' `<` never picks."""
    numbers = sums[~np.isnan(sums)]
    best = float(np.min(numbers)) if len(numbers) else float("nan")
    if not np.isfinite(best) or best > 1e300:
        return None
    limit = best * (1.0 + _SLACK_EPS * n * float(np.finfo(float).eps)) + np.finfo(float).tiny
    return np.flatnonzero(sums <= limit)


# The statsmodels internals the search plugs into (0.15: `ExponentialSmoothing._get_starting_values` calls
# `_setup_brute` and `opt_wrapper(func)` over `SMOOTHERS`' functions); another shape is left alone.
_HOOK_ARGS = ("self", "params", "start_params", "use_brute", "sel", "hw_args", "bounds", "alpha", "func")


def _hooks_match(model: Any, module: Any) -> bool:
    hook = getattr(model, "_get_starting_values", None)
    return (hook is not None and tuple(inspect.signature(hook).parameters) == _HOOK_ARGS
            and hasattr(model, "_setup_brute") and hasattr(module, "opt_wrapper")
            and {("add", "add"), (None, "add")} <= set(getattr(module, "SMOOTHERS", {})))


def _first_smallest(points: Any, picks: Any, *, opt: Any, hw_args: Any) -> Any:
    """statsmodels' loop over the points picked (grid order): its own sum, the first strictly smallest kept;
    the first point when none is smaller than infinity."""
    best_val = np.inf
    best_params = points[0]
    for i in picks:
        val = opt(points[i], hw_args)
        if val < best_val:
            best_params = points[i]
            best_val = val
    return best_params


@functools.cache
def model_class() -> type:
    """statsmodels' `ExponentialSmoothing`, with the compiled grid search where numba is installed."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing
    from statsmodels.tsa.holtwinters import model as hw_model

    found = _kernels() if _compiled["on"] else None
    if found is None or not _hooks_match(ExponentialSmoothing, hw_model):
        return ExponentialSmoothing  # type: ignore[no-any-return]
    kernels = found
    smoothers = hw_model.SMOOTHERS
    shapes = {id(smoothers[("add", "add")]): True, id(smoothers[(None, "add")]): False}

    class GridStart(ExponentialSmoothing):  # type: ignore[misc]
        """The stock model; only `_get_starting_values`' grid search runs compiled (module docstring)."""

        def _get_starting_values(self, params: Any, start_params: Any, use_brute: bool, sel: Any,
                                 hw_args: Any, bounds: Any, alpha: Any, func: Any) -> Any:
            seasonal = shapes.get(id(func))
            if (start_params is not None or not use_brute or seasonal is None
                    or tuple(bool(v) for v in sel[:3]) != (True, True, seasonal)):
                return super()._get_starting_values(params, start_params, use_brute, sel, hw_args, bounds,
                                                    alpha, func)
            # statsmodels' own set-up of its loop: the grid over the selected weights, untransformed.
            sv_sel = np.zeros(len(sel), dtype=bool)
            sv_sel[:3] = True
            sv_sel &= sel
            hw_args.xi = sv_sel.astype(np.int64)
            hw_args.transform = False
            points = self._setup_brute(sv_sel, bounds, alpha)
            y = hw_args.y
            try:
                picks = candidates(_sums(kernels, seasonal=seasonal, y=y, points=points, params=params), len(y))
            except Exception:  # noqa: BLE001 - a loop that fails to compile or run: statsmodels' loop, the same choice
                picks = None
            params[sv_sel] = _first_smallest(points, range(len(points)) if picks is None else picks,
                                             opt=hw_model.opt_wrapper(func), hw_args=hw_args)
            return params

    return GridStart
