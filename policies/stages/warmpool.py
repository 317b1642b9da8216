"""Stage 7: how many free, ready GPU slots (placeholder pods) to keep.

A replica that lands on a warm slot serves after its start-up time; one that needs a new node waits for
node provisioning too. So the pool is sized to hold the growth the upper forecast expects over the next
start-up + node-provisioning window, beyond the replicas already decided."""

from __future__ import annotations


from policies.spec import PolicySpec


def warm_slots(spec: PolicySpec, *, replicas: int, peak_replicas: int | None) -> tuple[int, list[str]]:
    if peak_replicas is None or spec.max_warm_slots == 0:
        return 0, []
    growth = min(spec.max_replicas, peak_replicas) - replicas
    slots = max(0, min(spec.max_warm_slots, growth))
    if slots == 0:
        return 0, []
    return slots, [f"warm pool: {slots} slots for forecast peak of {peak_replicas} within node provisioning"]

