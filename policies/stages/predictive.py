"""Stage 7, predictive: replicas for the upper forecast at now + lead time, and early orders on a climb.

The forecaster (`forecast.py`) gives the demand at the lead time with an upper bound (its burst envelope,
where a burst seen once is cut to its protected share until it recurs); the upper bound, times the
feedback's headroom, is sized like every rate (`sizing.replicas_for_rate`). While demand climbs steadily
(stage 4, demand), what the climb needs by the end of one start-up is ordered now, as far as warm and idle slots
(capacity already paid for) can take it, so it is ready when the demand is; without a free slot such a
replica would land after node provisioning too, and the combine stage follows the climb tick by tick.
A rise that held (stage 4, demand) is demand at the level it held: the upper bound is at least that level, the
burst envelope is not cut for it as for a one-off burst, and free slots take what it needs at once.
E.g. 10 replicas for the forecast, a climb to 14 replicas' worth, 3 warm slots: 3 ordered now, 13 in all.

With `calibrate_upper`, the upper bound is calibrated at the lead time (`calibration.py`): the raw bound
(before a one-off burst is cut) is issued for now + lead time, scored when that time comes, and the bound
used is the raw one times the `burst_quantile` of the scores.

Traffic back after a silence (`forecast.returning`): for one lead time from its first tick, the forecast is
at least the rate the silence interrupted, so the fleet for it is ordered at once instead of after a burst
confirmation on a model that learned hours of zeros. Through such a silence, once it outlasts the outage
hold, the forecast is at least what the classes never shed sent of the interrupted rate
(`forecast.kept_through_silence`).
"""

from __future__ import annotations

import math

from policies.sizing import replicas_for_rate
from policies.spec import PolicySpec
from policies.stages import calibration
from policies.stages import forecast as fc
from policies.types import ForecastState, Tick


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The envelope used, the forecast at the lead time and the replicas for it (with early orders)."""
    assert tick.clean is not None and tick.clean.cluster is not None
    fs, sizing = tick.state.forecast, tick.sizing
    full = fc.envelope(spec, fs)
    quantiles, why = fc.recurring_only(fs, full, gap_ticks=max(1, math.ceil(tick.startup_s / spec.tick_s)),
                                       climbing=tick.rising is not None or tick.held is not None)
    lines = [why] if why else []
    at_lead = {"now": tick.now, "start_s": tick.lead_s, "end_s": tick.lead_s + spec.tick_s}
    predicted = fc.forecast(spec, fs, **at_lead, quantiles=quantiles)
    if predicted is not None and spec.calibrate_upper:
        raw = predicted if quantiles == full else fc.forecast(spec, fs, **at_lead, quantiles=full)
        assert raw is not None  # the same forecaster state as `predicted`
        fs = calibration.issue(fs, now=tick.now, lead_s=tick.lead_s, upper=raw[1])
        predicted, calibrated = _calibrated(spec, fs, predicted)
        lines += calibrated
    if predicted is not None:
        predicted, back = _after_silence(spec, tick, predicted)
        lines += back
    if predicted is not None and tick.held is not None and tick.held > predicted[1]:
        predicted = (predicted[0], tick.held)
        lines.append(f"forecast: upper bound raised to the {tick.held:.1f} req/s the rise held")
    replicas = None
    if predicted is not None:
        replicas = replicas_for_rate(spec, predicted[1] * sizing, tick.service_s)
        lines.append(
            f"predictive: {replicas} replicas for upper forecast {predicted[1]:.1f} req/s "
            f"(mean {predicted[0]:.1f}, {fs.kind}, headroom {sizing:.2f}) at +{tick.lead_s:.0f} s{spec.queueing_note}"
        )
        early = _early(spec, tick, replicas)
        if early > 0:
            replicas += early
            what = (f"demand climbing steadily to {tick.rising:.1f} req/s at +{tick.startup_s:.0f} s"
                    if tick.rising is not None else f"demand held at {tick.held:.1f} req/s")
            lines.append(f"forecast: {what}; {early} replicas ordered now onto warm or idle slots")
    state = tick.state if fs is tick.state.forecast else tick.state.changed(forecast=fs)
    return tick.then(lines, quantiles=quantiles, predicted=predicted, predictive=replicas, state=state)


def _calibrated(spec: PolicySpec, fs: ForecastState, predicted: tuple[float, float]
                ) -> tuple[tuple[float, float], list[str]]:
    """The upper bound times the conformal quantile of its past scores at the lead time (`calibration.py`),
    never below the point forecast."""
    k = calibration.factor(spec, fs)
    if k is None:
        return predicted, []
    point, upper = predicted
    calibrated = max(point, upper * k)
    return (point, calibrated), [
        f"forecast: upper bound {upper:.1f} x {k:.3f} = {calibrated:.1f} req/s, the p{spec.burst_quantile * 100:g} "
        f"of observed / bound at the lead time over the last {len(fs.scores)} ticks (calibrated)"]


def _after_silence(spec: PolicySpec, tick: Tick, predicted: tuple[float, float]
                   ) -> tuple[tuple[float, float], list[str]]:
    """The forecast through a silence (at least what its protected classes sent) and when traffic is back
    after it (at least the rate it interrupted, for one lead time from the return; see the module
    docstring)."""
    fs = tick.state.forecast
    kept = fc.kept_through_silence(spec, fs, tick.now)
    if kept is not None and kept > predicted[1]:
        assert fs.interrupted_per_s is not None  # kept_through_silence checked it
        return (predicted[0], kept), [
            f"forecast: silence: keeping capacity for the {kept:.1f} req/s the classes never shed sent of the "
            f"{fs.interrupted_per_s:.1f} req/s it interrupted (if it never returns: up to a day of these GPUs; "
            f"if it does and nothing was kept: a cold start of misses for the classes that must not miss)"]
    back = fc.returning(fs, tick.now, tick.lead_s)
    if back is None or back <= predicted[1]:
        return predicted, []
    return (max(predicted[0], back), back), [
        f"forecast: traffic back after a silence: the {back:.1f} req/s it interrupted is expected, not a burst "
        f"to confirm (if it fades: one lead time of GPUs; if it were confirmed first: a cold start of misses)"]


def _early(spec: PolicySpec, tick: Tick, predictive: int) -> int:
    """Replicas the climb (or the level a rise held) needs beyond `predictive`, within the free warm and
    idle slots (0: none)."""
    assert tick.clean is not None and tick.clean.cluster is not None
    free = tick.clean.cluster.warm_slots_ready + tick.clean.cluster.idle_slots
    rate = tick.rising if tick.rising is not None else tick.held
    if rate is None or not free:
        return 0
    return min(free, replicas_for_rate(spec, rate * tick.sizing, tick.service_s) - predictive)
