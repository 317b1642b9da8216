"""Stage 13, shedding: reject the lowest priorities when ready capacity cannot meet the SLO before new capacity lands.

Demand is the arrival rate, plus the rate needed to drain the queue within the SLO unless the saturation
guard (below) covers every sheddable class; capacity is the arrival rate that ready slots serve with
P(wait > SLO) <= `SHED_MISS_RATIO` (k - 1 slots per replica behind per-replica gateway queues, as sizing
counts them: `PolicySpec.gateway_queues`). The excess is taken from the lowest priority class first, as a fraction
of that class's arrivals, then the next, but only from classes below `shed_priority_below`: the highest
priority is never shed. Recomputed every tick, so shedding stops as capacity arrives.

Why the queue is the guard's, not the level's: a level stays in force for a whole tick, whatever happens in
it, while the guard rejects per request on the live queue. A backlog left by a burst drains within seconds
once the burst ends; a level sized to drain it kept rejecting a fraction of the class for the rest of the
tick after the queue was gone (on the bundled Azure trace a 15-s burst of 1045 req/s against ~700 of ready
capacity and 1006 queued shed all sheddable requests of the next tick, which arrived at 622 req/s and
needed no shedding: 6 of 10 arrival seeds over the 5 % allowance). The guard rejects exactly while the
backlog is there, so the level is left to the excess of the arrival rate itself.

Ticks are too coarse for bursts that build a queue within seconds, so the decision also carries a
saturation guard for the admission endpoint (as the Gateway API inference extension's saturation detector
does): while the live queue is deep enough that a new request would wait w x SLO (q x E[S] / slots), the
guarded priorities are rejected one by one. The lowest priority is guarded at w = `saturation_wait_ratio`,
the next ones up to w = `saturation_wait_max_ratio` (0.8): a request that would wait about the SLO would
miss it anyway, and admitting it would push the highest priority queued behind it past its SLO too, so
the last guard sits a margin below the SLO. The highest priority is always admitted. E.g. 40 ready
replicas x 16 slots, 0.7 s per request, 2 s SLO: sheddable guarded at 640 x 0.5 x 2 / 0.7 ~ 914 queued
requests, standard at ~1463.

Traffic back after a silence that outlasted the outage hold meets a fleet sized for the silence (its
capacity released, the protected classes' kept: `forecast.kept_through_silence`). From the return until the
replicas ordered for it are Ready (fewer Ready than decided, less those no node can be made for: stage
placement), every guarded class is rejected at a queue of 1: the highest class then waits behind no other,
in a server that serves first come first served. On
`scenario:silence` seed 1, 7 replicas through the silence (`min_replicas: 7`) without the hard guard left
critical at 99.40 %: the return's standard and sheddable requests filled the queue to the guard's depth in
front of it.

The guard lasts at most a start-up plus a node's provisioning from its start (`returning_guard_s`,
`hard_guard`): the longest a replica ordered then takes to be Ready, so capacity that comes later than the
policy reckons does not keep it for good. It starts within that time of the return, when fewer replicas
are Ready than are decided and can get a node: at the return itself when the silence left too few for the level
coming back, later when they serve it until the windowed rate shows it. Live (closed loop `silence`, run 15,
sized per replica) 5 Ready met the return and 8 were decided 98 s after it; bounded from the return, the
guard ended 184 s before the 8 were Ready, short of the lead time they were ordered with.
Not the tick's lead time: that is for a replica ordered now,
and it drops by a node's provisioning as soon as one slot is free, while the replicas the guard waits for
still wait for their nodes. E.g. live (closed loop `silence`, run 2): 4 Ready at the return, 7 decided by
minute 2.4 after it, a lead time of 550 s (140 s start-up + 410 s for a node); 6.2 minutes on, the warm
pool's placeholders were Ready, the lead time fell to 140 s and the guard, which then lasted one lead time
of each tick, ended 1.1 and 2.5 minutes before the ordered replicas were Ready; a critical request waited
3.02 s behind standard ones meanwhile. Now it lasts until the 7 are Ready (8.7 minutes), within 550 s of its start; a
guard off for a tick (as many Ready as decided) that comes back keeps its start and its bound.

Behind per-replica gateway queues (`gateway_queues: per-replica`: nginx's least_conn commits each request to one
server) a highest-class request that finds every slot busy waits for its own server's next completion, so the
stage also sizes the Ready slots the endpoint keeps free for it (`top_reserve`, `policies/reserve.py`): the
guarded classes are rejected while all but those are busy. 0 with shared queues, and whenever the queue
without a reserve already keeps the highest class within the sizing target, except while the return's hard
guard is on: then at least one slot is kept. The hard guard leaves the highest class waiting behind no other
in a queue, but the lower classes still take every free slot while nothing waits, and a highest-class request
that nginx then commits to a full server waits for that server's next completion. Live (closed loop `silence`,
runs 11 and 12, sized for a shared queue behind nginx's least_conn): 32 and 33 requests in the 32 Ready slots,
the last admitted before it a standard one 0.5 and 0.05 s earlier, and the next critical request waited 2.7
and 3.4 s, one of 907 after the return (99.890 % against 99.9 %; runs 7 and 8 each lost one while the guard
was on too). The slot costs the lower classes only while the guard is on, when they are already rejected at a
queue of 1.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.queueing import rate_within_slo
from policies.reserve import reserve_slots
from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.types import Clean, Tick

SHED_MISS_RATIO = 0.01


def saturation_depths(spec: PolicySpec, ready_replicas: int, service_s: float) -> dict[str, int]:
    top = max(spec.priorities.values(), default=0)
    guarded = sorted((p, name) for name, p in spec.priorities.items() if p < spec.guard_priority_below and p < top)
    slots = ready_replicas * spec.replica_concurrency
    depths = {}
    for i, (_, name) in enumerate(guarded):
        step = i / (len(guarded) - 1) if len(guarded) > 1 else 0.0
        ratio = spec.saturation_wait_ratio + (spec.saturation_wait_max_ratio - spec.saturation_wait_ratio) * step
        depths[name] = max(1, int(slots * ratio * spec.slo_queue_wait_s / service_s))
    return depths


def protected_share(spec: PolicySpec, rates: Mapping[str, float]) -> float:
    """The share of arrivals in classes that are never shed (1.0 without per-class rates)."""
    total = sum(rates.values())
    if total <= 0:
        return 1.0
    kept = sum(v for name, v in rates.items() if spec.priorities.get(name, spec.shed_priority_below)
               >= spec.shed_priority_below)
    return kept / total


def shed_levels(spec: PolicySpec, clean: Clean, service_s: float,
                depths: Mapping[str, int] | None = None) -> tuple[dict[str, float], list[str]]:
    """`depths`: the saturation guard's (`saturation_depths` of the clean cluster's ready replicas and
    `service_s`), when the caller has them already."""
    sheddable = sorted(
        (p, name) for name, p in spec.priorities.items() if p < spec.shed_priority_below
    )
    levels = {name: 0.0 for _, name in sheddable}
    rate, cluster = clean.arrival_rate_per_s, clean.cluster
    if rate is None or cluster is None or not sheddable:
        return levels, []
    capacity = rate_within_slo(
        servers=cluster.ready_replicas * spec.queueing_slots_per_replica,
        service_s=service_s,
        wait_s=spec.slo_queue_wait_s,
        miss_ratio=SHED_MISS_RATIO,
    )
    guarded = saturation_depths(spec, cluster.ready_replicas, service_s) if depths is None else depths
    backlog = 0.0 if all(name in guarded for _, name in sheddable) else (clean.queue_depth or 0.0)
    demand = rate + backlog / spec.slo_queue_wait_s
    excess = demand - capacity
    if excess <= 0:
        return levels, []
    if not clean.arrival_rate_by_priority:
        return levels, [f"shedding: {excess:.1f} req/s over capacity, but no per-priority arrival rates"]
    reasons = []
    for _, name in sheddable:
        class_rate = clean.arrival_rate_by_priority.get(name, 0.0)
        if class_rate <= 0 or excess <= 0:
            continue
        fraction = min(1.0, excess / class_rate)
        levels[name] = round(fraction, 3)
        excess -= fraction * class_rate
        reasons.append(f"shedding: {fraction:.0%} of {name} ({demand:.1f} req/s demand > {capacity:.1f} ready"
                       f"{spec.queueing_note})")
    return levels, reasons


def returning_guard_s(tick: Tick) -> float:
    """How long the hard guard after a cold return may last: a start-up plus a node's provisioning, the
    longest a replica ordered when it started takes to be Ready (see the module docstring)."""
    return tick.startup_s + tick.node_s


def hard_guard(spec: PolicySpec, tick: Tick, depths: Mapping[str, int], ready: int) -> float | None:
    """When the hard guard on for this tick started (now, if it starts now), or None when it is off: traffic
    back after a cold silence, fewer Ready replicas than are decided and can get a node, and either within
    `returning_guard_s` of the return (it starts) or of its own start (it goes on). From its start, not the
    return: the replicas it waits for were ordered then (see the module docstring)."""
    fs, longest_s = tick.state.forecast, returning_guard_s(tick)
    if not depths or ready >= tick.replicas - tick.unplaceable or fs.returned_at_s is None:
        return None
    since = tick.state.hard_guard_since_s
    if since is not None and since >= fs.returned_at_s:  # started for this return
        return since if fc.returning_cold(spec, fs, tick.now, since - fs.returned_at_s + longest_s) else None
    return tick.now if fc.returning_cold(spec, fs, tick.now, longest_s) else None


def top_reserve(spec: PolicySpec, clean: Clean, service_s: float, shed: Mapping[str, float],
                depths: Mapping[str, int]) -> tuple[int, list[str]]:
    """Slots the admission endpoint keeps free for the top class behind per-replica gateway queues
    (`policies/reserve.py`), sized at the measured rates less what is shed, at most one replica's slots; 0
    with shared gateway queues (a top-class request waits for any slot there), with no guarded class, or
    without per-class rates."""
    cluster, rates = clean.cluster, clean.arrival_rate_by_priority
    if spec.gateway_queues != "per-replica" or not depths or cluster is None or not rates:
        return 0, []
    top = max(spec.priorities, key=spec.priorities.__getitem__)
    slots = cluster.ready_replicas * spec.replica_concurrency
    admitted = sum(rate * (1.0 - shed.get(name, 0.0)) for name, rate in rates.items())
    reserve = reserve_slots(slots=slots, server_slots=spec.replica_concurrency, rate_per_s=admitted,
                            top_rate_per_s=rates.get(top, 0.0), service_s=service_s, wait_s=spec.slo_queue_wait_s,
                            miss=spec.slo_miss_target_ratio, max_reserve=spec.replica_concurrency)
    if reserve == 0:
        return 0, []
    return reserve, [f"shedding: {reserve} of {slots} Ready slots kept for {top} ({admitted:.1f} req/s admitted, "
                     f"{rates.get(top, 0.0):.1f} of them {top}): behind per-replica gateway queues a {top} request "
                     f"that finds every slot busy waits for its server's; {', '.join(sorted(depths))} rejected while "
                     f"{slots - reserve} are busy"]


def hard_guard_reserve(spec: PolicySpec, ready: int) -> tuple[int, list[str]]:
    """The one slot kept for the top class while the return's hard guard is on, behind per-replica gateway
    queues (see the module docstring); 0 with shared queues or fewer than two Ready slots."""
    slots = ready * spec.replica_concurrency
    if spec.gateway_queues != "per-replica" or slots < 2:
        return 0, []
    top = max(spec.priorities, key=spec.priorities.__getitem__)
    return 1, [f"shedding: 1 of {slots} Ready slots kept for {top} while the guard is hard: behind per-replica "
               f"gateway queues a {top} request that finds every slot busy waits for its server's next "
               f"completion; the guarded classes rejected while {slots - 1} are busy"]


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Shed levels (remembered: an invalid decision keeps them), the saturation guard's depths and the slots
    kept for the top class."""
    assert tick.clean is not None and tick.clean.cluster is not None
    ready = tick.clean.cluster.ready_replicas
    depths = saturation_depths(spec, ready, tick.service_s)
    shed, why = shed_levels(spec, tick.clean, tick.service_s, depths)  # the same depths: computed once
    since = hard_guard(spec, tick, depths, ready)
    if since is not None:
        depths = {name: 1 for name in depths}
        why.append(f"shedding: traffic back after a silence, its capacity on the way ({ready} of "
                   f"{tick.replicas - tick.unplaceable} replicas Ready): {', '.join(sorted(depths))} guarded at a "
                   f"queue of 1 until they are, at most {returning_guard_s(tick):.0f} s from its start ("
                   f"{tick.now - since:.0f} s ago), so the highest class waits behind no other")
    reserve, kept = top_reserve(spec, tick.clean, tick.service_s, shed, depths)
    if since is not None and reserve < 1:
        reserve, kept = hard_guard_reserve(spec, ready)
    state = tick.state.changed(shed=shed, hard_guard_since_s=tick.state.hard_guard_since_s if since is None else since)
    return tick.then(why + kept, shed=shed, saturation_depths=depths, saturation_reserve=reserve, state=state)
