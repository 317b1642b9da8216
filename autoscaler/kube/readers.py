"""The per-model cluster reader and warm pool backend from a model's `Settings`, for the single-target loop
(`runtime.py`, reading from the API) and for the fleet (`cache.py`, reading from its watch cache): one
construction, so the two paths compute the same `ClusterState`."""

from __future__ import annotations

from autoscaler.config import Settings
from autoscaler.kube.budget import BudgetReader
from autoscaler.kube.capacity import NodeReader
from autoscaler.kube.client import Kube
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.reads import ClusterReads
from autoscaler.kube.warmpool import CapacityBufferPool, PlaceholderPool, WarmPool


def build_warm_pool(settings: Settings, kube: Kube, *, reads: ClusterReads | None = None) -> WarmPool | None:
    """The warm pool backend the config names (None when the warm pool is off); `reads`: where the placeholder
    pool reads its Deployment (default: the API)."""
    pool, target = settings.warm_pool, settings.target
    if not pool.enabled:
        return None
    name = target.name + pool.name_suffix
    if pool.backend == "capacity-buffer":
        return CapacityBufferPool(kube, namespace=target.namespace, name=name, target_kind=target.kind,
                                  target=target.name, max_slots=settings.policy.max_warm_slots)
    return PlaceholderPool(kube, namespace=target.namespace, name=name, priority_class=pool.priority_class,
                           pause_image=pool.pause_image, max_slots=settings.policy.max_warm_slots, reads=reads)


def build_cluster_reader(settings: Settings, kube: Kube, warm_pool: WarmPool | None, *,
                         reads: ClusterReads | None = None, nodes_in_memory: bool = False) -> ClusterReader:
    """The cluster state reader with the capacity model the config asks for (idle node slots, GPU budgets);
    `reads`: where the items come from (default: the API, per tick; the fleet's watch cache).
    `nodes_in_memory`: `reads` holds the nodes and pods (the watch cache), so a CapacityBuffer's ready slots
    are bounded by the nodes' free room even when `capacity.read_nodes` counts no idle slots (cluster.py)."""
    target, capacity = settings.target, settings.capacity
    budget = BudgetReader(kube, namespace=target.namespace, max_gpus=capacity.max_gpus,
                          namespace_max_gpus=capacity.namespace_max_gpus, kueue=capacity.kueue,
                          kueue_version=capacity.kueue_api_version, reads=reads)
    bound_buffer = nodes_in_memory and warm_pool is not None and warm_pool.room_kept
    nodes = (NodeReader(kube, prices=capacity.gpu_hour_price, reads=reads) if capacity.read_nodes or bound_buffer
             else None)
    return ClusterReader(kube, namespace=target.namespace, kind=target.kind, name=target.name, warm_pool=warm_pool,
                         nodes=nodes, budget=budget, gpu_resource=capacity.gpu_resource, reads=reads,
                         idle_counted=capacity.read_nodes)
