"""Stage 15, idle: scale to zero after `idle_after_s` without demand, and back to one at the first request.

Off unless `idle_after_s` is set: the stage then leaves the tick exactly as the stages before made it.
- idle: the arrival rate, in-flight requests and the queue all read zero, each present and fresh (and
  requests held at the gateway, when reported, too). Missing data never counts as idle: a tick on which
  any of the three is missing or dropped restarts the idle clock (`PolicyState.idle_since_s`).
- to zero: idle for `idle_after_s` -> 0 replicas and 0 warm slots, whatever `min_replicas` says
  (`min_replicas` is the floor of a model that is serving; `idle_after_s` is the opt-in to zero).
- at zero: no demand -> stays at 0 (the forecast alone does not wake a model; missing data does not
  either: staying at zero is not a scale-down). Demand of any kind (a request arriving, a queue, in-flight
  requests or a held request) -> at least one replica at once, with no stabilization and no burst
  confirmation: a held request waits for exactly one cold start, not one more for the confirmation.
- waking (from the wake until every replica ordered is Ready or the queue is empty,
  `PolicyState.woke_at_s`): at most what the arrival rate needs (or the forecast, if higher). The queue
  that builds during the cold start is held demand, not load: sizing to drain it within the SLO ordered
  42 to 58 replicas for a 2.5 req/s model on `scenario:on-off-4h` (docs/scale-to-zero.md), all landing
  after the same cold start, when the three the rate needs drain it within minutes.
- serving and not yet idle: at least one replica, so the pipeline alone never reaches zero while demand
  was seen within `idle_after_s` (with `min_replicas: 0` it otherwise could, between requests).
Last in the pipeline so that neither the bounds nor the warm pool undo it; a GPU budget of zero still
binds (a wake beyond the budget is named, not ordered).
"""

from __future__ import annotations

from policies.sizing import replicas_for_rate
from policies.spec import PolicySpec
from policies.types import Clean, Tick


def demand(clean: Clean) -> dict[str, float]:
    """The demand signals that read above zero, by name."""
    values = {"arrival_rate_per_s": clean.arrival_rate_per_s, "in_flight": clean.in_flight,
              "queue_depth": clean.queue_depth, "held_requests": clean.held_requests}
    return {name: v for name, v in values.items() if v is not None and v > 0}


def quiet(clean: Clean) -> bool:
    """Every demand signal present, fresh and zero (held requests only if reported)."""
    needed = (clean.arrival_rate_per_s, clean.in_flight, clean.queue_depth)
    return all(v is not None for v in needed) and not demand(clean)


def idle_since(clean: Clean, since_s: float | None, now: float) -> float | None:
    if not quiet(clean):
        return None
    return now if since_s is None else since_s


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """0 replicas and warm slots when idle long enough; at least 1 on demand at zero or while not idle."""
    if spec.idle_after_s is None:
        return tick
    assert tick.clean is not None
    since = idle_since(tick.clean, tick.state.idle_since_s, tick.now)
    state = tick.state.changed(idle_since_s=since, woke_at_s=still_waking(tick))
    if since is not None and tick.now - since >= spec.idle_after_s:
        why = [] if tick.replicas == 0 and tick.current == 0 else [
            f"idle for {tick.now - since:.0f} s: scaling to zero"]
        return tick.then(why, state=state.changed(woke_at_s=None), replicas=0, warm=0, shed={},
                         saturation_depths={})
    wanting = demand(tick.clean)
    if tick.current == 0 and not wanting:
        why = [] if tick.replicas == 0 else ["idle: at zero, no request: staying at zero"]
        return tick.then(why, state=state, replicas=0, warm=0)
    if tick.current > 0 and state.woke_at_s is not None:
        return waking(spec, tick.then(state=state))
    if tick.current == 0:
        if tick.replicas == 0 and tick.capped:
            return tick.then(["idle: demand, but the GPU budget allows no replica"], state=state)
        seen = ", ".join(f"{name} {v:g}" for name, v in sorted(wanting.items()))
        woken = tick.then([f"wake: {seen} at zero replicas"], state=state.changed(woke_at_s=tick.now))
        return waking(spec, woken)
    if tick.replicas >= 1 or tick.capped:
        return tick.then(state=state)
    return tick.then([f"idle: demand within the last {spec.idle_after_s:.0f} s: keeping 1 replica"],
                     state=state, replicas=1)


def still_waking(tick: Tick) -> float | None:
    """The wake in progress, if any: over once every replica is Ready or the queue has drained."""
    assert tick.clean is not None and tick.clean.cluster is not None
    woke, cluster = tick.state.woke_at_s, tick.clean.cluster
    if woke is None or cluster.ready_replicas >= max(1, tick.current) or tick.clean.queue_depth == 0:
        return None
    return woke


def waking(spec: PolicySpec, tick: Tick) -> Tick:
    """During a wake: at least one replica, at most the arrival rate's (or the forecast's) need."""
    assert tick.clean is not None
    rate = tick.clean.arrival_rate_per_s or 0.0
    need = max(1, replicas_for_rate(spec, rate * tick.sizing, tick.service_s), tick.predictive or 0)
    if tick.replicas > need:
        return tick.then([f"wake: {need} replicas for {rate:.1f} req/s, not {tick.replicas} to drain the queue "
                          "held during the cold start (they would land after it too)"], replicas=need)
    return tick.then([f"wake: {max(1, tick.replicas)} replicas at once"] if tick.current == 0 else [],
                     replicas=max(1, tick.replicas))
