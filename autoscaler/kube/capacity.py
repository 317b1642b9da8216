"""The capacity model: what one replica needs, where one more fits now, and how many the GPU budget allows.

- Replica shape: the pod template's requests as the scheduler counts them (`quantity.effective_resources`),
  and its GPU resource: `capacity.gpu_resource` if set, else the first of `nvidia.com/gpu`, a MIG profile
  (`nvidia.com/mig-1g.10gb`, ...), `amd.com/gpu`, `gpu.intel.com/*` that it requests. A 4-GPU tensor-parallel
  replica is one unit of 4 GPUs that must fit on one node (the scheduler places pods, not GPUs).
- Idle slots: on every Ready, schedulable node the template may use (its node selector, required node
  affinity and tolerations), how many whole replicas fit into what the node's running pods leave of its
  allocatable resources. An 8-GPU node with one 4-GPU replica on it has one idle slot; a node with 6 GPUs
  free and 4-GPU replicas also one (the other 2 GPUs are no use to this model). A replica that lands on an
  idle slot waits for its start-up only, so idle slots shorten the lead time and count against the warm
  pool (stages 3 and 7). Required inter-pod rules of the template are honoured on the safe side:
  anti-affinity by host (e.g. one replica per node) leaves a node no slot if a pod it names runs there,
  and at most one otherwise; anti-affinity over a wider domain (zone, `nvidia.com/gpu.clique`) and
  required pod affinity count no idle slot at all (too few slots only lengthen the lead time). Reading
  the nodes needs `list` on nodes and on pods in every namespace (a ClusterRole); if that read fails,
  the room is unknown (None): idle slots are taken as 0, which only lengthens the lead time, and a
  CapacityBuffer's ready slots are taken as its status says (cluster.py).
- Budget (`budget.py`): the GPU caps in the config and the Kueue quota, in replicas of this shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import structlog

from autoscaler.errors import EdgeError
from autoscaler.kube.client import Kube
from autoscaler.kube.quantity import effective_resources, field_of, parse_quantity
from autoscaler.kube.reads import ApiReads, ClusterReads

log = structlog.get_logger("autoscaler")

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
GPU_PREFIXES = ("nvidia.com/mig-", "gpu.intel.com/")
NODE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "nvidia.com/gpu.product")
HOSTNAME = "kubernetes.io/hostname"


def is_gpu_resource(name: str) -> bool:
    """A GPU-like extended resource: whole GPUs, MIG slices, other vendors' accelerators."""
    return name in GPU_RESOURCES or name.startswith(GPU_PREFIXES)


@dataclass(frozen=True)
class Shape:
    """What one replica's pod asks of a node."""

    requests: dict[str, Decimal]
    gpu_resource: str | None
    gpus: Decimal

    def fits(self, free: dict[str, Decimal]) -> int:
        """Whole replicas that fit into `free` (resources this shape does not request do not limit it)."""
        counts = [math.floor(free.get(k, Decimal(0)) / v) for k, v in self.requests.items() if v > 0]
        return max(0, min(counts)) if counts else 0


def replica_shape(template, gpu_resource: str | None = None) -> Shape:
    requests, _ = effective_resources(template.spec)
    if gpu_resource is None:
        gpu_resource = next((k for k in requests if is_gpu_resource(k)), None)
    gpus = requests.get(gpu_resource, Decimal(0)) if gpu_resource else Decimal(0)
    return Shape(requests=requests, gpu_resource=gpu_resource if gpus > 0 else None, gpus=gpus)


def _tolerates(tolerations, taint) -> bool:
    for t in tolerations or []:
        effect, key, op = field_of(t, "effect"), field_of(t, "key"), field_of(t, "operator") or "Equal"
        if effect and effect != field_of(taint, "effect"):
            continue
        if op == "Exists" and (not key or key == field_of(taint, "key")):
            return True
        same_value = (field_of(t, "value") or "") == (field_of(taint, "value") or "")
        if op == "Equal" and key == field_of(taint, "key") and same_value:
            return True
    return False


def _expression_holds(expr, labels: dict[str, str]) -> bool:
    key, op, values = field_of(expr, "key"), field_of(expr, "operator"), field_of(expr, "values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # Gt/Lt and anything newer: not counted (an idle slot counted wrongly would shorten the lead time)


def node_admits(node, pod_spec) -> bool:
    """Whether the scheduler could place a pod of `pod_spec` on `node` as far as labels, taints and the
    node's state go (resources are `Shape.fits`)."""
    meta, spec, status = node.metadata, node.spec, node.status
    labels = meta.labels or {}
    if spec is not None and spec.unschedulable:
        return False
    ready = next((c for c in (status.conditions or []) if c.type == "Ready"), None) if status else None
    if ready is None or ready.status != "True":
        return False
    if any(labels.get(k) != v for k, v in (pod_spec.node_selector or {}).items()):
        return False
    for taint in (spec.taints or []) if spec is not None else []:
        if taint.effect in ("NoSchedule", "NoExecute") and not _tolerates(pod_spec.tolerations, taint):
            return False
    affinity = pod_spec.affinity.node_affinity if pod_spec.affinity and pod_spec.affinity.node_affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    if required is not None:  # terms are ORed, expressions within a term ANDed
        terms = required.node_selector_terms or []
        if not any(all(_expression_holds(e, labels) for e in (term.match_expressions or [])) for term in terms):
            return False
    return True


def _selects(selector, labels: dict[str, str]) -> bool:
    """A label selector of a pod (anti-)affinity term; a null one selects no pods."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (field_of(selector, "match_labels") or {}).items()):
        return False
    return all(_expression_holds(e, labels) for e in (field_of(selector, "match_expressions") or []))


def _required(rule) -> list:
    return list(rule.required_during_scheduling_ignored_during_execution or []) if rule else []


def pod_rule_limit(pod_spec, labels: dict[str, str], namespace: str):
    """How the template's required inter-pod rules limit a node's slots: a function (node's pods, whole
    replicas that fit) -> slots to count. Without such rules, every whole replica counts."""
    affinity = pod_spec.affinity
    together = _required(affinity.pod_affinity if affinity else None)
    apart = _required(affinity.pod_anti_affinity if affinity else None)
    if together or any(t.topology_key != HOSTNAME for t in apart):
        return lambda pods, whole: 0
    if not apart:
        return lambda pods, whole: whole

    def named(term, pod) -> bool:
        spaces = term.namespaces or [namespace]
        anywhere = term.namespace_selector is not None  # not evaluated: taken as every namespace
        return (anywhere or pod.metadata.namespace in spaces) and _selects(term.label_selector,
                                                                          pod.metadata.labels or {})

    itself = any(_selects(t.label_selector, labels) for t in apart)

    def limit(pods, whole: int) -> int:
        if any(named(t, pod) for t in apart for pod in pods):
            return 0
        return min(whole, 1) if itself else whole
    return limit


def node_type(node) -> str:
    labels = node.metadata.labels or {}
    return next((labels[k] for k in NODE_TYPE_LABELS if labels.get(k)), "unknown")


@dataclass(frozen=True)
class NodeRoom:
    """Free whole-replica slots on the nodes that exist, replicas per node by node type, and the GPUs the
    target holds on nodes (its pods and warm placeholders) with their price per hour, if prices are known."""

    idle_slots: int = 0
    per_node: dict[str, int] = field(default_factory=dict)
    gpus_held: float = 0.0
    cost_per_hour: float | None = None


def price_of(prices: dict[str, float], node) -> float | None:
    """Price per GPU-hour of a node: by its node type (instance type or GPU product), else `default`."""
    return prices.get(node_type(node), prices.get("default"))


@dataclass(frozen=True)
class NodeUsage:
    """What the pods bound to nodes take, per node: their requests summed, and each pod with its requests.
    It depends on the pods only, not on the model asking."""

    used: dict[str, dict[str, Decimal]]
    on: dict[str, list[tuple[Any, dict[str, Decimal]]]]
    pods_on: dict[str, list]


_last_usage: list = [None, None]  # [the pods list, its NodeUsage]


def node_usage(pods: list) -> NodeUsage:
    """The usage of `pods`; the same list object as the previous call gets the previous answer (the fleet's
    cache hands every model the same list while its pods are unchanged: computed once, not per model)."""
    if _last_usage[0] is pods:
        return _last_usage[1]
    used: dict[str, dict[str, Decimal]] = {}
    on: dict[str, list[tuple[Any, dict[str, Decimal]]]] = {}
    for pod in pods:
        name = pod.spec.node_name if pod.spec else None
        if not name:
            continue
        requests, _ = effective_resources(pod.spec)
        on.setdefault(name, []).append((pod, requests))
        total = used.setdefault(name, {})
        for key, value in requests.items():
            total[key] = total.get(key, Decimal(0)) + value
    usage = NodeUsage(used, on, {name: [pod for pod, _ in bound] for name, bound in on.items()})
    _last_usage[:] = [pods, usage]
    return usage


def node_room(nodes, pods, template, shape: Shape, *, ours=lambda pod: False,
              prices: dict[str, float] | None = None, namespace: str = "default") -> NodeRoom:
    usage = node_usage(pods)
    used, on = usage.used, usage.pods_on
    held: dict[str, Decimal] = {}
    if shape.gpu_resource:
        for name, bound in usage.on.items():
            for pod, requests in bound:
                if ours(pod):
                    held[name] = held.get(name, Decimal(0)) + requests.get(shape.gpu_resource, Decimal(0))
    by_name = {node.metadata.name: node for node in nodes}
    cost = None
    if prices:
        known = [(gpus, price_of(prices, by_name[n])) for n, gpus in held.items() if n in by_name]
        cost = None if any(p is None for _, p in known) else sum(float(g) * p for g, p in known)
    idle, per_node = 0, {}
    limit = pod_rule_limit(template.spec, (template.metadata.labels or {}) if template.metadata else {}, namespace)
    for node in nodes:
        if not node_admits(node, template.spec):
            continue
        allocatable = {k: Decimal(0) for k in shape.requests}
        for key, value in ((node.status.allocatable or {}) if node.status else {}).items():
            allocatable[key] = parse_quantity(value)
        whole = shape.fits(allocatable)
        if whole == 0:
            continue
        per_node[node_type(node)] = max(per_node.get(node_type(node), 0), whole)
        taken = used.get(node.metadata.name, {})
        free = shape.fits({k: v - taken.get(k, Decimal(0)) for k, v in allocatable.items()})
        idle += limit(on.get(node.metadata.name, []), free)
    return NodeRoom(idle_slots=idle, per_node=per_node, gpus_held=float(sum(held.values(), Decimal(0))),
                    cost_per_hour=cost)


class NodeReader:
    """Reads nodes and the pods bound to them, and returns the idle slots for a template; with `prices`
    (per GPU-hour by node type, `default` for the rest), what the target's GPUs cost per hour."""

    def __init__(self, kube: Kube, *, prices: dict[str, float] | None = None,
                 reads: ClusterReads | None = None) -> None:
        self.kube = kube
        self.reads = reads or ApiReads(kube)
        self.prices = prices or {}
        self._warned = False

    async def room(self, template, shape: Shape, ours=lambda pod: False,
                   namespace: str = "default") -> NodeRoom | None:
        """The room for `template` on the nodes; None when it is not known (the nodes' read failed, or the
        template requests nothing: room is not counted in replicas of nothing)."""
        if not shape.requests:
            return None
        try:
            nodes = await self.reads.nodes()
            pods = await self.reads.live_pods(None)
        except EdgeError as exc:
            if not self._warned:
                log.warning("idle node slots unknown, taken as 0", error=str(exc))
                self._warned = True
            return None
        self._warned = False
        return node_room(nodes, pods, template, shape, ours=ours, prices=self.prices, namespace=namespace)
