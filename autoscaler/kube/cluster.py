"""Cluster state of the target from the Kubernetes API, as `policies.ClusterState`.

- spec / ready replicas from the target's scale subresource and status (a terminating pod not counted
  Ready, also while the status still counts it: `serving_replicas`); starting = spec - ready;
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
  replicas the GPU budget allows, with its reason. A warm pool whose slots are free room on the nodes (a
  CapacityBuffer: `WarmPool.room_kept`) is in that free room too (`warm_and_idle`): its ready slots are at
  most the free room for the template on Ready nodes (its status lags: Karpenter counts nodes still
  starting as room, and sees a replica that took the room at its next look at the buffer, up to ~30 s
  later), and taken out of the idle slots, so that the policy does not count the buffer's room twice.
  Where node room is not known (`capacity.read_nodes` off outside the fleet's watch cache, or the nodes'
  read failed), the buffer's status is taken as it is.

A pod is read once (`pods.pod_facts`). After the target and its pods, the readers that need only those (the
warm pool's ready slots, the provisioners' Events, the nodes' room, the budget) run concurrently, inside the
one deadline of the tick, into one frozen `CapacityReading`. Each keeps its own way with errors: the nodes'
reader takes an error as no idle slot; an error of the warm pool, the Events or the budget fails the read
(the tick holds), and when several fail, the first in that order is raised. Node waits come last: they skip
the pods a provisioner could not place, and are learned only once the other readers succeeded, so a failed
read does not use up their samples.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from autoscaler.kube.budget import Budget, BudgetReader
from autoscaler.kube.capacity import NodeReader, NodeRoom, replica_shape
from autoscaler.kube.client import Kube, object_time
from autoscaler.kube.nodewaits import NodeWaits
from autoscaler.kube.pods import PodFacts, pod_facts
from autoscaler.kube.reads import ApiReads, ClusterReads, label_selector  # noqa: F401 - label_selector re-exported
from autoscaler.kube.warmpool import WARM_POOL_LABEL, WarmPool
from policies.types import ClusterState

SCHEDULER = "default-scheduler"
NO_CAPACITY_REASONS = ("FailedScheduling", "NotTriggerScaleUp")
# A provisioner's "cannot" counts while it is recent: it repeats it while it still cannot.
NO_CAPACITY_MEMORY_S = 120.0


def provisioner_cannot(reason: str | None, source: str) -> bool:
    """Whether an Event about a pod is a provisioner saying it cannot place it (the scheduler's own
    FailedScheduling says nothing about provisioning)."""
    return reason in NO_CAPACITY_REASONS and source != SCHEDULER


@dataclass(frozen=True)
class CapacityReading:
    """What the capacity readers found in one read: ready warm slots, the waiting pods a provisioner said it
    cannot place (by name) and what it said, the room on the nodes and the GPU budget (None: not read)."""

    warm_slots_ready: int = 0
    stuck: frozenset[str] = frozenset()
    stuck_reason: str = ""
    room: NodeRoom | None = None
    budget: Budget | None = None


async def _first_error_raised(*coros):
    """The results of `coros`, run concurrently; the first error in the given order is raised once all ended."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def warm_and_idle(warm_slots: int, room: NodeRoom | None, *, room_kept: bool) -> tuple[int, int]:
    """The ready warm slots and idle node slots the policy is given (`room` None: not known). A warm pool
    whose slots are free room (`room_kept`) is part of the nodes' free room: counted as idle slots too, the
    warm stage would take the buffer's own room for idle room and ask for fewer slots (asked 0 -> the hold
    expires -> the provisioner removes the room -> asked again: a loop); and a slot without free room is no
    slot, whatever the buffer's status still says (a replica took it; a node is still starting). E.g. a
    buffer of 2 ready 1-GPU slots: an empty 2-GPU node beside 1 other free GPU gives 2 warm, 1 idle; full
    nodes give 0 and 0."""
    if room is None:
        return warm_slots, 0
    if not room_kept:
        return warm_slots, room.idle_slots
    warm = min(warm_slots, room.idle_slots)
    return warm, room.idle_slots - warm


def startup_s(pod: PodFacts) -> float | None:
    """A Ready pod's start-up: from its placement on a node to Ready (image pull, weight load, warm-up). A pod
    that first waited for a node must not count that wait twice (the policy adds node provisioning itself
    when no warm slot is free)."""
    began, became = pod.began_s, pod.ready_s
    return became - began if began is not None and became is not None and became >= began else None


def serving_replicas(ready_replicas: int, pods: list[PodFacts]) -> int:
    """The Ready replicas that take requests. A pod being deleted (its preStop and drain) stops counting in
    the workload's status only once its ReplicaSet's status is written; until then the status still counts
    it, so while any pod is terminating the Ready pods not being deleted are counted instead. The admission
    endpoint releases held requests on this count: never to a replica that is draining."""
    if not any(p.deleting for p in pods):
        return ready_replicas
    return min(ready_replicas, sum(1 for p in pods if p.ready and not p.deleting))


class ClusterReader:
    def __init__(self, kube: Kube, *, namespace: str, kind: str, name: str, warm_pool: WarmPool | None = None,
                 nodes: NodeReader | None = None, budget: BudgetReader | None = None,
                 gpu_resource: str | None = None, reads: ClusterReads | None = None,
                 idle_counted: bool = True) -> None:
        """`warm_pool`: the warm pool backend, or None; `nodes`, `budget`: the capacity model's readers (None:
        no idle slots counted, no budget); `reads`: where the items come from (default: the API, per read);
        `idle_counted` False: `nodes` only bounds a CapacityBuffer's ready slots (the fleet's watch cache
        holds the nodes whether or not `capacity.read_nodes` asks for idle slots), no idle slot is counted."""
        self.kube = kube
        self.reads = reads or ApiReads(kube)
        self.namespace, self.kind, self.name = namespace, kind, name
        self.warm_pool = warm_pool
        self.nodes, self.budget, self.gpu_resource = nodes, budget, gpu_resource
        self.idle_counted = idle_counted
        self._reported: set[str] = set()
        self.node_waits = NodeWaits(kube, reads=self.reads)
        self._capped: set[str] = set()  # uids of pods a provisioner said it could not place
        self._template = None  # the pod template seen by the latest read, for the warm pool

    def carry_over(self, old: "ClusterReader") -> None:
        """Keep what `old` (a reader of the same target under earlier settings) has reported and learned: the
        pods whose start-ups it gave, the node waits counted, the pods a provisioner could not place. A spec
        change must not hand the policy the same start-ups again."""
        self._reported, self._capped = set(old._reported), set(old._capped)
        self.node_waits = old.node_waits

    async def _workload(self):
        return await self.reads.workload(self.namespace, self.kind, self.name)

    async def _no_capacity(self, waiting: dict[str, float | None], now: float) -> tuple[set[str], str]:
        """Which of the waiting pods a provisioner said it cannot place (recently), and what it said."""
        if not waiting:
            return set(), ""
        stuck, message = set(), ""
        for event in await self.reads.pod_events(self.namespace):
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
        pool = self.warm_pool.name if self.warm_pool is not None else None

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

    def _startups(self, pods: list[PodFacts]) -> list[float]:
        """Start-ups of the pods that became Ready since the last read, each pod once; pods already Ready at
        the first read (a restarted controller) give their start-up back too."""
        durations = []
        for pod in pods:
            if pod.ready and pod.uid not in self._reported:
                self._reported.add(pod.uid)
                duration = startup_s(pod)
                if duration is not None:
                    durations.append(duration)
        self._reported &= {pod.uid for pod in pods}
        return durations

    async def _capacity(self, workload, *, listed: list, waiting: dict[str, float | None],
                        now: float) -> CapacityReading:
        """The capacity readers, concurrently (see the module docstring)."""
        template = workload.spec.template
        shape = replica_shape(template, self.gpu_resource)
        seen = {p.metadata.uid for p in listed}

        async def nothing():
            return None

        warm, (stuck, why), room, budget = await _first_error_raised(
            self.warm_pool.ready() if self.warm_pool is not None else nothing(),
            self._no_capacity(waiting, now),
            self.nodes.room(template, shape, self._ours(seen), self.namespace) if self.nodes else nothing(),
            self.budget.read(workload, shape, listed) if self.budget else nothing(),
        )
        return CapacityReading(warm_slots_ready=warm or 0, stuck=frozenset(stuck), stuck_reason=why, room=room,
                               budget=budget)

    async def read(self, now: float) -> ClusterState:
        workload = await self._workload()
        self._template = workload.spec.template
        spec_replicas = workload.spec.replicas if workload.spec.replicas is not None else 1
        ready = (workload.status.ready_replicas or 0) if workload.status else 0
        listed = await self.reads.pods(self.namespace, workload.spec.selector.match_labels or {})
        pods = [pod_facts(p) for p in listed]
        ready = serving_replicas(ready, pods)
        durations = self._startups(pods)
        waiting = {p.name: p.created_s for p in pods if p.unschedulable}
        found = await self._capacity(workload, listed=listed, waiting=waiting, now=now)
        # A pod a provisioner could not place (a limit, a quota, no offering) waited for capacity, not for a
        # node's provisioning: its wait teaches the lead time nothing.
        seen = {p.uid for p in pods}
        self._capped = {p.uid for p in pods if p.name in found.stuck} | (self._capped & seen)
        node_waits = await self.node_waits.learn(pods, skip=self._capped)
        oldest = max((now - t for t in waiting.values() if t is not None), default=0.0)
        room, budget = found.room, found.budget
        warm, idle = warm_and_idle(found.warm_slots_ready, room,
                                   room_kept=self.warm_pool is not None and self.warm_pool.room_kept)
        if not self.idle_counted:
            room, idle = None, 0
        return ClusterState(
            spec_replicas=spec_replicas,
            ready_replicas=ready,
            starting_replicas=max(0, spec_replicas - ready),
            unschedulable_pods=len(waiting),
            no_capacity_pods=len(found.stuck),
            no_capacity_reason=found.stuck_reason,
            oldest_unschedulable_s=oldest,
            warm_slots_ready=warm,
            idle_slots=idle,
            gpus_held=room.gpus_held if room else 0.0,
            gpu_cost_per_hour=room.cost_per_hour if room else None,
            budget_replicas=budget.replicas if budget else None,
            budget_reason=budget.reason if budget else "",
            startup_durations_s=tuple(durations),
            node_waits_s=node_waits,
            at_s=now,
        )
