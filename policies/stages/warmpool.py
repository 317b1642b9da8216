"""Stage 11, warmpool: how many free, ready GPU slots (placeholder pods) to keep.

A replica that lands on a warm slot serves after its start-up time; one that needs a new node waits for
node provisioning too. The pool is insurance, sized for two risks beyond the replicas already decided:
- the growth the upper forecast itself expects over the next start-up + node-provisioning window;
- the growth it cannot see: demand now (the forecast's level) grown by the growth risk (`growth.py`: an
  upper quantile of past increases over one node-provisioning time, at this time of day), sized with the
  same queueing model as the replicas.
Free capacity that already exists (idle node slots) counts against the pool; the pool stays within
`max_warm_slots` and the replica bound. E.g. 20 replicas decided for 26 req/s, a p99 growth of +40 %:
36 req/s needs 27 replicas, so 7 warm slots, or 4 if 3 idle node slots exist.

Hysteresis: warm slots change only when the risk changes by a slot's worth for a while. The pool rises at
once (insurance must not lag the risk) and falls only as far as the most replicas the risk asked for (the
larger of the two above, replicas + slots) within the last node-provisioning time (learned, `Tick.node_s`)
allows: a placeholder deleted and asked for again is Ready again only once a node for it is, so a slot is
released only when the risk has stayed at least one replica below it for as long as bringing it back would
take. E.g. 10 replicas and a risk of 15, 17, 15, 17 replicas from tick to tick hold 7 slots (deleting and
re-creating two placeholders every other tick would bring nodes and save nothing); a risk that falls from 17
to 15 and stays there releases two slots 300 s (provisioning) after 17 was last asked for. Replicas that grow
into the pool lower it at once: the risk did not change, the slots they took are not refilled behind them.
Idle node slots lower what is created, never what is held: a deleted placeholder leaves its node idle, billed
as before until the provisioner removes it, and that idle slot counted against the pool again, releasing the
next placeholder (a cascade that emptied the pool into idle nodes, then re-created it on new nodes once they
were gone). The risk sizes within the hold and the slots held are in `PolicyState.warm_needs` and
`warm_held`."""

from __future__ import annotations

from policies.sizing import replicas_for_rate
from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.stages.growth import growth_risk
from policies.types import Tick


def room_slots(spec: PolicySpec, replicas: int) -> int:
    """The most warm slots there may be beside `replicas`: `max_warm_slots`, within the replica bound."""
    return max(0, min(spec.max_warm_slots, spec.max_replicas - replicas))


def growth_slots(
    spec: PolicySpec, *, replicas: int, peak_replicas: int | None, risk_replicas: int | None = None,
    risk_why: str = "",
) -> tuple[int, str]:
    """The replicas beyond `replicas` the larger of the two risks needs (may be negative), and which it is."""
    needs = []
    if peak_replicas is not None:
        needs.append((peak_replicas - replicas, f"forecast peak of {peak_replicas} within node provisioning"))
    if risk_replicas is not None:
        needs.append((risk_replicas - replicas, f"{risk_replicas} replicas if demand grows as it has ({risk_why})"))
    return max(needs, key=lambda n: n[0], default=(0, ""))


def warm_slots(
    spec: PolicySpec, *, replicas: int, peak_replicas: int | None, risk_replicas: int | None = None,
    risk_why: str = "", idle_slots: int = 0,
) -> tuple[int, list[str]]:
    """The slots this tick asks for: the growth beyond `replicas`, less idle node slots, within the room."""
    growth = growth_slots(spec, replicas=replicas, peak_replicas=peak_replicas, risk_replicas=risk_replicas,
                          risk_why=risk_why)
    return asked_slots(spec, replicas=replicas, growth=growth, idle_slots=idle_slots)


def asked_slots(spec: PolicySpec, *, replicas: int, growth: tuple[int, str],
                idle_slots: int = 0) -> tuple[int, list[str]]:
    """`warm_slots` from the growth `growth_slots` gave (the stage needs that growth too)."""
    if spec.max_warm_slots == 0:
        return 0, []
    room = room_slots(spec, replicas)
    beyond, why = growth
    slots = max(0, min(room, beyond - idle_slots))
    if slots == 0:
        return 0, []
    idle = f", less {idle_slots} idle node slots" if idle_slots else ""
    capped = " (capped)" if beyond - idle_slots > room else ""
    return slots, [f"warm pool: {slots} slots{capped} beyond {replicas} replicas for {why}{idle}"]


def held_slots(needs: tuple[tuple[float, int], ...], *, need: int, now: float,
               hold_s: float) -> tuple[int, tuple[tuple[float, int], ...]]:
    """The most slots asked for within the last `hold_s`, this tick's `need` included; and the needs to
    remember. `needs` keeps only those no later need matched or exceeded (a sliding-window maximum: slots
    fall and times rise along it), so it holds one entry per level at most."""
    kept = tuple(n for n in needs if n[0] > now - hold_s and n[1] > need) + ((now, need),)
    return kept[0][1], kept


def keep_slots(needs: tuple[tuple[float, int], ...], *, held: int, asked: int, risk_replicas: int, replicas: int,
               now: float, hold_s: float) -> tuple[int, tuple[tuple[float, int], ...]]:
    """The slots to keep and the risk-sized needs to remember: what this tick asks for (`asked`: the growth
    less idle node slots) at once, and of the slots `held` so far as many as the most replicas the risk asked
    for within the last `hold_s` (`risk_replicas` now, replicas + slots) leaves beyond `replicas`. Replicas
    that grew into the pool lower it at once (the risk did not change); idle node slots never release one
    (see the module docstring)."""
    window_max, needs = held_slots(needs, need=risk_replicas, now=now, hold_s=hold_s)
    return max(asked, min(held, window_max - replicas)), needs


def hold_line(*, held: int, asked: int, growth: int, risk_replicas: int, most_replicas: int, since_s: float,
              hold_s: float) -> str:
    """Why more slots are kept than this tick asks for: the risk fell within the hold, or idle node slots would
    lower what is held (or both)."""
    parts = []
    if held > growth:
        parts.append(f"the risk asks for {risk_replicas} replicas now and asked for {most_replicas} {since_s:.0f} s "
                     f"ago; a slot is released once it has asked for fewer for {hold_s:.0f} s, the node "
                     f"provisioning a re-created one waits")
    if growth > asked:
        parts.append(f"{growth - asked} idle node slots lower what is created, not what is held (a deleted "
                     f"placeholder leaves its node idle, paid for until it is removed)")
    return f"warm pool: holding {held} slots, {asked} asked now: " + "; ".join(parts)


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Warm slots for the forecast peak within start-up + node provisioning and for the growth risk (computed
    once per forecast bucket), held while the risk asked for them within a node provisioning time; none while
    replicas cannot be placed (a placeholder would take their GPUs)."""
    assert tick.clean is not None and tick.clean.cluster is not None
    state, fs, sizing, service_s = tick.state, tick.state.forecast, tick.sizing, tick.service_s
    peak = fc.forecast(spec, fs, now=tick.now, start_s=0.0, end_s=tick.startup_s + tick.node_s,
                       quantiles=tick.quantiles)
    peak_n = replicas_for_rate(spec, peak[1] * sizing, service_s) if peak else None
    if state.growth_risk is None or state.growth_risk_for_s != fs.bucket_start_s:
        state = state.changed(growth_risk=growth_risk(spec, fs, tick.now, tick.node_s),
                              growth_risk_for_s=fs.bucket_start_s)
    assert state.growth_risk is not None
    risk, risk_why = state.growth_risk
    level = fc.level_now(fs, tick.clean.arrival_rate_per_s)
    risk_n = replicas_for_rate(spec, level * (1.0 + risk) * sizing, service_s) if level > 0 else None
    replicas, idle = tick.replicas, tick.clean.cluster.idle_slots
    risk_growth = growth_slots(spec, replicas=replicas, peak_replicas=peak_n, risk_replicas=risk_n,
                               risk_why=f"+{risk:.0%}: {risk_why}")
    asked, why = asked_slots(spec, replicas=replicas, growth=risk_growth, idle_slots=idle)
    room = room_slots(spec, replicas)
    beyond = risk_growth[0]
    growth = max(0, min(room, beyond))
    prior, held = state.warm_needs, state.warm_held
    if state.last_replicas is None and not prior:
        # a fresh state (a restart, a new leader): the Ready placeholders found were asked for by the one
        # before; held as if asked for now, so that taking over neither deletes nor re-creates them at once
        held = tick.clean.cluster.warm_slots_ready
        prior = ((tick.now, replicas + held),) if held else ()
    warm, needs = keep_slots(prior, held=held, asked=asked, risk_replicas=replicas + beyond,
                             replicas=replicas, now=tick.now, hold_s=tick.node_s)
    warm = min(room, warm)  # what is held never exceeds the room there is now
    state = state.changed(warm_needs=needs, warm_held=warm)
    if tick.unplaceable:
        return tick.then(state=state, warm=0)
    if warm > asked:
        why = [*why, hold_line(held=warm, asked=asked, growth=growth, risk_replicas=replicas + beyond,
                               most_replicas=needs[0][1], since_s=tick.now - needs[0][0], hold_s=tick.node_s)]
    return tick.then(why, state=state, warm=warm)
