"""Which pods a scale-down removes, through the `controller.kubernetes.io/pod-deletion-cost` annotation.

On a scale-down the ReplicaSet controller deletes first the pods not on a node, then Pending ones, then
those not Ready; only among the rest does it take the lowest deletion cost first, and after that, by
default, pods doubled up on a node: it spreads the survivors out, the opposite of freeing nodes. Before
`ScaleActuator` lowers the replicas of a Deployment, `DeletionOrder` ranks the target's pods and writes the
costs, lowest (deleted first) to highest:

1. pods not on a node (Pending, waiting for capacity): the ReplicaSet controller takes them first anyway;
   the cost says the same, for anyone who reads only the annotation;
2. pods on a node that is going away (cordoned, being deleted, tainted by a node provisioner that drains
   it, or gone): they will be evicted anyway, and removing a healthy replica elsewhere instead would leave
   one replica fewer than decided once the drain is done;
3. pods on the least-used nodes: the fewest GPUs requested by the running pods bound to the node (the
   pods of the target's namespace, the only ones the controller may read), so whole nodes empty out one
   after the other and the node provisioner can remove them. E.g. node a runs 1 replica of 4 GPUs, node b
   runs 2: the replica on a goes, and a is empty (by default the ReplicaSet controller takes one on b);
4. among equals, the fewest requests in flight (the model server's running-requests gauge per pod, when
   an `InFlightReader` is given); a pod whose figure could not be read ranks last among its equals (it may
   be the busy one); without figures, node usage alone decides.

Costs, integers in int32 range as the annotation requires: -2^31 for a pod not on a node; -2^30 +
in-flight on a node going away; else GPUs in use on its node * 10_000 + in-flight (capped at 9_998;
unknown: 9_999). E.g. a node with 8 GPUs in use and 3 requests in flight: 80_003. Values follow the
measurements, not ranks, so a pod's cost changes only when its node's usage or its own load does (with
in-flight figures, that is most pods at each scale-down; scale-downs are few).

Writes: one strategic-merge patch per pod whose cost changes, at most `PATCH_CONCURRENCY` at a time, only
on a scale-down (the caller's decision) and only in actuate mode (the loop gates the scaler). Safety: a
scale-down without the ordering is what happens without this module, so nothing here may block or delay
the scale write beyond `timeout_s`: every edge error and the timeout are logged and counted (`on_error`),
and the scale goes ahead with whatever costs are in place. Pods are read in the target's namespace (the
Role's `list`), nodes one `get` each (a ClusterRole); nodes that cannot be read are taken as staying.
The ReplicaSet controller reads pods from its informer: the patches land before the scale write, which
reaches it through the Deployment and the ReplicaSet, so it sees the new costs in practice, not by
guarantee (a lost race is today's ordering for that one scale-down).

StatefulSets: the annotation means nothing to the StatefulSet controller (it removes the highest ordinal),
so `ScaleActuator` does not order their pods.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Callable, Collection, Iterable, Mapping, Protocol, Sequence

import structlog

from autoscaler.errors import EdgeError, PermanentError, TransientError
from autoscaler.kube.capacity import is_gpu_resource
from autoscaler.kube.client import Kube
from autoscaler.kube.pods import PodFacts, pod_facts
from autoscaler.kube.quantity import effective_resources

log = structlog.get_logger("autoscaler")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
PENDING_COST = INT32_MIN
LEAVING_BASE = -(2 ** 30)
IN_FLIGHT_SPAN = 10_000  # per GPU of node usage: room for 9_998 requests in flight and "unknown"
UNKNOWN_IN_FLIGHT = IN_FLIGHT_SPAN - 1
MAX_USAGE = INT32_MAX // IN_FLIGHT_SPAN - 1  # 214_747 GPUs on one node: never reached, but stays in range
PATCH_CONCURRENCY = 8
# Taints a node provisioner puts on a node it is about to remove (Karpenter v1 and before, the cluster-autoscaler).
LEAVING_TAINTS = ("karpenter.sh/disrupted", "karpenter.sh/disruption", "ToBeDeletedByClusterAutoscaler")


@dataclass(frozen=True)
class PodPlace:
    """One pod as the ordering sees it."""

    name: str
    node: str | None  # None: not bound to a node yet
    gpus: Decimal = Decimal(0)


def node_usage(pods: Iterable[PodPlace]) -> dict[str, Decimal]:
    """GPUs requested per node by the given (live, bound) pods."""
    usage: dict[str, Decimal] = {}
    for pod in pods:
        if pod.node:
            usage[pod.node] = usage.get(pod.node, Decimal(0)) + pod.gpus
    return usage


def deletion_costs(pods: Sequence[PodPlace], *, usage: Mapping[str, Decimal], leaving: Collection[str] = (),
                   in_flight: Mapping[str, float] | None = None) -> dict[str, int]:
    """Pod name -> deletion cost (lowest goes first), per the module's order. `usage`: GPUs requested per
    node; `leaving`: nodes going away; `in_flight`: requests in flight per pod, where known."""
    figures = in_flight or {}

    def load(name: str) -> int:
        value = figures.get(name)
        if value is None or math.isnan(value):
            return UNKNOWN_IN_FLIGHT
        return min(UNKNOWN_IN_FLIGHT - 1, max(0, round(value)))

    costs = {}
    for pod in pods:
        if not pod.node:
            costs[pod.name] = PENDING_COST
        elif pod.node in leaving:
            costs[pod.name] = LEAVING_BASE + load(pod.name)
        else:
            gpus = min(MAX_USAGE, math.ceil(usage.get(pod.node, Decimal(0))))
            costs[pod.name] = gpus * IN_FLIGHT_SPAN + load(pod.name)
    return costs


def node_leaving(node) -> bool:
    """Whether a node (API object) is on its way out: cordoned, being deleted or tainted for removal."""
    if node.metadata.deletion_timestamp is not None:
        return True
    spec = node.spec
    if spec is None:
        return False
    return bool(spec.unschedulable) or any(t.key in LEAVING_TAINTS for t in (spec.taints or []))


def pod_gpus(pod_spec) -> Decimal:
    """GPU-like resources a pod requests, summed (a MIG slice counts as one: the order, not the sum, matters)."""
    requests, _ = effective_resources(pod_spec)
    return sum((v for k, v in requests.items() if is_gpu_resource(k)), Decimal(0))


def current_cost(pod) -> str | None:
    return (pod.metadata.annotations or {}).get(ANNOTATION)


class InFlightReader(Protocol):
    async def in_flight(self, pods: Mapping[str, str]) -> Mapping[str, float]:
        """Requests in flight per pod, for pods given as name -> pod IP; a pod that could not be read is
        left out."""
        ...


class DeletionOrder:
    """Writes the deletion costs of a Deployment's pods before a scale-down; never raises an edge error."""

    def __init__(self, kube: Kube, *, namespace: str, in_flight: InFlightReader | None = None,
                 on_error: Callable[[EdgeError], None] | None = None, timeout_s: float = 4.0) -> None:
        """`on_error`: counts an error (it is logged here); `timeout_s`: the most the ordering may delay
        the scale write."""
        self.kube, self.namespace = kube, namespace
        self.in_flight, self.on_error, self.timeout_s = in_flight, on_error, timeout_s

    def _error(self, exc: EdgeError) -> None:
        log.warning("error", where="deletion cost", kind=exc.kind, error=str(exc))
        if self.on_error is not None:
            self.on_error(exc)

    async def before_scale_down(self, selector: str) -> dict[str, int]:
        """Ranks the pods `selector` picks and writes the costs that changed; returns those written."""
        try:
            return await asyncio.wait_for(self.mark(selector), self.timeout_s)
        except asyncio.TimeoutError:
            self._error(TransientError(f"deletion costs not written within {self.timeout_s:.1f} s",
                                       kind="deletion_cost_deadline"))
        except EdgeError as exc:
            self._error(exc)
        except Exception as exc:  # noqa: BLE001 - a bug here must not stop the scale-down it only refines
            log.exception("deletion cost failed")
            self._error(EdgeError(f"deletion costs: {exc!r}", kind=type(exc).__name__))
        return {}

    async def _leaving(self, names: set[str]) -> set[str]:
        async def one(name: str) -> bool:
            try:
                return node_leaving(await self.kube.call(f"get node {name}", self.kube.core.read_node, name))
            except PermanentError as exc:
                if exc.kind == "not_found":
                    return True  # the node is gone: its pods are orphans on their way out
                raise

        ordered = sorted(names)
        found = await asyncio.gather(*(one(n) for n in ordered), return_exceptions=True)
        failed = [r for r in found if isinstance(r, BaseException)]
        for result in failed:
            if not isinstance(result, EdgeError):
                raise result
        if failed:  # taken as staying; one report, not one per node (e.g. no ClusterRole: all forbidden)
            self._error(failed[0])
        return {name for name, result in zip(ordered, found) if result is True}

    async def _figures(self, pods: Sequence[PodFacts]) -> Mapping[str, float]:
        if self.in_flight is None:
            return {}
        ips = {p.name: p.ip for p in pods if p.node and p.ready and p.ip}
        try:
            return await self.in_flight.in_flight(ips) if ips else {}
        except EdgeError as exc:
            self._error(exc)
            return {}

    async def mark(self, selector: str) -> dict[str, int]:
        """`before_scale_down` without its guard: edge errors of the reads propagate."""
        core, ns = self.kube.core, self.namespace
        target, everyone = await asyncio.gather(
            self.kube.call(f"list pods {ns} {selector}", core.list_namespaced_pod, ns, label_selector=selector),
            self.kube.call(f"list pods {ns}", core.list_namespaced_pod, ns),
        )
        live = [(p, facts) for p in target.items if (facts := pod_facts(p)).live]
        pods = [p for p, _ in live]
        bound = [PodPlace(p.metadata.name, p.spec.node_name, pod_gpus(p.spec)) for p in everyone.items
                 if pod_facts(p).live and p.spec.node_name]
        leaving, figures = await asyncio.gather(self._leaving({p.spec.node_name for p in pods if p.spec.node_name}),
                                                self._figures([facts for _, facts in live]))
        costs = deletion_costs([PodPlace(p.metadata.name, p.spec.node_name) for p in pods], usage=node_usage(bound),
                               leaving=leaving, in_flight=figures)
        changed = {p.metadata.name: costs[p.metadata.name] for p in pods
                   if current_cost(p) != str(costs[p.metadata.name])}
        return await self._write(changed)

    async def _write(self, costs: dict[str, int]) -> dict[str, int]:
        gate = asyncio.Semaphore(PATCH_CONCURRENCY)

        async def one(name: str, cost: int) -> None:
            async with gate:
                await self.kube.call(f"annotate pod {self.namespace}/{name}", self.kube.core.patch_namespaced_pod,
                                     name, self.namespace, {"metadata": {"annotations": {ANNOTATION: str(cost)}}})

        results = await asyncio.gather(*(one(n, c) for n, c in costs.items()), return_exceptions=True)
        written = {}
        for (name, cost), result in zip(costs.items(), results):
            if isinstance(result, EdgeError):
                self._error(result)  # e.g. the pod went meanwhile; the others still count
            elif isinstance(result, BaseException):
                raise result
            else:
                written[name] = cost
        return written
