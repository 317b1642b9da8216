"""Stage 14, cost: the GPUs the target holds (replicas and warm slots) and their price, in the reasons.

Reported with the decision so every log line and Event says what the capacity costs; it sizes nothing.
The shell reads `ClusterState.gpus_held` from the pods on nodes and the price from the config."""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.types import Tick


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """A cost line when the target holds GPUs."""
    assert tick.clean is not None and tick.clean.cluster is not None
    cluster = tick.clean.cluster
    if not cluster.gpus_held:
        return tick
    cost = f", {cluster.gpu_cost_per_hour:.2f} per hour" if cluster.gpu_cost_per_hour is not None else ""
    return tick.then([f"cost: {cluster.gpus_held:g} GPUs held by replicas and warm slots{cost}"])
