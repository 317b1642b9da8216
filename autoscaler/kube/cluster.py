"""Cluster state of the target from the Kubernetes API, as `policies.ClusterState`.

- spec / ready replicas from the target's scale subresource and status; starting = spec - ready;
- pods of the target (its selector): unschedulable ones (PodScheduled=False, reason Unschedulable), and
  start-up durations (scheduled on a node -> Ready) of pods that became Ready since the last read (each
  pod reported once; at the first read, those of every Ready pod, so a restarted controller gets back what
  it had learned), which feed the policy's learned lead time;
- ready warm slots, as the warm pool backend counts them;
- pods that wait for a node (PodScheduled=False, Unschedulable) and, among them, those a node provisioner
  said it cannot place (a FailedScheduling or NotTriggerScaleUp Event from anyone but the scheduler itself,
  which reports every pod waiting for a new node: Karpenter's "all available instance types exceed limits
  for nodepool", the cluster-autoscaler's "pod didn't trigger scale-up"), with that message; and how long
  the oldest pod has been waiting, so the policy can tell a node on its way from one that is not coming;
- the waits of pods that were placed on a node newer than them (`nodewaits.py`): node provisioning per
  node type, which the policy learns for its lead time;
- with a capacity model (`capacity.py`, `budget.py`): idle replica-shaped slots on existing nodes, and the
  replicas the GPU budget allows, with its reason.
"""

from __future__ import annotations

from autoscaler.kube.budget import BudgetReader
from autoscaler.kube.capacity import NodeReader, replica_shape
from autoscaler.kube.client import Kube, object_time
from autoscaler.kube.nodewaits import NodeWaits
from autoscaler.kube.warmpool import WARM_POOL_LABEL
from policies.types import ClusterState

SCHEDULER = "default-scheduler"
NO_CAPACITY_REASONS = ("FailedScheduling", "NotTriggerScaleUp")
# A provisioner's "cannot" counts while it is recent: it repeats it while it still cannot.
NO_CAPACITY_MEMORY_S = 120.0


def provisioner_cannot(reason: str | None, source: str) -> bool:
    """Whether an Event about a pod is a provisioner saying it cannot place it (the scheduler's own
    FailedScheduling says nothing about provisioning)."""
    return reason in NO_CAPACITY_REASONS and source != SCHEDULER


def label_selector(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


class ClusterReader:
    def __init__(self, kube: Kube, *, namespace: str, kind: str, name: str, warm_pool=None,
                 nodes: NodeReader | None = None, budget: BudgetReader | None = None,
                 gpu_resource: str | None = None) -> None:
        """`warm_pool`: the warm pool backend (its `ready()` counts ready slots), or None; `nodes`, `budget`:
        the capacity model's readers (None: no idle slots counted, no budget)."""
        self.kube = kube
        self.namespace, self.kind, self.name = namespace, kind, name
        self.warm_pool = warm_pool
        self.nodes, self.budget, self.gpu_resource = nodes, budget, gpu_resource
        self._reported: set[str] = set()
        self.node_waits = NodeWaits(kube)
        self._capped: set[str] = set()  # uids of pods a provisioner said it could not place
        self._template = None  # the pod template seen by the latest read, for the warm pool

    async def _workload(self):
        read = (self.kube.apps.read_namespaced_deployment if self.kind == "Deployment"
                else self.kube.apps.read_namespaced_stateful_set)
        return await self.kube.call(f"read {self.kind} {self.namespace}/{self.name}", read, self.name, self.namespace)

    async def _no_capacity(self, waiting: dict[str, float | None], now: float) -> tuple[set[str], str]:
        """Which of the waiting pods a provisioner said it cannot place (recently), and what it said."""
        events = await self.kube.call(
            f"list events {self.namespace}", self.kube.core.list_namespaced_event, self.namespace,
            field_selector="involvedObject.kind=Pod",
        )
        stuck, message = set(), ""
        for event in events.items:
            source = (event.source.component if event.source else None) or event.reporting_component or ""
            name = event.involved_object.name if event.involved_object else None
            if name not in waiting or not provisioner_cannot(event.reason, source):
                continue
            at = object_time(event.last_timestamp or event.event_time or event.metadata.creation_timestamp)
            if at is not None and now - at <= NO_CAPACITY_MEMORY_S:
                stuck.add(name)
                message = f"{source}: {event.message}"
        return stuck, message

    def _ours(self, uids: set[str]):
        """Whether a pod is one of the target's (by uid) or one of its warm placeholders."""
        pool = getattr(self.warm_pool, "name", None)

        def ours(pod) -> bool:
            labels = pod.metadata.labels or {}
            return pod.metadata.uid in uids or (pod.metadata.namespace == self.namespace and pool is not None
                                                and labels.get(WARM_POOL_LABEL) == pool)
        return ours

    async def pod_template(self):
        """The target's pod template: from this tick's read when there was one, else read now."""
        if self._template is None:
            self._template = (await self._workload()).spec.template
        return self._template

    async def read(self, now: float) -> ClusterState:
        workload = await self._workload()
        self._template = workload.spec.template
        spec_replicas = workload.spec.replicas if workload.spec.replicas is not None else 1
        ready = (workload.status.ready_replicas or 0) if workload.status else 0
        selector = label_selector(workload.spec.selector.match_labels or {})
        pods = await self.kube.call(
            f"list pods {self.namespace} {selector}", self.kube.core.list_namespaced_pod, self.namespace,
            label_selector=selector,
        )
        durations, seen, waiting = [], set(), {}
        for pod in pods.items:
            uid = pod.metadata.uid
            seen.add(uid)
            conditions = {c.type: c for c in (pod.status.conditions or [])} if pod.status else {}
            scheduled = conditions.get("PodScheduled")
            if scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable":
                waiting[pod.metadata.name] = object_time(pod.metadata.creation_timestamp)
            ready_c = conditions.get("Ready")
            if ready_c is not None and ready_c.status == "True" and uid not in self._reported:
                self._reported.add(uid)
                # Start-up is from the pod's placement on a node to Ready (image pull, weight load, warm-up):
                # a pod that first waited for a node to be provisioned must not count that wait twice (the
                # policy adds node provisioning itself when no warm slot is free). Pods already Ready at the
                # first read (a restarted controller) give their start-up back too.
                began = object_time(scheduled.last_transition_time) if scheduled is not None and \
                    scheduled.status == "True" else object_time(pod.metadata.creation_timestamp)
                became = object_time(ready_c.last_transition_time)
                if began is not None and became is not None and became >= began:
                    durations.append(became - began)
        self._reported &= seen
        warm = await self.warm_pool.ready() if self.warm_pool is not None else 0
        stuck, why = await self._no_capacity(waiting, now) if waiting else (set(), "")
        # A pod a provisioner could not place (a limit, a quota, no offering) waited for capacity, not for a
        # node's provisioning: its wait teaches the lead time nothing.
        self._capped = {p.metadata.uid for p in pods.items if p.metadata.name in stuck} | (self._capped & seen)
        oldest = max((now - t for t in waiting.values() if t is not None), default=0.0)
        shape = replica_shape(workload.spec.template, self.gpu_resource)
        room = (await self.nodes.room(workload.spec.template, shape, self._ours(seen), self.namespace)
                if self.nodes else None)
        budget = await self.budget.read(workload, shape, pods.items) if self.budget else None
        node_waits = await self.node_waits.learn(pods.items, skip=self._capped)
        return ClusterState(
            spec_replicas=spec_replicas,
            ready_replicas=ready,
            starting_replicas=max(0, spec_replicas - ready),
            unschedulable_pods=len(waiting),
            no_capacity_pods=len(stuck),
            no_capacity_reason=why,
            oldest_unschedulable_s=oldest,
            warm_slots_ready=warm,
            idle_slots=room.idle_slots if room else 0,
            gpus_held=room.gpus_held if room else 0.0,
            gpu_cost_per_hour=room.cost_per_hour if room else None,
            budget_replicas=budget.replicas if budget else None,
            budget_reason=budget.reason if budget else "",
            startup_durations_s=tuple(durations),
            node_waits_s=node_waits,
            at_s=now,
        )
