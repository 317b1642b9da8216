"""Stage 9, bounds: min/max, scale-up rate limit, scale-down stabilization, no scale-down on missing data.

- scale-up: at most max(`scale_up_limit_replicas`, `scale_up_limit_ratio` x current) more per tick, like the
  HPA's default policies (4 pods or 100 % per period, the larger).
- scale-down: to the highest recommendation within the stabilization window, which is never shorter than
  the current lead time: capacity released now could not come back before then. A fresh state counts the
  current replicas as a recommendation, so a (re)started controller never scales down on its first tick.
  Within a tick of the last decision (the loop ticks on each held request at a wake, tens of milliseconds
  apart), a scale-down is measured from the higher of what runs and that decision: the Deployment read
  has not caught up with it (KEDA's HPA applies a decision at its next sync), and against what ran alone a
  decision of 11 fell back to 8 on the next tick whenever the climb detector flickered, and KEDA read either
  (live, `scale-to-zero-keda` runs 39-43: 5 to 11 such drops at each wake). A tick or more after it, what
  runs is the measure, as before: the fleet's allocation may have trimmed the decision on purpose.
- lean when steady: `scale_down_stabilization_s` beyond the lead time is insurance against bursts the
  forecast does not cover. While the traffic's own burst envelope says it is steady (the p99 of per-tick
  rate / forecast over `burst_lookback_s` at or under `steady_burst_ratio`), the predictive figure, sized
  for that p99 at now + lead time, already covers them, and the window is the lead time alone. On steady
  Mooncake the window's max over noisy recommendations held 2-3 replicas (about 8 %) above the forecast's.
- min/max hold over both: replicas running outside [min_replicas, max_replicas] (a controller started
  beside 100 replicas with max 64, or beside none with min 10) are brought to the bound at once, as the
  HPA does, with a reason. Stabilization would otherwise hold 100 for a window, the actuator clamp to 64,
  and the log and the action disagree.
- missing data: while a demand signal (queue, in-flight, arrival rate or counter) is dropped, the decision
  may scale up, never down (`sanitize.blocks_scale_down`); every dropped signal is named.
"""

from __future__ import annotations

import math

from policies.spec import PolicySpec
from policies.stages.sanitize import blocks_scale_down
from policies.types import Tick


def bound(
    spec: PolicySpec,
    *,
    wanted: int,
    current: int,
    recommendations: tuple[tuple[float, int], ...],
    lead_s: float,
    now: float,
    steady: bool = False,
    decided: int | None = None,
) -> tuple[int, tuple[tuple[float, int], ...], list[str]]:
    """`decided`: the replicas last decided, if less than a tick ago (else None): a scale-down is measured
    from the higher of it and `current` (see the module docstring)."""
    reasons: list[str] = []
    clamped = min(spec.max_replicas, max(spec.min_replicas, wanted))
    if clamped != wanted:
        reasons.append(f"bounds: {wanted} clamped to [{spec.min_replicas}, {spec.max_replicas}]")
    window = lead_s if steady else max(spec.scale_down_stabilization_s, lead_s)
    if not recommendations:
        # A controller that just started (or restarted) knows nothing of the last window: what runs now
        # counts as a recommendation, so it cannot scale down before a full window of its own evidence.
        recommendations = ((now, current),)
    history = tuple(e for e in recommendations if now - e[0] < window) + ((now, clamped),)
    result = clamped
    ran = max(current, decided) if decided is not None else current
    if clamped < ran:
        stabilized = min(ran, max(r for _, r in history))
        held = min(stabilized, spec.max_replicas)  # what runs above max_replicas is not held (below)
        if held > clamped:
            reasons.append(f"bounds: holding {held} (highest need in the last {window:.0f} s"
                           + (", one lead time: steady traffic)" if steady else ")"))
        result = stabilized
    limit = current + max(spec.scale_up_limit_replicas, math.ceil(spec.scale_up_limit_ratio * current))
    if result > limit:
        reasons.append(f"bounds: scale-up limited to {limit} this tick")
        result = limit
    return within_bounds(spec, result, current, reasons), history, reasons


def within_bounds(spec: PolicySpec, replicas: int, current: int, reasons: list[str]) -> int:
    """`replicas` within [min_replicas, max_replicas]; only ever moves them when what runs is outside."""
    if replicas > spec.max_replicas:
        reasons.append(f"bounds: {current} running, above max_replicas: {spec.max_replicas} now")
        return spec.max_replicas
    if replicas < spec.min_replicas:
        reasons.append(f"bounds: {current} running, below min_replicas: {spec.min_replicas} now")
        return spec.min_replicas
    return replicas


def _just_decided(spec: PolicySpec, tick: Tick) -> int | None:
    """The replicas last decided, if that was less than a tick ago (the last recommendation's time)."""
    recommendations = tick.state.recommendations
    if tick.state.last_replicas is None or not recommendations or tick.now - recommendations[-1][0] >= spec.tick_s:
        return None
    return tick.state.last_replicas


def steady(spec: PolicySpec, tick: Tick) -> bool:
    """The traffic's burst envelope (the predictive stage's p99 of rate / forecast) within `steady_burst_ratio`."""
    ratio = tick.quantiles[0]
    return ratio is not None and spec.steady_burst_ratio > 0 and ratio <= spec.steady_burst_ratio


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The wanted replicas bounded; while a demand signal is missing, never below what runs. Names what
    sanitize dropped."""
    assert tick.clean is not None
    replicas, recommendations, why = bound(spec, wanted=tick.replicas, current=tick.current,
                                           recommendations=tick.state.recommendations, lead_s=tick.lead_s,
                                           now=tick.now, steady=steady(spec, tick), decided=_just_decided(spec, tick))
    if blocks_scale_down(tick.clean.dropped) and replicas < min(tick.current, spec.max_replicas):
        replicas = min(tick.current, spec.max_replicas)
        why.append("hold: not scaling down while demand signals are missing")
    why += [f"dropped {d}" for d in tick.clean.dropped]
    return tick.then(why, replicas=replicas, state=tick.state.changed(recommendations=recommendations))
