"""GPU budgets of one target, in replicas of its shape: the policy never orders more (`policies/stages/budget.py`).

Three budgets, each in GPUs of the replica's GPU resource; the smallest that applies binds:
- `capacity.max_gpus`: the target's own cap (its replicas and warm slots together);
- `capacity.namespace_max_gpus`: the namespace's cap, less what the namespace's other pods request;
- Kueue: when the target (or its pod template) carries `kueue.x-k8s.io/queue-name`, the ClusterQueue behind
  that LocalQueue: its nominal quota (summed over flavors), plus what the other ClusterQueues of its cohort
  may lend (their unused nominal quota, at most their `lendingLimit`, in all at most its own
  `borrowingLimit`), less what other workloads of the ClusterQueue use (its `status.flavorsUsage` less
  this target's admitted pods). E.g. 16 nominal + 8 lendable - 8 used by others = 16 GPUs: 4 replicas
  of 4 GPUs. Other ClusterQueues borrowing from the same cohort are not subtracted (the quota can be
  smaller when they do; Kueue then keeps the extra pods gated, and the placement stage sees them wait).
A budget that applies but cannot be read (the LocalQueue or ClusterQueue missing, the API failing) is an
error: the tick holds, the cluster is left as it is. Reading ClusterQueues needs a ClusterRole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from autoscaler.errors import PermanentError
from autoscaler.kube.capacity import Shape
from autoscaler.kube.client import Kube
from autoscaler.kube.quantity import effective_resources, parse_quantity
from autoscaler.kube.reads import ApiReads, ClusterReads
from autoscaler.kube.warmpool import WARM_POOL_LABEL

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATE = "kueue.x-k8s.io/admission"


@dataclass(frozen=True)
class Budget:
    replicas: int | None = None
    reason: str = ""


def _fmt(value: Decimal) -> str:
    return f"{value.normalize():f}"


def _flavors(cq: dict, resource: str) -> list[tuple[str, Decimal, Decimal | None, Decimal | None]]:
    """(flavor, nominal, borrowingLimit, lendingLimit) of `resource` in a ClusterQueue's spec."""
    found = []
    for group in cq.get("spec", {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                if r.get("name") == resource:
                    limits = [parse_quantity(r[k]) if r.get(k) is not None else None
                              for k in ("borrowingLimit", "lendingLimit")]
                    found.append((flavor.get("name", ""), parse_quantity(r.get("nominalQuota", 0)), *limits))
    return found


def _used(cq: dict, resource: str) -> dict[str, Decimal]:
    used = {}
    for flavor in cq.get("status", {}).get("flavorsUsage") or []:
        for r in flavor.get("resources") or []:
            if r.get("name") == resource:
                used[flavor.get("name", "")] = parse_quantity(r.get("total", 0))
    return used


def _cohort(cq: dict) -> str | None:
    spec = cq.get("spec", {})
    return spec.get("cohort") or spec.get("cohortName")  # v1beta1 / v1beta2


def kueue_gpus(cq: dict, peers: list[dict], resource: str, ours: Decimal) -> tuple[Decimal, str]:
    """GPUs of `resource` this ClusterQueue leaves to a target whose admitted pods use `ours`."""
    flavors = _flavors(cq, resource)
    name = cq.get("metadata", {}).get("name", "?")
    if not flavors:
        return Decimal(0), f"ClusterQueue {name} has no quota for {resource}"
    nominal = sum((f[1] for f in flavors), Decimal(0))
    borrowing = None if any(f[2] is None for f in flavors) else sum((f[2] for f in flavors), Decimal(0))
    lendable = Decimal(0)
    cohort = _cohort(cq)
    for peer in peers if cohort else []:
        if _cohort(peer) != cohort or peer.get("metadata", {}).get("name") == name:
            continue
        used = _used(peer, resource)
        for flavor, quota, _, lending in _flavors(peer, resource):
            unused = max(Decimal(0), quota - used.get(flavor, Decimal(0)))
            lendable += unused if lending is None else min(lending, unused)
    borrow = lendable if borrowing is None else min(lendable, borrowing)
    others = max(Decimal(0), sum(_used(cq, resource).values(), Decimal(0)) - ours)
    gpus = nominal + borrow - others
    return gpus, (f"ClusterQueue {name}: {_fmt(nominal)} {resource} nominal + {_fmt(borrow)} the cohort may lend "
                  f"- {_fmt(others)} used by others = {_fmt(gpus)}")


def _gpus(pod, resource: str) -> Decimal:
    return effective_resources(pod.spec)[0].get(resource, Decimal(0))


def _admitted(pod) -> bool:
    gates = (pod.spec.scheduling_gates or []) if pod.spec else []
    return not any(g.name == ADMISSION_GATE for g in gates)


class BudgetReader:
    def __init__(self, kube: Kube, *, namespace: str, max_gpus: int | None, namespace_max_gpus: int | None,
                 kueue: bool, kueue_version: str, reads: ClusterReads | None = None) -> None:
        self.kube, self.namespace = kube, namespace
        self.reads = reads or ApiReads(kube)
        self.max_gpus, self.namespace_max_gpus = max_gpus, namespace_max_gpus
        self.kueue, self.kueue_version = kueue, kueue_version

    def _queue(self, workload) -> str | None:
        if not self.kueue:
            return None
        for meta in (workload.metadata, workload.spec.template.metadata):
            labels = (meta.labels if meta is not None else None) or {}
            if labels.get(QUEUE_LABEL):
                return labels[QUEUE_LABEL]
        return None

    async def _namespace_others(self, resource: str, own: set[str]) -> Decimal:
        pods = await self.reads.live_pods(self.namespace)
        return sum((_gpus(p, resource) for p in pods if p.metadata.uid not in own
                    and WARM_POOL_LABEL not in (p.metadata.labels or {})), Decimal(0))

    async def _kueue(self, queue: str, resource: str, ours: Decimal) -> tuple[Decimal, str]:
        version = self.kueue_version
        local = await self.reads.kueue("LocalQueue", queue, self.namespace, version=version)
        cq_name = (local.get("spec") or {}).get("clusterQueue")
        if not cq_name:
            raise PermanentError(f"LocalQueue {self.namespace}/{queue} names no ClusterQueue")
        cq = await self.reads.kueue("ClusterQueue", cq_name, version=version)
        peers = await self.reads.cluster_queues(version) if _cohort(cq) else []
        return kueue_gpus(cq, peers, resource, ours)

    async def read(self, workload, shape: Shape, own_pods: list) -> Budget:
        queue = self._queue(workload)
        if self.max_gpus is None and self.namespace_max_gpus is None and queue is None:
            return Budget()
        resource = shape.gpu_resource
        if resource is None:
            raise PermanentError("a GPU budget applies (capacity.max_gpus, capacity.namespace_max_gpus or a Kueue "
                                 "queue label) but the pod template requests no GPU resource: set "
                                 "capacity.gpu_resource")
        budgets: list[tuple[Decimal, str]] = []
        if self.max_gpus is not None:
            budgets.append((Decimal(self.max_gpus), f"capacity.max_gpus {self.max_gpus} {resource}"))
        if self.namespace_max_gpus is not None:
            others = await self._namespace_others(resource, {p.metadata.uid for p in own_pods})
            budgets.append((Decimal(self.namespace_max_gpus) - others,
                            f"namespace {self.namespace}: capacity.namespace_max_gpus {self.namespace_max_gpus} "
                            f"{resource} - {_fmt(others)} used by other pods"))
        if queue is not None:
            ours = sum((_gpus(p, resource) for p in own_pods if _admitted(p)), Decimal(0))
            budgets.append(await self._kueue(queue, resource, ours))
        gpus, why = min(budgets, key=lambda b: b[0])
        replicas = max(0, math.floor(gpus / shape.gpus))
        return Budget(replicas=replicas, reason=f"{why}; {_fmt(shape.gpus)} per replica")
