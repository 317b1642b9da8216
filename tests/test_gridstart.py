"""The refits' compiled grid search (policies/stages/gridstart.py) chooses statsmodels' starting point: the
same fits, bit for bit, with statsmodels' smoother run on a handful of the grid's points."""

import warnings

import numpy as np
import pytest

from policies.stages import forecast, gridstart

pytest.importorskip("numba", reason="numba comes with the replay extra (make installs it)")
from statsmodels.tsa.holtwinters import ExponentialSmoothing  # noqa: E402
from statsmodels.tsa.holtwinters import model as hw_model  # noqa: E402


def _holt(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 40.0 + 0.3 * np.arange(n) + rng.normal(0.0, 3.0, n)


def _seasonal(m: int, cycles: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    i = np.arange(m * cycles)
    return 100.0 + 30.0 * np.sin(2 * np.pi * i / m) + 0.05 * i + rng.gamma(2.0, 4.0, len(i))


def _fit(cls: type, y: np.ndarray, m: int, seasonal: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if seasonal:
            model = cls(y.copy(), trend="add", damped_trend=True, seasonal="add", seasonal_periods=m,
                        initialization_method="heuristic", bounds=forecast._BOUNDS)
        else:
            model = cls(y.copy(), trend="add", damped_trend=True, initialization_method="estimated",
                        bounds=forecast._BOUNDS)
        return model.fit()


CASES = [(_holt(40, 1), 0, False), (_holt(300, 2), 0, False), (np.full(30, 7.0), 0, False),
         (_seasonal(24, 3, 3), 24, True), (_seasonal(48, 2, 4), 48, True)]


@pytest.mark.parametrize(("y", "m", "seasonal"), CASES)
def test_the_compiled_grid_search_fits_what_statsmodels_fits_bit_for_bit(y, m, seasonal):
    assert gridstart.model_class() is not ExponentialSmoothing
    stock, fast = _fit(ExponentialSmoothing, y, m, seasonal), _fit(gridstart.model_class(), y, m, seasonal)
    assert stock.params.keys() == fast.params.keys()
    for name, value in stock.params.items():
        assert np.asarray(value).tobytes() == np.asarray(fast.params[name]).tobytes(), name
    for part in ("level", "trend", "season", "fittedvalues"):
        assert np.asarray(getattr(stock, part)).tobytes() == np.asarray(getattr(fast, part)).tobytes(), part


def _grid_calls(monkeypatch, y: np.ndarray, m: int, seasonal: bool) -> int:
    """statsmodels' smoother calls in the grid search (untransformed parameters) of the forecaster's fit."""
    calls = []
    stock_wrapper = hw_model.opt_wrapper

    def counting(func):
        wrapped = stock_wrapper(func)

        def f(x, hw_args):
            calls.append(hw_args.transform)
            return wrapped(x, hw_args)
        return f

    monkeypatch.setattr(hw_model, "opt_wrapper", counting)
    forecast._fitted.__wrapped__(y.tobytes(), m, seasonal)
    return calls.count(False)


def test_statsmodels_smoother_runs_on_a_few_grid_points_only(monkeypatch):
    # statsmodels' own loop runs it on every point: 1,345 (Holt), 10,426 (seasonal)
    assert _grid_calls(monkeypatch, _holt(300, 2), 24, False) <= 10
    assert _grid_calls(monkeypatch, _seasonal(24, 3, 3), 24, True) <= 10


def test_the_compiled_sums_are_statsmodels_sums_within_the_bound_of_their_order():
    seen = {}

    class Probe(gridstart.model_class()):
        def _get_starting_values(self, params, start_params, use_brute, sel, hw_args, bounds, alpha, func):
            sv_sel = np.zeros(len(sel), dtype=bool)
            sv_sel[:3] = True
            sv_sel &= sel
            points = self._setup_brute(sv_sel, bounds, alpha)
            seen["ours"] = gridstart._sums(gridstart._kernels(), seasonal=True, y=hw_args.y, points=points,
                                           params=params)
            hw_args.xi, hw_args.transform = sv_sel.astype(np.int64), False
            seen["theirs"] = np.array([hw_model.opt_wrapper(func)(p, hw_args) for p in points])
            return super()._get_starting_values(params, start_params, use_brute, sel, hw_args, bounds, alpha, func)

    y = _seasonal(24, 3, 5)
    _fit(Probe, y, 24, True)
    ours, theirs = seen["ours"], seen["theirs"]
    assert len(ours) > 1000 and np.all(np.isfinite(theirs))
    assert np.max(np.abs(ours - theirs) / theirs) <= gridstart._SLACK_EPS * len(y) * np.finfo(float).eps / 2


def test_candidates_keep_every_point_the_order_of_a_sum_could_make_the_smallest():
    eps = np.finfo(float).eps
    sums = np.array([2.0, 1.0 + 100 * eps, 1.0, 1.0 + 1e-6, np.nan, np.inf])
    assert list(gridstart.candidates(sums, 100)) == [1, 2]
    assert list(gridstart.candidates(np.array([0.0, 0.0, 1e-320]), 10)) == [0, 1, 2]
    for unbounded in ([np.nan, np.nan], [np.inf, 1e308], [1e301], []):
        assert gridstart.candidates(np.array(unbounded), 10) is None


def test_without_numba_or_switched_off_the_model_is_statsmodels_own(monkeypatch):
    try:
        gridstart.use_compiled(False)
        assert gridstart.model_class() is ExponentialSmoothing
        gridstart.use_compiled(True)
        monkeypatch.setattr(gridstart, "_kernels", lambda: None)
        gridstart.model_class.cache_clear()
        assert gridstart.model_class() is ExponentialSmoothing
    finally:
        monkeypatch.undo()
        gridstart.use_compiled(True)
    assert gridstart.model_class() is not ExponentialSmoothing


def test_a_statsmodels_whose_internals_differ_keeps_its_own_search(monkeypatch):
    def other_shape(self, params, start_params, use_brute, sel, hw_args, bounds, alpha):
        raise AssertionError("not called")

    try:
        monkeypatch.setattr(ExponentialSmoothing, "_get_starting_values", other_shape)
        gridstart.model_class.cache_clear()
        assert gridstart.model_class() is ExponentialSmoothing
    finally:
        monkeypatch.undo()
        gridstart.model_class.cache_clear()
    assert gridstart.model_class() is not ExponentialSmoothing


def test_a_compiled_loop_that_fails_leaves_statsmodels_loop_and_the_same_fit(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(gridstart, "_sums", broken)
    y = _seasonal(24, 3, 6)
    stock, fast = _fit(ExponentialSmoothing, y, 24, True), _fit(gridstart.model_class(), y, 24, True)
    for name, value in stock.params.items():
        assert np.asarray(value).tobytes() == np.asarray(fast.params[name]).tobytes(), name
