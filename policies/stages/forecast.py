"""The forecaster (stages demand, predictive and warmpool): demand (arrival rate) ahead, with an upper bound.

History is kept as `forecast_bucket_s` means (5 min by default). The model depends on how much history
exists:
- fewer than 12 buckets: `level`, an exponentially weighted mean (no fit);
- from 12 buckets (an hour at the default width): `holt`, statsmodels ExponentialSmoothing with a damped additive trend;
- from `seasonal_min_cycles` seasons: `holt-winters`, the same plus additive seasonality (daily).
statsmodels refits every `refit_interval_s` (and when the model kind changes); each closed bucket in
between runs one step of the Holt-Winters recursion with the fitted parameters, which is exactly how the
fitted filter itself would continue.

The upper bound is the smaller of two envelopes over the last `burst_lookback_s`:
- proportional: the point forecast x a high quantile of per-tick ratios observed rate / expected rate. It
  captures model error and burstiness that scale with the level (smooth, diurnal traffic), where it sits
  a few percent above the forecast and follows the forecast up and down;
- absolute: a high quantile of the per-tick rates themselves x the growth the model expects by then
  (forecast at the horizon / forecast now). On/off traffic bursts to the same height whatever the bucket
  mean, so there the ratio overshoots (a quiet bucket's ratio times a busy bucket's level) while the
  recent peaks are the honest bound.
Both are upper bounds of the same quantity under different burst models; the tighter one is used, and the
SLO feedback stage corrects what both miss.

A burst seen once is not yet a pattern: while the recent rates above the forecast come from a single
episode (runs closer than a start-up count as one; a tick counts from halfway to the burst's height, and
never below the cut, which serves it) that lasted less than a start-up, and demand is not climbing, the
absolute envelope covers only the burst's protected share (the share of the classes that are never shed
in the arrivals of the ticks that reached its height, not in the tick's); queueing and shedding absorb the
rest, as they must anyway for a burst shorter than a start-up (capacity ordered at its first tick lands
after it). A second episode within `burst_lookback_s` shows the bursts recur, and the envelope covers them
in full; so it does for a rise that holds for a start-up.

Outages: arrivals that fall to under 5 % of what the model expects, when the model expects at least 20
requests in the tick (under Poisson, practically impossible) and such drops are rare in the recent ratios
(under 1 %: on/off traffic, where silent ticks are routine, never qualifies), look like an ingress outage,
not a change in demand: an upstream failure whose traffic comes back all at once. For up to
`outage_hold_s` they are not learned, so the forecast (and the capacity sized on it) holds; a drop that
lasts longer is accepted as real.

Silence: what such a drop interrupted (the rate the model expected when it began) is remembered for as long
as the silence lasts, after the hold too, when the history has learned the zeros and the fleet has gone to
its floor. Traffic that comes back after it (a tick at `_RETURN_RATIO` of that rate or more) is the expected
level returning, not a burst to confirm: `returning` gives the interrupted rate from that tick for as long
as the caller asks (the predictive stage: one lead time, until capacity ordered at the return has landed).
Both mistakes have a price: taking a return that fades for the old level pays one lead time of the old
fleet's GPUs; taking a return that holds for a burst pays a cold start of missed requests (a model whose
forecast learned hours of zeros orders nothing until the burst is confirmed, then follows the rate up).
The memory is dropped `burst_lookback_s` after the return. From such a drop to the return the service time
sized with is the one learned before it, not the drain's (stage learn).

Ramps: the per-tick climb (`climb`, a least-squares line over RAMP_TICKS ticks whose slope must be clear of
the line's own residuals, and better than a step) reads a clean ramp, but not a rise on a noisy live rate:
a windowed rate (`rate_window_s`) overlaps its neighbours, so 8 ticks hold two or three independent
readings, and a rise made of a level shift and growth fits a step as well as a line (the fleet drill's
doubling, runs 14-16: t below 3 against 4 throughout, a step fitting better on 18 of 20 ticks in run 16).
`held_rise` asks the question the burst rule asks, sooner and against the noise: has demand risen above
the forecast and held there? Its noise model is the rate's own: a count over the window, Poisson at the
least (sd of the rate = sqrt(expected / window)), more where the traffic's recent ratios observed /
expected spread more (the robust spread of ratio differences one window apart, independent readings; it
carries rate()'s extrapolation, model error and the traffic's burstiness, and excludes the span tested).
A rise holds when, over the last window plus `RISE_HOLD_OF_STARTUP` of a start-up (an event of d seconds
raises a windowed rate for d + window), the mean rate stands RISE_Z standard errors above the expected
rate (the overlap of the windows counted in its error) and no tick of it falls back to within RISE_TICK_Z
sd. A burst is told apart by what follows: it ends within the hold, a ramp stays. The cost of each
mistake: a burst taken for a ramp is provisioned at once, and its replicas wait out the scale-down window
after it ends; a ramp taken for a burst is served a confirmation window (a start-up, restarted by the
burst rule at each new high of a rate that keeps climbing) later, its excess queued and shed meanwhile,
critical requests late among them. Half a start-up halves the second cost and lets through only bursts
longer than it, which were halfway to being confirmed anyway. The climb's projection is kept where it
fires (a clean ramp); a held rise gives the level it holds, no growth beyond it.

Before the first request: the history begins at the model's first non-zero arrival rate. Zeros read
before it (a controller started before its load, a model deployed before its traffic is routed) are not a
level the model served: learned, they pull the first bucket down (seen live: two ticks of 0 and a filling
window put a 10-req/s model's first bucket at 5.4), the ratios observed / expected against it read as
bursts for `burst_lookback_s`, and the traffic never looks steady. Nor is a rate read within `rate_window_s`
of that first request learned: the window still holds the time before it, so it under-reads (6.0, then 9.3
of 10). Nothing is learned, scored or bucketed until then. Once the history has begun, zeros are demand like
any other (silence, scale to zero, an outage, as below).

Through the silence (after the outage hold, for at most one season from its start: by then a day has
passed without the traffic), the capacity the classes that are never shed (the protected share, as for a
one-off burst) need for their share of the interrupted rate is kept (`kept_through_silence`): they must
not meet a cold start when the level returns, and the shed classes are guarded hard while the rest of the
fleet comes (stage shedding). Without per-class rates before the silence nothing is kept (the floor, as
before). The price of each mistake: a day of those replicas if the traffic never returns; a cold start of
misses for the classes that must not miss if it does and nothing was kept (on `scenario:silence`,
critical 95.5-95.9 % with the floor of one replica).
"""

from __future__ import annotations

import bisect
import functools
import math
import warnings
from typing import Protocol

import numpy as np

from policies.spec import PolicySpec
from policies.stages import calibration, gridstart
from policies.types import ForecastState

# A damped Holt fit estimates five numbers (initial level and trend, their two smoothing weights, the
# damping). On six buckets it fits the noise: seen live, a step from 25 to 50 req/s read as a trend of
# +18 a bucket (alpha = beta = 1) and the forecast said 108 req/s two buckets on. At least twice as many
# buckets as parameters, rounded to an hour of default buckets; before that the level model and the
# per-tick climb detector carry the forecast.
_HOLT_MIN_BUCKETS = 12
# Smoothing parameters are kept where the model still learns: on a few buckets statsmodels' best fit is
# often alpha ~ 0, a straight line through them that no later bucket moves (a start-up ramp then reads as a
# trend that holds for the whole refit interval). The level takes at least 10 % of each bucket's error;
# the trend is damped at least 2 % a bucket.
_BOUNDS = {"smoothing_level": (0.1, 1.0), "damping_trend": (0.8, 0.98)}
# While the history is short, refit whenever it has grown by half since the last fit (12, 18, 27, 41, ...
# buckets), not only every `refit_interval_s`: the first fits are on very little data.
_REFIT_GROWTH = 1.5
_OUTAGE_RATIO = 0.05
_OUTAGE_MIN_EXPECTED = 20.0  # requests per tick
_OUTAGE_MAX_SHARE = 0.01
_RETURN_RATIO = 0.1  # of the interrupted rate: the traffic is back (10x the outage threshold)
_LEVEL_ALPHA = 0.5
_MAX_RATIO = 50.0
_MIN_RATIOS = 8
# A ratio observed / expected is taken against at least 2 % of the recent peak bucket (the last hour of
# 5-min buckets): after a quiet night a model that expects ~0 would turn a few requests into a ratio of
# thousands, and the burst envelope would multiply the morning's forecast by it.
_RATIO_FLOOR_OF_PEAK = 0.02
_RATIO_FLOOR_BUCKETS = 12


def _step(fs: ForecastState, y: float) -> ForecastState:
    """Advance the model by one observed bucket."""
    if fs.kind == "none":
        return fs.changed(kind="level", level=y)
    if fs.kind == "level":
        return fs.changed(level=fs.level + _LEVEL_ALPHA * (y - fs.level))
    prev_level, prev_trend = fs.level, fs.trend
    season_now = fs.season[fs.season_pos] if fs.season else 0.0
    level = fs.alpha * (y - season_now) + (1 - fs.alpha) * (prev_level + fs.phi * prev_trend)
    trend = fs.beta * (level - prev_level) + (1 - fs.beta) * fs.phi * prev_trend
    if not fs.season:
        return fs.changed(level=level, trend=trend)
    s = fs.gamma * (y - prev_level - fs.phi * prev_trend) + (1 - fs.gamma) * season_now
    season = fs.season[: fs.season_pos] + (s,) + fs.season[fs.season_pos + 1 :]
    return fs.changed(level=level, trend=trend, season=season, season_pos=(fs.season_pos + 1) % len(season))


def point(fs: ForecastState, steps: int) -> float:
    """Mean rate `steps` buckets after the last closed one (1 = the bucket now open)."""
    if fs.kind in ("none", "level"):
        return max(0.0, fs.level)
    damp = _damping(fs.phi, steps) if fs.phi != 1.0 else float(steps)
    seasonal = fs.season[(fs.season_pos + steps - 1) % len(fs.season)] if fs.season else 0.0
    return max(0.0, fs.level + damp * fs.trend + seasonal)


@functools.lru_cache(maxsize=1024)
def _damping(phi: float, steps: int) -> float:
    """phi + phi^2 + ... + phi^steps, summed in that order. `point` needs it several times a tick for the same
    fitted phi and a few horizons (it was a tenth of the forecaster's per-tick cost); the same sum, so the
    same bits. A phi lasts until the next refit, so a few hundred entries hold every (phi, steps) in use."""
    return sum(phi**i for i in range(1, steps + 1))


def _fit(spec: PolicySpec, fs: ForecastState, now: float, *, fit: Fitter | None = None) -> ForecastState:
    y = np.asarray(fs.history, dtype=float)
    m = spec.season_buckets
    seasonal = len(y) >= spec.seasonal_min_cycles * m
    try:
        fitted = (fit if fit is not None else in_process)(y.tobytes(), m, seasonal)
    except FitUnavailable as exc:  # the previous parameters stay; the refit stays due (see `Fitter`)
        return fs.changed(unfitted=str(exc))
    if fitted is None:
        return fs.changed(fitted_at_s=now)
    alpha, beta, phi, level, trend, gamma, season = fitted
    return fs.changed(
        kind="holt-winters" if seasonal else "holt",
        fitted_at_s=now,
        fitted_buckets=len(y),
        alpha=alpha, beta=beta, phi=phi, level=level, trend=trend,
        gamma=gamma, season=season, season_pos=0, unfitted=None,
    )


# A fit is a pure function of the history's bits and the model's shape, and a seasonal fit costs as much as
# hundreds of ticks (about 40 ms with the compiled grid search, 0.3 s without); replays that see the same
# demand history (a frontier's capacity points, a benchmark's policy variants, in one process) fit it once.
# 128 fits (16 KB of history and a season of floats each, about 3 MB at most) hold every refit of a 14-day
# replay; a live controller refits a few times a day.
_FITS_KEPT = 128
_Fitted = tuple[float, float, float, float, float, float, tuple[float, ...]]


@functools.lru_cache(maxsize=_FITS_KEPT)
def _fitted(history: bytes, m: int, seasonal: bool) -> _Fitted | None:
    """(alpha, beta, phi, level, trend, gamma, season) of statsmodels' fit on the history (float64 bytes);
    None when the fit fails or its figures are not finite."""
    ExponentialSmoothing = gridstart.model_class()  # statsmodels' model; its grid search compiled (same bits)
    y = np.frombuffer(history, dtype=float).copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if seasonal:
                model = ExponentialSmoothing(
                    y, trend="add", damped_trend=True, seasonal="add", seasonal_periods=m,
                    initialization_method="heuristic", bounds=_BOUNDS,
                )
            else:
                model = ExponentialSmoothing(y, trend="add", damped_trend=True, initialization_method="estimated",
                                             bounds=_BOUNDS)
            r = model.fit()
        except (ValueError, np.linalg.LinAlgError):
            return None
    p = r.params
    values = [p["smoothing_level"], p["smoothing_trend"], p["damping_trend"], r.level[-1], r.trend[-1]]
    if not all(math.isfinite(v) for v in values):
        return None
    season: tuple[float, ...] = ()
    gamma = 0.0
    if seasonal:
        season = tuple(float(v) for v in r.season[-m:])
        gamma = float(p["smoothing_seasonal"])
        if not all(math.isfinite(v) for v in season) or not math.isfinite(gamma):
            return None
    alpha, beta, phi, level, trend = (float(v) for v in values)
    return alpha, beta, phi, level, trend, gamma, season


class FitUnavailable(Exception):
    """A fit that could not run at all (not a fit that failed on its data, which is None): its message says why."""


class Fitter(Protocol):
    """Where the refit runs: `(history as float64 bytes, season buckets, seasonal) -> _fitted's result`.

    The seam between the pure policy and a shell that keeps statsmodels out of its own process (the
    controller fits in a child process, `autoscaler/fitchild.py`); `in_process` by default (replays, benches,
    tests). A fitter must return the same bits as `in_process` for the same arguments, so a decision does not
    depend on where its fit ran. One that cannot fit (its process crashed, hung, did not start) raises
    `FitUnavailable`: the forecaster keeps the previous parameters, names the reason in
    `ForecastState.unfitted` until a refit succeeds, and tries again on the next tick (the fitter decides how
    often an attempt really runs)."""

    def __call__(self, history: bytes, m: int, seasonal: bool) -> _Fitted | None: ...


in_process: Fitter = _fitted


def _wanted_kind(spec: PolicySpec, n: int) -> str:
    if n >= spec.seasonal_min_cycles * spec.season_buckets:
        return "holt-winters"
    if n >= _HOLT_MIN_BUCKETS:
        return "holt"
    return "level" if n else "none"


def _close_buckets(spec: PolicySpec, fs: ForecastState, now: float) -> ForecastState:
    """Close the open bucket (and fill skipped ones with the model's own forecast) once `now` passed it."""
    width = spec.forecast_bucket_s
    opened_s = fs.bucket_start_s  # _step keeps it: the bucket closes where it opened
    if opened_s is None or now < opened_s + width:
        return fs
    kept = max(1, int(spec.history_kept_s / width))
    values: list[float] = []
    if fs.bucket_n:
        values.append(fs.bucket_sum / fs.bucket_n)
        fs = _step(fs, values[-1])
    skipped = int((now - opened_s) // width) - 1
    if fs.kind != "none":
        # A gap is filled with what the model expected for each skipped bucket, in order.
        for _ in range(min(skipped, spec.season_buckets)):
            values.append(point(fs, 1))
            fs = _step(fs, values[-1])
    history = (fs.history + tuple(values))[-kept:]
    start = opened_s + (skipped + 1) * width
    return fs.changed(history=history, bucket_start_s=start, bucket_sum=0.0, bucket_n=0)


def observe(
    spec: PolicySpec, fs: ForecastState, rate: float | None, now: float, protected: float | None = None, *,
    fit: Fitter | None = None,
) -> ForecastState:
    """Fold one tick's measured arrival rate into the forecaster (None = no measurement: nothing learned);
    `protected`: the share of this tick's arrivals in classes that are never shed, if measured per class;
    `fit`: where a due refit runs (`in_process` when None)."""
    fs, begun = _begun(spec, fs, rate, now)
    if not begun:
        return fs
    fs = _close_buckets(spec, fs, now)
    wanted = _wanted_kind(spec, len(fs.history))
    due = (fs.fitted_at_s is None or now - fs.fitted_at_s >= spec.refit_interval_s
           or len(fs.history) >= _REFIT_GROWTH * fs.fitted_buckets)
    if wanted in ("holt", "holt-winters") and (wanted != fs.kind or due):
        fs = _fit(spec, fs, now, fit=fit)
    if rate is None:
        return fs
    fs = _silence(spec, fs, rate, now)
    if _implausible_drop(spec, fs, rate):
        since = fs.outage_since_s if fs.outage_since_s is not None else now
        if fs.interrupted_per_s is None or fs.returned_at_s is not None:
            fs = fs.changed(interrupted_per_s=point(fs, 1), returned_at_s=None, interrupted_at_s=now,
                            interrupted_protected_ratio=fs.protected_share_ratio)
        if now - since < spec.outage_hold_s:  # not learned, not scored: the forecast holds
            return calibration.scored(spec, fs, None, now).changed(outage_since_s=since)
    elif fs.outage_since_s is not None:
        fs = fs.changed(outage_since_s=None)
    # The share measured now is only stored until a silence reads it (above), so it joins the tick's last
    # copy rather than making one of its own. A tick without it counts wholly in the burst's protected
    # rates (`recurring_only`): an unknown mix cuts nothing.
    kept_rate = rate * (1.0 if protected is None else protected)
    protected = fs.protected_share_ratio if protected is None else protected
    fs = calibration.scored(spec, fs, rate, now)
    if fs.bucket_start_s is None:
        fs = fs.changed(bucket_start_s=math.floor(now / spec.forecast_bucket_s) * spec.forecast_bucket_s)
    ratios, ratios_sorted = fs.ratios, fs.ratios_sorted
    if fs.kind != "none":
        expected = point(fs, 1)
        if expected > 0 or rate > 0:
            floor = _RATIO_FLOOR_OF_PEAK * max(fs.history[-_RATIO_FLOOR_BUCKETS:], default=0.0)
            ratio = min(_MAX_RATIO, rate / max(expected, floor, 1e-9))
            ratios, ratios_sorted = _slide(ratios, ratios_sorted, ratio, kept=_kept(spec))
    rates, rates_sorted = _slide(fs.rates, fs.rates_sorted, rate, kept=_kept(spec))
    kept_rates = (fs.protected_rates + (kept_rate,))[-_kept(spec):]
    return fs.changed(bucket_sum=fs.bucket_sum + rate, bucket_n=fs.bucket_n + 1, ratios=ratios, rates=rates,
                      ratios_sorted=ratios_sorted, rates_sorted=rates_sorted, protected_share_ratio=protected,
                      protected_rates=kept_rates)


def _begun(spec: PolicySpec, fs: ForecastState, rate: float | None, now: float) -> tuple[ForecastState, bool]:
    """Whether the history has begun by this tick: the model's first request read (its time remembered), and
    its rate window full since (see the module docstring, "Before the first request")."""
    if fs.bucket_start_s is not None:
        return fs, True
    first_s = fs.first_demand_s
    if first_s is None:
        if not rate:  # no reading, or a zero before any request: not a level the model served
            return fs, False
        fs, first_s = fs.changed(first_demand_s=now), now
    return fs, now - first_s >= (spec.rate_window_s or 0.0)


def _silence(spec: PolicySpec, fs: ForecastState, rate: float, now: float) -> ForecastState:
    """The silence's memory after this tick's rate: the return marked, or the memory dropped once the
    return is `burst_lookback_s` old (see the module docstring)."""
    if fs.interrupted_per_s is None:
        return fs
    if fs.returned_at_s is not None:
        if now - fs.returned_at_s >= spec.burst_lookback_s:
            return fs.changed(interrupted_per_s=None, returned_at_s=None)
        return fs
    if rate >= _RETURN_RATIO * fs.interrupted_per_s:
        return fs.changed(returned_at_s=now)
    return fs


def returning(fs: ForecastState, now: float, within_s: float) -> float | None:
    """The rate a silence interrupted, if traffic came back after it within the last `within_s`."""
    if fs.interrupted_per_s is None or fs.returned_at_s is None or now - fs.returned_at_s >= within_s:
        return None
    return fs.interrupted_per_s


def returning_cold(spec: PolicySpec, fs: ForecastState, now: float, within_s: float) -> bool:
    """Traffic back within the last `within_s` after a silence that outlasted the outage hold, when the
    capacity held for it had been released (a shorter one returns to the capacity the hold kept)."""
    return (returning(fs, now, within_s) is not None and fs.interrupted_at_s is not None
            and fs.returned_at_s is not None and fs.returned_at_s - fs.interrupted_at_s >= spec.outage_hold_s)


def kept_through_silence(spec: PolicySpec, fs: ForecastState, now: float) -> float | None:
    """The rate the classes that are never shed sent before a silence, while the silence lasts past the
    outage hold and for at most one season (`season_s`) from its start (see the module docstring); None
    otherwise, and when no per-class rates were measured before it."""
    if (fs.interrupted_per_s is None or fs.returned_at_s is not None or fs.interrupted_protected_ratio is None
            or fs.interrupted_at_s is None or now - fs.interrupted_at_s >= spec.season_s):
        return None
    return fs.interrupted_per_s * fs.interrupted_protected_ratio


def silence_since(spec: PolicySpec, fs: ForecastState, now: float) -> float | None:
    """When the silence under way began: a drop taken for an outage (held or past the hold) with no traffic
    back since, for at most one season (`season_s`) from its start, as `kept_through_silence`; None
    otherwise. Nothing arrives meanwhile: what the servers still report is the drain of what came before
    (stage learn)."""
    if (fs.interrupted_per_s is None or fs.returned_at_s is not None or fs.interrupted_at_s is None
            or now - fs.interrupted_at_s >= spec.season_s):
        return None
    return fs.interrupted_at_s


def _implausible_drop(spec: PolicySpec, fs: ForecastState, rate: float) -> bool:
    if fs.kind == "none" or len(fs.ratios) < _MIN_RATIOS:
        return False
    expected = point(fs, 1)
    if expected * spec.tick_s < _OUTAGE_MIN_EXPECTED or rate >= _OUTAGE_RATIO * expected:
        return False
    low = sum(1 for r in fs.ratios if r < _OUTAGE_RATIO)
    return low < _OUTAGE_MAX_SHARE * len(fs.ratios)


RAMP_TICKS = 8
RAMP_T_STAT = 4.0
# The climb's least squares run in plain floats (8 numbers: numpy's per-call overhead was most of a tick's
# forecast cost), summed in numpy's order so the results are the same bits: below 8 values numpy adds in
# sequence from 0.0, and 8 values it adds as ((0+1)+(2+3))+((4+5)+(6+7)) (its pairwise sum's unrolled block).
_RAMP_X = tuple(i - (RAMP_TICKS - 1) / 2 for i in range(RAMP_TICKS))


def _sum(values: list[float]) -> float:
    if len(values) == 8:
        v = values
        return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
    total = 0.0
    for value in values:
        total += value
    return total


def _mean(values: list[float]) -> float:
    return _sum(values) / len(values)


def _sse(values: list[float]) -> float:
    """Sum of squared deviations from the mean."""
    m = _mean(values)
    return _sum([(v - m) * (v - m) for v in values])


_RAMP_XX = _sum([x * x for x in _RAMP_X])


def climb(spec: PolicySpec, fs: ForecastState, horizon_s: float) -> float | None:
    """The rate `horizon_s` from now if the climb of the last RAMP_TICKS ticks goes on: a least-squares line
    through the recent per-tick rates, only when its slope is clearly positive (t > RAMP_T_STAT) and a line
    explains the window better than a single jump does (so noise and on/off steps do not count)."""
    if len(fs.rates) < RAMP_TICKS:
        return None
    y = [float(v) for v in fs.rates[-RAMP_TICKS:]]
    mean = _mean(y)
    slope = _sum([x * (v - mean) for x, v in zip(_RAMP_X, y)]) / _RAMP_XX
    if slope <= 0:
        return None
    line_sse = _sum([(v - (mean + slope * x)) * (v - (mean + slope * x)) for x, v in zip(_RAMP_X, y)])
    se = math.sqrt(line_sse / (RAMP_TICKS - 2) / _RAMP_XX)
    if se > 0 and slope / se < RAMP_T_STAT:
        return None
    step_sse = min(_sse(y[:k]) + _sse(y[k:]) for k in range(2, RAMP_TICKS - 1))
    if step_sse <= line_sse:
        return None
    return mean + slope * (_RAMP_X[-1] + horizon_s / spec.tick_s)


# A rise that holds (see the module docstring, "Ramps"): the share of a start-up its arrivals must hold
# for (beyond the rate's window); how many standard errors of its mean above the expected rate it must
# stand; how many sd above it every tick of the hold must be. Measured on simulated live rates (1.5-s
# ticks, a 6-s window; tests/test_held_rise.py; 60,000 stationary ticks at 3, 11 and 60 req/s, 40 four-s
# bursts, 20 doublings; read over 3 s as live / over a sliding 6 s): 3.5 and 1.5 gave 0 / 1 false rises,
# 0 / 1 bursts taken, the doubling seen a median 22.5 / 19.5 s after it began (at worst 40.5 / 25.5);
# 3 and 1.5: 0 / 1, 0 / 2, the same times; 3.5 and 1: 0 / 3, 0 / 4, 19.5 / 19.5 (34.5 / 25.5); 3.5 and 2:
# none taken, but up to 51 s late. All four see chat's recorded run-16 doubling at the same tick.
RISE_HOLD_OF_STARTUP = 0.5
RISE_Z = 3.5
RISE_TICK_Z = 1.5


def _spread_ratio(ratios: tuple[float, ...], lag_ticks: int) -> float:
    """The noise of one ratio observed / expected: the median absolute difference of ratios `lag_ticks`
    apart (readings whose windows do not overlap) as a normal sd (x 1.4826), over sqrt(2) for the
    difference of two; robust to the rare bursts and to level changes in the window."""
    diffs = sorted(abs(ratios[i] - ratios[i - lag_ticks]) for i in range(lag_ticks, len(ratios)))
    return 1.4826 * diffs[len(diffs) // 2] / math.sqrt(2.0)


def _overlap_sum(hold_ticks: int, lag_ticks: int) -> float:
    """Sum over the hold's pairs of ticks of their rates' correlation: windows `lag_ticks` long that
    overlap by (lag - d) / lag at d ticks apart."""
    pairs = sum((hold_ticks - d) * (1.0 - d / lag_ticks) for d in range(1, min(hold_ticks, lag_ticks)))
    return hold_ticks + 2.0 * pairs


def held_rise(spec: PolicySpec, fs: ForecastState, startup_s: float) -> tuple[float, str] | None:
    """(the level it holds, a reason line) if demand rose above the forecast and held there for the hold
    (see the module docstring, "Ramps"); None otherwise."""
    window_s = max(spec.rate_window_s or spec.tick_s, spec.tick_s)
    lag = max(1, math.ceil(window_s / spec.tick_s - 1e-9))
    hold = lag + math.ceil(RISE_HOLD_OF_STARTUP * startup_s / spec.tick_s - 1e-9)
    if fs.kind == "none" or len(fs.rates) < hold or len(fs.ratios) < hold + lag + _MIN_RATIOS:
        return None
    expected = point(fs, 1)
    if expected <= 0:
        return None
    span = fs.rates[-hold:]
    level, lowest = sum(span) / hold, min(span)
    spread = math.sqrt(_overlap_sum(hold, lag)) / hold  # the mean's error per unit of a tick's noise
    noise = math.sqrt(expected / window_s)  # Poisson's, the least: most ticks stop here, before the sort
    if level - expected < RISE_Z * spread * noise or lowest < expected + RISE_TICK_Z * noise:
        return None
    noise = max(noise, _spread_ratio(fs.ratios[:-hold], lag) * expected)
    error = noise * spread
    if level - expected < RISE_Z * error or lowest < expected + RISE_TICK_Z * noise:
        return None
    return level, (
        f"forecast: demand rose to {level:.1f} req/s from the expected {expected:.1f} and held "
        f"{hold * spec.tick_s:.0f} s ({(level - expected) / error:.1f} standard errors, every tick above "
        f"{expected + noise:.1f}): a ramp, not a burst to confirm (if it ends: the replicas ordered for it "
        f"wait out the scale-down window; confirmed first: a start-up of its excess queued and shed)")


def level_now(fs: ForecastState, rate: float | None) -> float:
    """Demand now at the history's resolution: the mean of the bucket open so far, else the last closed
    bucket, else the latest rate. What growth is measured from (not a forecast: no trend in it)."""
    if fs.bucket_n:
        return fs.bucket_sum / fs.bucket_n
    if fs.history:
        return fs.history[-1]
    return rate or 0.0


def outage_held(spec: PolicySpec, fs: ForecastState, now: float) -> bool:
    return fs.outage_since_s is not None and now - fs.outage_since_s < spec.outage_hold_s


def _kept(spec: PolicySpec) -> int:
    return max(_MIN_RATIOS, int(spec.burst_lookback_s / spec.tick_s))


def _slide(
    window: tuple[float, ...], ordered: tuple[float, ...], value: float, *, kept: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(window, ordered) after `value` joins the window and all but its last `kept` values leave it;
    `ordered` is the window in ascending order, exactly as `sorted(window)` gives it.

    Sorting the whole window every tick (twice: ratios and rates, 240 values each at the defaults) was the
    largest cost of the forecaster's ticks between refits. Here the new value goes in after any equal one
    (`bisect_right`) and a leaving value, the oldest of the window, is taken out where its equals begin
    (`bisect_left`): among equal values (0.0 and -0.0 compare equal) the order stays that of arrival, which
    is the order `sorted`'s stable sort gives them, so every index holds the same float as in
    `sorted(window)`. The values are finite (sanitized rates, bounded ratios): with a NaN neither order
    would mean anything."""
    if len(ordered) != len(window):  # not kept in step with the window (a state built by hand)
        ordered = tuple(sorted(window))
    # In a list: one copy in and one out, where slicing the tuple around each insertion and removal made four.
    values = list(ordered)
    values.insert(bisect.bisect_right(values, value), value)
    for gone in window[: max(0, len(window) + 1 - kept)]:
        j = bisect.bisect_left(values, gone)
        del values[j : j + 1]  # as the tuple's slices: nothing past the end (a value not in a state built by hand)
    return (window + (value,))[-kept:], tuple(values)


def _quantile(spec: PolicySpec, values: tuple[float, ...], ordered: tuple[float, ...]) -> float | None:
    """The `burst_quantile` of the window `values`; `ordered` is it sorted, if kept in step (`_slide`)."""
    if len(values) < _MIN_RATIOS:
        return None
    if len(ordered) != len(values):
        ordered = tuple(sorted(values))
    return ordered[min(len(ordered) - 1, int(spec.burst_quantile * len(ordered)))]


def envelope(spec: PolicySpec, fs: ForecastState) -> tuple[float | None, float | None]:
    """The burst envelope's two quantiles (ratio, recent rate), computed once per tick."""
    return _quantile(spec, fs.ratios, fs.ratios_sorted), _quantile(spec, fs.rates, fs.rates_sorted)


def forecast(
    spec: PolicySpec, fs: ForecastState, *, now: float, start_s: float, end_s: float,
    quantiles: tuple[float | None, float | None] | None = None,
) -> tuple[float, float] | None:
    """(peak point forecast, upper bound) over [now + start_s, now + end_s]; None before any history."""
    if fs.kind == "none" or fs.bucket_start_s is None:
        return None
    width = spec.forecast_bucket_s
    first = max(1, 1 + math.floor((now + start_s - fs.bucket_start_s) / width))
    last = max(first, 1 + math.floor((now + end_s - fs.bucket_start_s) / width))
    peak = max(point(fs, h) for h in range(first, last + 1))
    ratio, recent = quantiles if quantiles is not None else envelope(spec, fs)
    if ratio is None:
        return peak, peak
    proportional = peak * ratio
    now_point = point(fs, 1)
    if recent is None or now_point <= 0:
        return peak, proportional
    absolute = recent * max(peak / now_point, 0.0)
    return peak, max(peak, min(proportional, absolute))


def episodes(rates: tuple[float, ...], threshold: float, gap_ticks: int) -> list[int]:
    """The lengths in ticks (first to last tick at or above `threshold`) of the separate runs of per-tick
    rates at or above it; runs fewer than `gap_ticks` ticks apart are one episode."""
    spans: list[int] = []
    below = gap_ticks
    for r in rates:
        if r >= threshold:
            if below >= gap_ticks:
                spans.append(1)
            else:
                spans[-1] += below + 1
            below = 0
        else:
            below += 1
    return spans


def burst_share(fs: ForecastState, threshold: float) -> float:
    """The share of the classes never shed in the arrivals of the ticks at or above `threshold` (1.0 without
    per-class rates kept in step with the rates, or without such ticks; a tick whose classes were not
    measured counts as wholly protected)."""
    if len(fs.protected_rates) != len(fs.rates):
        return 1.0
    total = kept = 0.0
    for r, p in zip(fs.rates, fs.protected_rates):
        if r >= threshold:
            total += r
            kept += p
    return min(1.0, kept / total) if total > 0 else 1.0


def recurring_only(
    fs: ForecastState, quantiles: tuple[float | None, float | None], *, gap_ticks: int, climbing: bool,
) -> tuple[tuple[float | None, float | None], str | None]:
    """The envelope's quantiles with a one-off burst cut to its protected share (see the module docstring):
    one episode in the window, shorter than a start-up (`gap_ticks`), while demand is not climbing (a
    climb and a level that holds for a start-up are demand, not bursts). A burst counts from halfway
    between the point forecast and the rate quantile, and never below the cut: a rate the cut covers is
    served by it, so it shows no burst the cut would miss (without that floor, a tick near the cut two
    minutes after a burst to 2x joined it into one episode longer than a start-up once the forecast had
    fallen, and the cut was dropped: the short-burst drill's runs 4, 9 and 10).

    The share is the burst's own: of the arrivals in the ticks that reached its height (the rate quantile,
    `burst_share`), the same on every tick while they are in the window, and not diluted by lower ticks
    that a different mix brought near it. With this tick's share instead (some 60 requests a tick in the
    short-burst drill, sd about 6 points), one tick at 72-74 % against the trace's 70 % sized the cut a
    replica higher two minutes after the burst, and the scale-down window kept it (runs 14-18, 4 of 5)."""
    ratio, recent = quantiles
    base = point(fs, 1)
    if climbing or recent is None or base <= 0 or recent <= base:
        return quantiles, None
    share = burst_share(fs, recent)
    if share >= 1.0:
        return quantiles, None
    cut = max(base, recent * share)
    spans = episodes(fs.rates, max(base + 0.5 * (recent - base), cut), gap_ticks)
    if len(spans) != 1 or spans[0] >= gap_ticks:
        return quantiles, None
    return (ratio, cut), (f"forecast: one burst to {recent:.1f} req/s in the window, not yet a pattern: "
                          f"sized for its protected {share:.0%} ({cut:.1f} req/s) until one recurs")
