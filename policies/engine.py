"""`decide(spec, state, signals, now) -> (Decision, PolicyState)`: the predictive policy.

A tick is a fold over `STAGES`: each stage is a function `(spec, tick) -> tick` in its own module of
`policies/stages/` (whose docstring carries its number in this tuple), taking the frozen per-tick value
`types.Tick` and returning it with its findings added: sizing figures, what the state remembers, and a
reason line for every change it made to the outcome. `docs/stages.md` lists the stages in this order.

Safety rules:
- no cluster state, or neither a demand rate nor in-flight: a stage sets `Tick.hold`, the fold stops and
  the decision is `valid=False` with replicas = current; actuators leave the cluster alone.
- a demand signal (queue, in-flight, arrival rate or counter) missing, stale or reset: the decision may
  scale up, never down ("hold" reason). Auxiliary signals (p99, memory headroom, tokens, service time)
  that are missing are named in the reasons and simply not used; so are implausible magnitudes
  (`sanitize.PLAUSIBLE_MAX`): `decide` never raises, whatever float or count comes in.
- a valid decision lies within [min_replicas, max_replicas], also when what runs is outside (bounds); with
  `idle_after_s` set, 0 when idle that long (idle), and never 0 while there is demand.
"""

from __future__ import annotations

from typing import Callable

from policies.sizing import replicas_for_rate
from policies.spec import PolicySpec
from policies.stages import (
    bounds,
    budget,
    combine,
    cost,
    demand,
    feedback,
    idle,
    leadtime,
    learn,
    placement,
    predictive,
    reactive,
    sanitize,
    shedding,
    warmpool,
)
from policies.stages.forecast import Fitter
from policies.types import Decision, PolicyState, Signals, Tick

__all__ = ["STAGES", "decide", "initial_state", "replicas_for_rate"]

Stage = Callable[[PolicySpec, Tick], Tick]

STAGES: tuple[Stage, ...] = (
    sanitize.stage,  # 1: trusted floats or None; no cluster state: hold
    learn.stage,  # 2: service time, demand history, start-ups, node waits; no demand signal: hold
    leadtime.stage,  # 3: start-up + node provisioning when no slot is free
    demand.stage,  # 4: outage, refit, steady climb
    feedback.stage,  # 5: sizing headroom from p99
    reactive.stage,  # 6: replicas for the load now
    predictive.stage,  # 7: replicas for the upper forecast at the lead time, early orders on a climb
    combine.stage,  # 8: max(sustained reactive, predictive); neither: hold
    bounds.stage,  # 9: min/max, rate limit, stabilization, no scale-down on missing data
    placement.stage,  # 10: ordered replicas no node can be made for
    warmpool.stage,  # 11: warm slots for the forecast peak and the growth risk
    budget.stage,  # 12: replicas and warm slots within the GPU budget
    shedding.stage,  # 13: shed levels and the saturation guard
    cost.stage,  # 14: GPUs held and their price
    idle.stage,  # 15: scale to zero when idle for idle_after_s, wake at once on demand
)


def initial_state() -> PolicyState:
    return PolicyState()


def decide(
    spec: PolicySpec, state: PolicyState, signals: Signals, now: float, *, fit: Fitter | None = None
) -> tuple[Decision, PolicyState]:
    """One tick of the predictive policy: what to run now, given what was measured at `now`.

    `state` is what the previous call returned (`initial_state()` at start); the returned state goes into
    the next call. Pure: the same arguments always give the same result, so a replay of recorded signals
    reproduces the live decisions exactly. `Decision.valid` is False when the signals cannot support a
    decision (no cluster state, no demand signal): the caller then leaves the cluster as it is. Every stage
    that changed the outcome adds a line to `Decision.reasons`. `fit`: where a due statsmodels refit runs
    (`forecast.Fitter`; None: in this process); any fitter gives the same bits, or raises and the previous
    parameters stay."""
    tick = Tick(signals=signals, now=now, state=state, fit=fit)
    for stage in STAGES:
        tick = stage(spec, tick)
        if tick.hold is not None:
            return _hold(tick)
    return _decision(spec, tick)


def _hold(tick: Tick) -> tuple[Decision, PolicyState]:
    """A decision nobody acts on: replicas stay as they are and the shed levels of the last valid decision
    stay in force (the admission endpoint does not read an invalid decision either). What the tick
    learned before it held is kept."""
    dropped = tick.clean.dropped if tick.clean is not None else ()
    reasons = (f"hold: {tick.hold}",) + dropped
    return Decision(replicas=tick.current, valid=False, reasons=reasons, shed=dict(tick.state.shed)), tick.state


def _decision(spec: PolicySpec, tick: Tick) -> tuple[Decision, PolicyState]:
    """The decision the stages reached, and the state that remembers it."""
    assert tick.clean is not None and tick.clean.cluster is not None
    ready_slots = tick.clean.cluster.ready_replicas * spec.replica_concurrency
    decision = Decision(
        replicas=tick.replicas,
        warm_slots=tick.warm,
        shed=tick.shed,
        saturation_queue_depth=tick.saturation_depths,
        saturation_slots=ready_slots,
        saturation_drain_per_s=round(ready_slots / tick.service_s, 3),
        saturation_reserve=tick.saturation_reserve,
        forecast_rate_per_s=tick.predicted[0] if tick.predicted else None,
        forecast_upper_rate_per_s=tick.predicted[1] if tick.predicted else None,
        lead_time_s=tick.lead_s,
        node_provisioning_s=tick.node_s,
        refitted=demand.refitted(tick.state.forecast, tick.now),
        unplaceable_replicas=tick.unplaceable,
        capped_by_budget=tick.capped,
        wake_start=tick.state.woke_onto if tick.state.woke_at_s is not None else None,
        reasons=tick.reasons,
    )
    return decision, tick.state.changed(last_replicas=tick.replicas)
