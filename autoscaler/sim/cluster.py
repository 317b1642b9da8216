"""A simulated GPU cluster for one model: replicas, warm slots and idle nodes, with their GPU cost.

A replica needs `gpus_per_replica` GPUs (N) on one node of `gpus_per_node` GPUs (M): a node has k = M // N
replica-shaped slots, and the M mod N GPUs left over serve no replica but are paid for. This module is the
slot model, exact for k = 1 (one slot is one node); `autoscaler.sim.nodes` tracks nodes of k > 1 slots,
and `SimCluster.started` picks the model from the shape.

One replica needs one slot. A new replica lands, in this order of preference, on:
1. a ready warm slot (a placeholder pod is preempted): ready after its start-up time;
2. an idle node slot (freed recently, not yet removed by the cluster autoscaler): start-up time;
3. a placeholder still waiting for its node: that node's arrival, then start-up;
4. a new node: node provisioning, then start-up.
Start-up and provisioning times are drawn with jitter from a seeded RNG (deterministic).
Scale-down removes the newest (least ready) replicas first; a freed slot goes to a pending placeholder if
one waits, else idles for `node_idle_timeout_s` (cluster-autoscaler's scale-down-unneeded-time, 10 min).

GPU cost, all counted, in slot-seconds: replicas from creation (warming) to removal (serving), placeholders
from request to removal or preemption (warm pool), idle nodes until reused or removed (idle); x N GPUs.
A node is billed from its request to its removal: with k = 1 its life is its slot's, so node GPU-hours
are the slot-seconds x M (x N for the replica-level figure).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies.types import ClusterState


@dataclass(frozen=True)
class ClusterModel:
    """The cluster's timing and shape. Replica and node shapes in GPUs: e.g. a 4-GPU (tensor-parallel)
    replica on 8-GPU nodes, 2 replicas per node; a 3-GPU replica on 8-GPU nodes leaves 2 GPUs unusable."""

    startup_s: float = 120.0
    startup_jitter_ratio: float = 0.25  # start-up ~ U(1 - j/2, 1 + j) x startup_s
    node_provisioning_s: float = 300.0
    node_jitter_ratio: float = 0.2
    node_idle_timeout_s: float = 600.0
    seed: int = 3
    # The node pool's limit in nodes, as (from time s, nodes) steps; empty: no limit. A replica that needs a
    # new node beyond it stays Pending (no node, no cost) until the limit is raised.
    node_limit: tuple[tuple[float, int], ...] = ()
    gpus_per_replica: int = 1
    gpus_per_node: int = 1

    def __post_init__(self) -> None:
        for name in ("gpus_per_replica", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r}: must be a whole number of GPUs >= 1")
        if self.gpus_per_replica > self.gpus_per_node:
            raise ValueError(f"gpus_per_replica = {self.gpus_per_replica} is more than gpus_per_node = "
                             f"{self.gpus_per_node}: a replica must fit on one node")

    @property
    def replicas_per_node(self) -> int:
        return self.gpus_per_node // self.gpus_per_replica

    def nodes_allowed(self, now: float) -> float:
        allowed = math.inf
        for since, nodes in self.node_limit:
            if since <= now:
                allowed = nodes
        return allowed

    @property
    def worst_cold_start_s(self) -> float:
        """The slowest a new replica on a new node can be, given the jitter."""
        return self.startup_s * (1 + self.startup_jitter_ratio) + self.node_provisioning_s * (1 + self.node_jitter_ratio)


@dataclass
class Costs:
    """Replica-shaped slot-seconds by what held them, and node-seconds. Replica-level GPU-hours count what
    replicas and placeholders held and idle nodes (every slot of an empty node); node GPU-hours add the
    free slots of nodes in use (`spare_s`) and the GPUs no replica fits in: the money figure.
    Node-seconds x k = warming + serving + warm pool + idle + spare slot-seconds."""

    warming_s: float = 0.0
    serving_s: float = 0.0
    warm_pool_s: float = 0.0
    idle_s: float = 0.0  # slots of empty nodes
    spare_s: float = 0.0  # free slots of nodes in use (k > 1 only)
    node_s: float = 0.0  # node existence, request to removal, summed over nodes
    gpus_per_replica: int = 1
    gpus_per_node: int = 1

    @property
    def total_gpu_hours(self) -> float:
        """Replica-level GPU-hours: in GPUs, without the free slots of partly used nodes."""
        return (self.warming_s + self.serving_s + self.warm_pool_s + self.idle_s) * self.gpus_per_replica / 3600.0

    @property
    def node_hours(self) -> float:
        return self.node_s / 3600.0

    @property
    def node_gpu_hours(self) -> float:
        """Every GPU of every node while it exists: what the cluster is billed."""
        return self.node_s * self.gpus_per_node / 3600.0


@dataclass
class _Pod:
    created_s: float
    ready_s: float
    node: Any = field(default=None, compare=False, repr=False)  # its `nodes._Node` in the node model


@dataclass
class SimCluster:
    model: ClusterModel
    now: float
    pods: list[_Pod] = field(default_factory=list)  # sorted by ready_s
    warm_ready: list[float] = field(default_factory=list)  # creation times
    warm_pending: list[tuple[float, float]] = field(default_factory=list)  # (created, node ready)
    idle: list[tuple[float, float]] = field(default_factory=list)  # (freed, expires)
    costs: Costs = field(default_factory=Costs)
    scaling_actions: int = 0
    # How long each replica added after the start took from its order to Ready: the time to capacity.
    capacity_lags_s: list[float] = field(default_factory=list)
    unplaced: list[float] = field(default_factory=list)  # creation times of replicas no node can be made for
    _startups_seen: list[float] = field(default_factory=list)
    _reported_until: float = -1e18

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.model.seed)
        self.costs.gpus_per_replica = self.model.gpus_per_replica
        self.costs.gpus_per_node = self.model.gpus_per_node

    @classmethod
    def started(cls, model: ClusterModel, *, replicas: int, now: float) -> "SimCluster":
        """`replicas` ready at `now`; the node model when a node holds more than one replica."""
        if cls is SimCluster and model.replicas_per_node > 1:
            from autoscaler.sim.nodes import NodeCluster  # it builds on this module

            return NodeCluster.started(model, replicas=replicas, now=now)
        cluster = cls(model=model, now=now)
        cluster.pods = [_Pod(now, now) for _ in range(replicas)]
        return cluster

    # -- time -------------------------------------------------------------------------------------------
    def _startup(self) -> float:
        j = self.model.startup_jitter_ratio
        return self.model.startup_s * self.rng.uniform(1 - j / 2, 1 + j)

    def _provisioning(self) -> float:
        j = self.model.node_jitter_ratio
        return self.model.node_provisioning_s * self.rng.uniform(1 - j, 1 + j)

    def advance(self, now: float) -> None:
        """Expire idle nodes and land pending placeholders up to `now`."""
        kept = []
        for freed, expires in self.idle:
            if expires <= now:
                self.costs.idle_s += expires - freed
            else:
                kept.append((freed, expires))
        self.idle = kept
        landed = [p for p in self.warm_pending if p[1] <= now]
        if landed:
            self.warm_pending = [p for p in self.warm_pending if p[1] > now]
            self.warm_ready += [created for created, _ in landed]
        self.now = now
        while self.unplaced and self._nodes() < self.model.nodes_allowed(now):
            created = self.unplaced.pop(0)
            self.pods.remove(next(p for p in self.pods if p.created_s == created and p.ready_s == math.inf))
            ready = now + self._provisioning() + self._startup()
            bisect.insort(self.pods, _Pod(now, ready), key=lambda p: p.ready_s)  # billed from its node on
            self.capacity_lags_s.append(ready - created)

    def _nodes(self) -> int:
        """Nodes that exist or are being made: placed replicas, warm slots, idle nodes."""
        return len(self.pods) - len(self.unplaced) + len(self.warm_ready) + len(self.warm_pending) + len(self.idle)

    # -- observation ----------------------------------------------------------------------------------------
    @property
    def warm_slots(self) -> int:
        """Placeholders, ready or waiting for their node."""
        return len(self.warm_ready) + len(self.warm_pending)

    def _warm_slots_ready(self) -> int:
        return len(self.warm_ready)

    def _idle_slots(self) -> int:
        return len(self.idle)

    def ready(self, at: float | None = None) -> int:
        at = self.now if at is None else at
        return bisect.bisect_right([p.ready_s for p in self.pods], at)

    def ready_times_between(self, start: float, end: float) -> list[float]:
        return [p.ready_s for p in self.pods if start < p.ready_s <= end]

    def state(self) -> ClusterState:
        ready = self.ready()
        seen = tuple(
            p.ready_s - p.created_s
            for p in self.pods
            if self._reported_until < p.ready_s <= self.now and p.ready_s > p.created_s
        )
        self._reported_until = self.now
        return ClusterState(
            spec_replicas=len(self.pods),
            ready_replicas=ready,
            starting_replicas=len(self.pods) - ready,
            warm_slots_ready=self._warm_slots_ready(),
            idle_slots=self._idle_slots(),
            unschedulable_pods=len(self.unplaced),
            no_capacity_pods=len(self.unplaced),
            no_capacity_reason="the node pool's limit is reached" if self.unplaced else "",
            oldest_unschedulable_s=self.now - self.unplaced[0] if self.unplaced else 0.0,
            startup_durations_s=seen,
            at_s=self.now,
        )

    # -- actions --------------------------------------------------------------------------------------------
    def _free_slot(self) -> None:
        if self.warm_pending:
            created, _ = self.warm_pending.pop()
            self.warm_ready.append(created)
        else:
            self.idle.append((self.now, self.now + self.model.node_idle_timeout_s))

    def _take_idle(self) -> bool:
        if not self.idle:
            return False
        freed, _ = self.idle.pop()
        self.costs.idle_s += self.now - freed
        return True

    def _add_pod(self) -> None:
        now = self.now
        if self.warm_ready:
            created = self.warm_ready.pop()
            self.costs.warm_pool_s += now - created
            ready = now + self._startup()
        elif self._take_idle():
            ready = now + self._startup()
        elif self.warm_pending:
            created, node_ready = self.warm_pending.pop(0)
            self.costs.warm_pool_s += now - created
            ready = node_ready + self._startup()
        elif self._nodes() >= self.model.nodes_allowed(now):
            self.unplaced.append(now)
            bisect.insort(self.pods, _Pod(now, math.inf), key=lambda p: p.ready_s)
            return
        else:
            ready = now + self._provisioning() + self._startup()
        bisect.insort(self.pods, _Pod(now, ready), key=lambda p: p.ready_s)
        self.capacity_lags_s.append(ready - now)

    def _remove_pod(self) -> None:
        pod = self.pods.pop()  # the least ready: an unplaced one first
        if pod.ready_s == math.inf:
            self.unplaced.remove(pod.created_s)
            return  # never had a node: nothing to bill, nothing freed
        self.costs.warming_s += min(self.now, pod.ready_s) - pod.created_s
        self.costs.serving_s += max(0.0, self.now - pod.ready_s)
        self._free_slot()

    def scale_to(self, replicas: int) -> None:
        replicas = max(0, replicas)
        if replicas != len(self.pods):
            self.scaling_actions += 1
        while len(self.pods) < replicas:
            self._add_pod()
        while len(self.pods) > replicas:
            self._remove_pod()

    def warm_to(self, slots: int) -> None:
        while len(self.warm_ready) + len(self.warm_pending) < slots:
            if not self.idle and self._nodes() >= self.model.nodes_allowed(self.now):
                break  # a placeholder beyond the limit would stay Pending: it holds nothing
            if self._take_idle():
                self.warm_ready.append(self.now)
            else:
                self.warm_pending.append((self.now, self.now + self._provisioning()))
        while len(self.warm_ready) + len(self.warm_pending) > slots:
            if self.warm_pending:
                created, _ = self.warm_pending.pop()
                self.costs.warm_pool_s += self.now - created
            else:
                created = self.warm_ready.pop()
                self.costs.warm_pool_s += self.now - created
                self.idle.append((self.now, self.now + self.model.node_idle_timeout_s))

    def finish(self) -> Costs:
        """Stop the clock: everything still running is billed up to now (idle nodes too)."""
        while self.pods:
            self._remove_pod()
        self.warm_to(0)
        for freed, expires in self.idle:
            self.costs.idle_s += min(expires, self.now) - freed
        self.idle = []
        c = self.costs
        c.node_s = c.warming_s + c.serving_s + c.warm_pool_s + c.idle_s  # one slot, one node
        return self.costs
