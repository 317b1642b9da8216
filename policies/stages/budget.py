"""Stage 12, budget: never order more GPUs than the budget allows.

The shell turns every GPU budget that applies to the target into replicas of the target's shape and passes
the smallest as `ClusterState.budget_replicas`, with the words that explain it (`budget_reason`): a cap in
the controller's config for the target or its namespace, or the quota of the Kueue ClusterQueue the model's
namespace uses (its nominal quota plus what its cohort may lend, less what others already use). Replicas
above the budget are not ordered (a pod over quota would wait forever and hold nothing), warm slots get
what the budget leaves, and the shedding stage, which sizes on ready replicas, rejects the lowest
priorities while demand is above what the budget can serve: the reasons say "capped by quota".

A budget below the replicas already running lowers them to it (the budget is the operator's word; the
scale-down removes the pods the deletion-cost ordering marks). No budget known (`None`) caps nothing.
E.g. a ClusterQueue with 16 nominal GPUs, 8 its cohort may lend and 8 used by other workloads leaves
16 GPUs: 4 replicas of 4 GPUs, whatever demand asks for.
"""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.types import ClusterState, Tick


def within_budget(cluster: ClusterState, *, replicas: int, warm: int) -> tuple[int, int, bool, list[str]]:
    """(replicas, warm slots) within the budget, whether it held the replicas back, and why."""
    budget = cluster.budget_replicas
    if budget is None:
        return replicas, warm, False, []
    budget = max(0, budget)
    reasons = []
    capped = replicas > budget
    if capped:
        reasons.append(f"capped by quota: {budget} replicas, not {replicas} ({cluster.budget_reason}); "
                       f"demand above it is shed by priority")
        replicas = budget
    room = budget - replicas
    if warm > room:
        reasons.append(f"warm pool: {room} slots, not {warm}, within the GPU budget ({cluster.budget_reason})")
        warm = room
    return replicas, warm, capped, reasons


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Replicas, then warm slots, within the GPU budget."""
    assert tick.clean is not None and tick.clean.cluster is not None
    replicas, warm, capped, why = within_budget(tick.clean.cluster, replicas=tick.replicas, warm=tick.warm)
    return tick.then(why, replicas=replicas, warm=warm, capped=capped)
