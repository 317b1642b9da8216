"""Stage 3: how long until a replica ordered now serves traffic.

Learned online from observed pod creation -> Ready durations (a high percentile of the most recent ones),
plus node-provisioning time when no warm slot (or idle node slot) is free to land on."""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.types import Clean


def remember_startups(spec: PolicySpec, samples: tuple[float, ...], clean: Clean) -> tuple[float, ...]:
    new = tuple(d for d in (clean.cluster.startup_durations_s if clean.cluster else ()) if 0 < d < 86400)
    if not new:
        return samples
    return (samples + new)[-spec.startup_samples_kept :]


def startup_s(spec: PolicySpec, samples: tuple[float, ...]) -> float:
    if not samples:
        return spec.default_startup_s
    ordered = sorted(samples)
    index = min(len(ordered) - 1, int(spec.startup_percentile * len(ordered)))
    return ordered[index]


def lead_time_s(spec: PolicySpec, startup: float, free_slots: int) -> float:
    return startup + (0.0 if free_slots > 0 else spec.node_provisioning_s)
