"""Calibration of the forecast's upper bound at the lead time (stages learn and predictive), as split
conformal prediction does it, online.

The burst envelope (`forecast.py`) claims a `burst_quantile` bound (0.99: exceeded on 1 % of ticks), but it
is the smaller of two quantile envelopes, measured one bucket ahead: on servegen-m-small the rate at a tick
exceeded the bound issued one tick earlier on 6.9 % of ticks. The bound's own record says by how much it is
off. Every tick the predictive stage issues the bound for now + lead time; when that time comes, the
learn stage scores it, observed rate / bound (a ratio, since errors scale with the level). The bound used is
the raw bound x the conformal quantile of the last `burst_lookback_s` of scores: the
ceil((n + 1) x q)-th smallest of n, q = `burst_quantile`, the finite-sample rank under which a new score
is at most it with probability q when the scores are exchangeable. So a bound that is exceeded too often
widens, by what its misses were, and one that is never reached narrows, never below the point forecast.

What is scored is the forecaster's raw bound, before the calibration and before a one-off burst is cut to
its protected share (that cut is a decision about what to provision, not an error of the forecast), so the
factor is not fed by itself. Not scored, so that a silence is not read as the forecast's error:
- ticks of an ingress outage the forecaster holds (not learned either);
- bounds issued during a silence the forecaster remembers (`ForecastState.interrupted_per_s`, not yet
  returned) and for one lead time after the return, when the forecaster has learned zeros and the return's
  own rule (`forecast.returning`) sizes the fleet: otherwise the return, scored against a bound near zero,
  would multiply every bound of the next hour by up to `MAX_SCORE`.
A tick without a measured rate scores nothing; bounds due then are dropped.
"""

from __future__ import annotations

import math

from policies.spec import PolicySpec
from policies.types import ForecastState

MAX_SCORE = 50.0  # as the envelope's ratios: a bound near zero does not make a score of thousands
MIN_SCORES = 8  # as the envelope: before that, the raw bound


def scored(spec: PolicySpec, fs: ForecastState, rate: float | None, now: float) -> ForecastState:
    """Score the bounds due by `now` against this tick's rate (None: dropped) and keep the last
    `burst_lookback_s` of scores."""
    due = [upper for at_s, upper in fs.issued if at_s <= now]
    if not due:
        return fs
    issued = tuple(e for e in fs.issued if e[0] > now)
    if rate is None:
        return fs.changed(issued=issued)
    new = tuple(min(MAX_SCORE, rate / upper) if upper > 0 else MAX_SCORE for upper in due)
    kept = max(MIN_SCORES, int(spec.burst_lookback_s / spec.tick_s))
    return fs.changed(issued=issued, scores=(fs.scores + new)[-kept:])


def issue(fs: ForecastState, *, now: float, lead_s: float, upper: float) -> ForecastState:
    """Remember the raw bound for now + lead time, to be scored then; nothing during a silence or within
    one lead time of its return (see the module docstring)."""
    if fs.interrupted_per_s is not None and (fs.returned_at_s is None or now - fs.returned_at_s < lead_s):
        return fs
    return fs.changed(issued=fs.issued + ((now + lead_s, upper),))


def factor(spec: PolicySpec, fs: ForecastState) -> float | None:
    """The conformal quantile of the scores (the bound's multiplier), None before `MIN_SCORES` of them."""
    n = len(fs.scores)
    if n < MIN_SCORES:
        return None
    rank = min(n, math.ceil((n + 1) * spec.burst_quantile))
    return sorted(fs.scores)[rank - 1]
