"""Stage 10, placement: replicas that were ordered but will not come: the node provisioner cannot place them.

A pod waiting for a node is normal while one is provisioned. It is not coming when the provisioner said so
(`ClusterState.no_capacity_pods`: e.g. Karpenter's "all available instance types exceed limits for
nodepool", the cluster-autoscaler's "pod didn't trigger scale-up"), or, with a provisioner that says
nothing, when the longest-waiting pod has waited `STUCK_LEAD_TIMES` node-provisioning times (as learned). Such replicas
are not capacity on the way: the decision says so (reasons, `Decision.unplaceable_replicas` for metrics and
Events), the warm pool yields (a placeholder would take a GPU a replica needs, and would be preempted by
it anyway), and the low priorities are shed while demand exceeds what is ready (the shedding stage sizes on
ready replicas only). The replicas stay ordered, so they land as soon as capacity appears (a raised limit).
"""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.types import ClusterState, Tick

STUCK_LEAD_TIMES = 3.0


def unplaceable(spec: PolicySpec, cluster: ClusterState, node_s: float | None = None) -> tuple[int, list[str]]:
    """`node_s`: the node provisioning time the lead time uses (learned; default `spec.node_provisioning_s`)."""
    said = cluster.no_capacity_pods
    node_s = spec.node_provisioning_s if node_s is None else node_s
    overdue = cluster.unschedulable_pods if cluster.oldest_unschedulable_s > STUCK_LEAD_TIMES * max(
        node_s, spec.tick_s) else 0
    count = max(said, overdue)
    if count == 0:
        return 0, []
    why = (cluster.no_capacity_reason if said else
           f"waiting for a node for {cluster.oldest_unschedulable_s:.0f} s, "
           f"over {STUCK_LEAD_TIMES:g}x node provisioning")
    # The line starts "capacity:" (the Event's message and the replay table pick it out by that prefix).
    return count, [f"capacity: {count} replicas cannot get a node ({why}); not counted as capacity on the way, "
                   f"no warm slots kept, low priorities shed while they wait"]


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The ordered replicas no node can be made for, and why."""
    assert tick.clean is not None and tick.clean.cluster is not None
    stuck, why = unplaceable(spec, tick.clean.cluster, tick.node_s)
    return tick.then(why, unplaceable=stuck)
