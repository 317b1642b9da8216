"""Stage 8: reject the lowest priorities when ready capacity cannot meet the SLO before new capacity lands.

Demand is the arrival rate plus the rate needed to drain the queue within the SLO; capacity is the arrival
rate that ready slots serve with P(wait > SLO) <= `shed_miss_ratio`. The excess is taken from the lowest
priority class first, as a fraction of that class's arrivals, then the next, but only from classes below
`shed_priority_below`: the highest priority is never shed. Recomputed every tick, so shedding stops as
capacity arrives."""

from __future__ import annotations

from policies.queueing import rate_within_slo
from policies.spec import PolicySpec
from policies.types import Clean

SHED_MISS_RATIO = 0.01


def shed_levels(spec: PolicySpec, clean: Clean, service_s: float) -> tuple[dict[str, float], list[str]]:
    sheddable = sorted(
        (p, name) for name, p in spec.priorities.items() if p < spec.shed_priority_below
    )
    levels = {name: 0.0 for _, name in sheddable}
    rate, cluster = clean.arrival_rate_per_s, clean.cluster
    if rate is None or cluster is None or not sheddable:
        return levels, []
    capacity = rate_within_slo(
        servers=cluster.ready_replicas * spec.replica_concurrency,
        service_s=service_s,
        wait_s=spec.slo_queue_wait_s,
        miss_ratio=SHED_MISS_RATIO,
    )
    demand = rate + (clean.queue_depth or 0.0) / spec.slo_queue_wait_s
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
        reasons.append(f"shedding: {fraction:.0%} of {name} ({demand:.1f} req/s demand > {capacity:.1f} ready)")
    return levels, reasons
