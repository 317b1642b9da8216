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
  confirmation: a held request waits for exactly one cold start, not one more for the confirmation. The
  wake's line and the decision's `wake_start` (while the wake lasts) say where its first replica lands:
  "slot", a free warm or idle slot (a pod start-up), or "node", a new node first (the lead time's).
- waking (from the wake until the requests held are released and every replica ordered is Ready or the
  queue is empty, `PolicyState.woke_at_s`): the whole wake is ordered on its first tick with a rate, one
  cold start, not grown tick by tick through burst confirmation and the scale-up limit (each step would wait
  a cold start of its own). The requests held are demand already waiting: when the replicas land, one lead
  time after the wake, the held backlog is `held_requests` + the arrival rate (the endpoint counts a held
  request when its hold starts) x the time left to then, and the wake orders the rate plus that backlog
  spread over one lead time (`wake_rate`), so each held request waits about one cold start, within
  `max_hold_s` (a cold start plus a margin). The rate served is the arrival rate or the forecast's upper
  bound, if higher (after a silence: the level it interrupted, `forecast.returning`); the backlog is counted
  from the arrivals measured, not the bound (on the bursty Azure code trace the bound is 4 to 5 times the
  mean). The order never shrinks during the wake. Sizing to drain the
  backlog within the queue-wait SLO instead ordered 42 to 58 replicas for a 2.5 req/s model on
  `scenario:on-off-4h` (docs/scale-to-zero.md), all landing after the same cold start; capping at the rate's
  need left the backlog to the rate's spare capacity, and on `--peak-replicas 40` 6,463 of 17,780 held
  requests waited out `max_hold_s`.
- serving and not yet idle: at least one replica, so the pipeline alone never reaches zero while demand
  was seen within `idle_after_s` (with `min_replicas: 0` it otherwise could, between requests).
Last in the pipeline so that neither the bounds nor the warm pool undo it; a GPU budget of zero still
binds (a wake beyond the budget is named, not ordered).
"""

from __future__ import annotations

from policies.sizing import replicas_for_rate
from policies.spec import PolicySpec
from policies.stages.budget import within_budget
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
        onto, how = landing(tick)
        woken = tick.then([f"wake: {seen} at zero replicas", f"wake: {how}"],
                          state=state.changed(woke_at_s=tick.now, woke_onto=onto))
        return waking(spec, woken)
    if tick.replicas >= 1 or tick.capped:
        return tick.then(state=state)
    return tick.then([f"idle: demand within the last {spec.idle_after_s:.0f} s: keeping 1 replica"],
                     state=state, replicas=1)


def landing(tick: Tick) -> tuple[str, str]:
    """Where a wake's first replica lands, and the line that says so: "slot" when a warm or idle slot is free
    (the lead time is a pod start-up), else "node" (it waits for a new node too)."""
    if tick.lead_s > tick.startup_s:
        return "node", (f"no warm or idle slot free: a new node, {tick.startup_s:.0f} s start-up + "
                        f"{tick.node_s:.0f} s node provisioning")
    return "slot", f"onto a free warm or idle slot: {tick.startup_s:.0f} s start-up"


def still_waking(tick: Tick) -> float | None:
    """The wake in progress, if any: over once no request is held and every replica is Ready or the queue has
    drained."""
    assert tick.clean is not None and tick.clean.cluster is not None
    woke, cluster, held = tick.state.woke_at_s, tick.clean.cluster, tick.clean.held_requests or 0.0
    if woke is None or (held <= 0 and (cluster.ready_replicas >= max(1, tick.current) or tick.clean.queue_depth == 0)):
        return None
    return woke


def wake_rate(*, rate_per_s: float, held: float, lead_s: float, left_s: float) -> float:
    """The rate a wake orders for: `rate_per_s` plus the backlog held when its replicas land (`held` now and
    the arrivals in the `left_s` until then) served within one lead time. E.g. 10 req/s, 50 held, 400 s
    lead time, 300 s left: 10 + (50 + 3000) / 400 = 17.6 req/s."""
    return rate_per_s + (held + rate_per_s * left_s) / max(lead_s, 1.0)


def waking(spec: PolicySpec, tick: Tick) -> Tick:
    """During a wake: the rate (or the forecast's upper bound) and the held backlog at once, never less than
    ordered; within max_replicas and the GPU budget."""
    assert tick.clean is not None and tick.clean.cluster is not None and tick.state.woke_at_s is not None
    arriving = tick.clean.arrival_rate_per_s or 0.0
    rate = max(arriving, tick.predicted[1] if tick.predicted else 0.0)
    held = tick.clean.held_requests or 0.0
    left_s = max(0.0, tick.state.woke_at_s + tick.lead_s - tick.now)
    wanted = rate - arriving + wake_rate(rate_per_s=arriving, held=held, lead_s=tick.lead_s, left_s=left_s)
    need = max(1, tick.current, min(spec.max_replicas, replicas_for_rate(spec, wanted * tick.sizing, tick.service_s)))
    replicas, warm, capped, why = within_budget(tick.clean.cluster, replicas=need, warm=tick.warm)
    if replicas == tick.replicas:
        return tick
    return tick.then([f"wake: {replicas} replicas at once for {rate:.1f} req/s and {held:.0f} held "
                      f"({wanted:.1f} req/s: the backlog at landing in {left_s:.0f} s served within one lead time)",
                      *why], replicas=replicas, warm=warm, capped=capped or tick.capped)
