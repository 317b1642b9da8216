"""The simulated GPU cluster of one model: nodes of replica-shaped slots, replicas, warm placeholders and
their GPU cost, behind the small `Cluster` protocol the simulator's drivers use (`run`, `rate`, `request`).

A replica needs `gpus_per_replica` GPUs (N) on one node of `gpus_per_node` GPUs (M): a node has k = M // N
replica-shaped slots, and the M mod N GPUs left over serve no replica but are paid for. The ordinary case
is one replica per node (k = 1: one-GPU replicas on one-GPU nodes). A node exists, and is billed for all M
GPUs, from its request (provisioning) to its removal: while any slot holds a replica or a warm placeholder,
and for `node_idle_timeout_s` after its last slot freed (cluster-autoscaler's scale-down-unneeded-time,
Karpenter's consolidateAfter), whether it had arrived or not (its request is not withdrawn). E.g. 4-GPU
replicas on 8-GPU nodes: two replicas share a node and cost 8 GPUs, one replica alone costs 8 GPUs too (4 of
them idle), and a 3-GPU replica leaves 2 GPUs of every node unused.

A new replica lands, in this order of preference:
1. on a ready warm slot (its placeholder is preempted): start-up;
2. on a free slot of a ready node, the fullest first (so that emptier nodes can go): start-up;
3. on a free slot of a node being provisioned, the earliest first: that node's arrival, then start-up;
4. in place of a placeholder waiting for its node: that node's arrival, then start-up;
5. on a new node, which brings k slots: provisioning, then start-up; beyond `node_limit` (in nodes) it stays
   Pending, unplaced, at no cost, until the limit is raised.
A placeholder goes to 2, 3 or 5. Start-up and provisioning times are drawn with jitter from a seeded RNG
(deterministic). A twin of a live run replays the live times instead (`node_waits`, `startups`): a node (a
replica) requested at t takes the live one requested earliest within `REPLAY_MATCH_S` of t and not yet
taken: the node arrives when that live one did (its request time plus its wait), the replica starts up for
as long as that one did. So the nodes of a batch arrive when the live ones did (a provisioner brings a batch
in steps, on its own clock: at a cold start from zero, the first node and start-up decide when the first
held request is served); one without a match takes a drawn time. A node wait recorded with the start-up of
the replica that waited (t, wait, start-up) replays the two together: the replica that requests the node
starts up as that live replica did, so a replica turns Ready when a live one did, not at one node's arrival
plus another's start-up.

Scale-down removes unplaced and then not-ready replicas, least ready first; then ready ones from the
least-used node, which is what the controller's pod-deletion-cost ordering makes the ReplicaSet do, so that
whole nodes empty out. A slot freed on a ready node takes a placeholder still waiting for its node, as the
scheduler would place that Pending pod.

GPU cost, in slot-seconds: replicas from creation (warming) to removal (serving), placeholders from request
to removal or preemption (warm pool), free slots of empty nodes (idle) and of nodes in use (spare); node
seconds from request to removal. Node-seconds x k = warming + serving + warm pool + idle + spare.

Churn: the placeholders the pool created (and how many of them requested a node), the ones it deleted (the
pool shrank) and the ones replicas preempted are counted (`WarmChurn`). A pool whose size moves a slot or
two from tick to tick deletes and re-creates placeholders; a re-created one lands on its old node while that
idles, and needs a new node once it is gone.

Several clusters (one per model) act as one node pool through `borrow`: a cluster takes another's arrived
node that holds no replica (an empty one, or one holding only ready placeholders) with its times, and bills
all of it, from its request on, as its own, so the clusters' summed bill is the pool's.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from policies.types import ClusterState

# A live run's node or replica request and its twin's for the same demand lie a few control ticks apart (the
# live controller ticks on its own clock; creation times are kept to the second, 10 s of a run at factor 10).
REPLAY_MATCH_S = 60.0


def _replayed(left: list[tuple[float, ...]], now: float) -> tuple[float, ...] | None:
    """The earliest (request time, seconds, ...) in `left` requested within REPLAY_MATCH_S of `now`, taken out
    of it; or None."""
    for i, entry in enumerate(left):
        if abs(entry[0] - now) <= REPLAY_MATCH_S:
            del left[i]
            return entry
        if entry[0] > now + REPLAY_MATCH_S:
            return None
    return None


def _take(left: list[tuple[float, ...]], entry: tuple[float, float]) -> None:
    """Take `entry` out of `left` if it is there (a start-up replayed with the node wait it was recorded with)."""
    if entry in left:
        left.remove(entry)


def timed_pair(value: object, *, with_startup: bool = False) -> bool:
    """(request time s, seconds >= 0), finite numbers: an entry of `ClusterModel.node_waits` or `startups`,
    and of the series a closed-loop run records for them (read back from its result.json). `with_startup`
    (a node wait): a third number may follow, the start-up (seconds >= 0) of the replica that waited."""
    if not isinstance(value, list | tuple) or len(value) not in ((2, 3) if with_startup else (2,)):
        return False
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value):
        return False
    return all(x >= 0 for x in value[1:])


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
    # (request time s, seconds) of a live run's node waits and replica start-ups, in order of request:
    # replayed (above); a node wait may carry the start-up of the replica that waited, (t, wait, start-up)
    node_waits: tuple[tuple[float, ...], ...] = ()
    startups: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("node_waits", "startups"):
            if not all(timed_pair(w, with_startup=name == "node_waits") for w in getattr(self, name)):
                raise ValueError(f"{name}: each must be (request time s, seconds >= 0), finite"
                                 + (", and a node wait's start-up after it if known" if name == "node_waits" else ""))
        for name in ("gpus_per_replica", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r}: must be a whole number of GPUs >= 1")
        if self.gpus_per_replica > self.gpus_per_node:
            raise ValueError(f"gpus_per_replica = {self.gpus_per_replica} is more than gpus_per_node = "
                             f"{self.gpus_per_node}: a replica must fit on one node")

    @property
    def shape(self) -> tuple[int, int]:
        """(GPUs per replica, GPUs per node): clusters of one shape can share nodes."""
        return self.gpus_per_replica, self.gpus_per_node

    @property
    def replicas_per_node(self) -> int:
        return self.gpus_per_node // self.gpus_per_replica

    def nodes_allowed(self, now: float) -> float:
        allowed = math.inf
        for since, nodes in self.node_limit:
            if since <= now:
                allowed = nodes
        return allowed

    @functools.cached_property
    def slowest_provisioning_s(self) -> float:
        """The longest a node can take, drawn with the jitter or replayed (every tick reads it: kept)."""
        return max([self.node_provisioning_s * (1 + self.node_jitter_ratio), *(w[1] for w in self.node_waits)])

    @property
    def worst_cold_start_s(self) -> float:
        """The slowest a new replica on a new node can be, drawn with the jitter or replayed."""
        startup = max([self.startup_s * (1 + self.startup_jitter_ratio), *(w for _, w in self.startups)])
        return startup + self.slowest_provisioning_s


@dataclass
class Costs:
    """Replica-shaped slot-seconds by what held them, and node-seconds. Replica GPU-hours count what
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
    def replica_gpu_hours(self) -> float:
        """GPU-hours of replica-shaped slots, N GPUs each: replicas (warming, serving), warm placeholders and
        the slots of empty nodes; not the free slots of nodes in use nor the GPUs no replica fits in, which
        `node_gpu_hours` counts."""
        return (self.warming_s + self.serving_s + self.warm_pool_s + self.idle_s) * self.gpus_per_replica / 3600.0

    @property
    def node_hours(self) -> float:
        return self.node_s / 3600.0

    @property
    def node_gpu_hours(self) -> float:
        """Every GPU of every node while it exists: what the cluster is billed."""
        return self.node_s * self.gpus_per_node / 3600.0


@dataclass
class WarmChurn:
    """Placeholders created, deleted because the pool shrank, and preempted by a replica, over a run (the
    pool emptied by `finish` is not counted); and how many of those created needed a new node."""

    created: int = 0
    deleted: int = 0
    preempted: int = 0
    new_nodes: int = 0  # of those created, the ones that requested a node of their own (none was free)


class Cluster(Protocol):
    """What the simulator's drivers use of a simulated cluster: time, observation, actions, the bill."""

    scaling_actions: int
    warm_churn: WarmChurn
    capacity_lags_s: list[float]  # order -> Ready of every replica added after the start

    @property
    def replicas(self) -> int: ...  # ordered (the Deployment's spec), placed or not

    @property
    def warm_slots(self) -> int: ...  # placeholders, ready or waiting for their node

    def advance(self, now: float) -> None: ...

    def ready(self, at: float | None = None) -> int: ...

    def ready_times_between(self, start: float, end: float) -> list[float]: ...

    def state(self) -> ClusterState: ...

    def scale_to(self, replicas: int) -> None: ...

    def warm_to(self, slots: int) -> None: ...

    def finish(self) -> Costs: ...


@dataclass(eq=False)
class _Node:
    created_s: float
    ready_s: float  # arrival: from then on the node takes pods
    pods: list[_Pod] = field(default_factory=list)
    placeholders: list[float] = field(default_factory=list)  # creation times of its warm placeholders, sorted
    empty_since: float | None = None  # when its last slot freed; None while a slot is used
    settled_s: float = 0.0  # its free slots are billed up to here
    # the live (request time, start-up) recorded with the node wait it replays, for the first replica on it
    startup: tuple[float, float] | None = None

    @property
    def used(self) -> int:
        return len(self.pods) + len(self.placeholders)


@dataclass
class _Pod:
    created_s: float
    ready_s: float  # math.inf while unplaced
    node: _Node | None = field(default=None, compare=False, repr=False)  # None while unplaced


def _ready_key(pod: _Pod) -> float:
    return pod.ready_s


def _created_key(node: _Node) -> float:
    return node.created_s


def _remove_this(items: list, item: object) -> None:
    """Remove `item` itself, not an equal one: two pods created and ready together compare equal."""
    del items[next(i for i in range(len(items) - 1, -1, -1) if items[i] is item)]


@dataclass
class SimCluster:
    """The cluster's nodes, replicas and placeholders at `now`, and what they cost so far."""

    model: ClusterModel
    now: float
    pods: list[_Pod] = field(default_factory=list)  # sorted by ready_s
    nodes: list[_Node] = field(default_factory=list)  # in order of request
    costs: Costs = field(default_factory=Costs)
    scaling_actions: int = 0
    warm_churn: WarmChurn = field(default_factory=WarmChurn)
    # How long each replica added after the start took from its order to Ready: the time to capacity.
    capacity_lags_s: list[float] = field(default_factory=list)
    unplaced: list[float] = field(default_factory=list)  # creation times of replicas no node can be made for
    _reported_until: float = -1e18
    _placeholders: int = 0  # over all nodes: the warm slots, counted as they come and go

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.model.seed)
        self._waits_left = sorted(self.model.node_waits, key=lambda w: w[0])  # stable: ties keep their order
        self._startups_left = sorted(self.model.startups, key=lambda w: w[0])
        self.costs.gpus_per_replica = self.model.gpus_per_replica
        self.costs.gpus_per_node = self.model.gpus_per_node

    @classmethod
    def started(cls, model: ClusterModel, *, replicas: int, now: float) -> "SimCluster":
        """`replicas` ready at `now`, packed k to a node."""
        cluster = cls(model=model, now=now)
        for i in range(replicas):
            if i % model.replicas_per_node == 0:
                cluster.nodes.append(_Node(now, now, settled_s=now))
            pod = _Pod(now, now, cluster.nodes[-1])
            cluster.nodes[-1].pods.append(pod)
            cluster.pods.append(pod)
        return cluster

    # -- time -------------------------------------------------------------------------------------------
    def _startup(self, requested: float | None = None, *, paired: tuple[float, float] | None = None) -> float:
        """A replica's start-up; `requested`: when it was ordered (now unless it waited for the node limit);
        `paired`: the (request time, start-up) recorded with the node wait its new node replays, taken first."""
        j = self.model.startup_jitter_ratio
        drawn = self.model.startup_s * self.rng.uniform(1 - j / 2, 1 + j)  # drawn always: the same stream
        if paired is not None:
            _take(self._startups_left, paired)
            return paired[1]
        replayed = _replayed(self._startups_left, self.now if requested is None else requested)
        return drawn if replayed is None else replayed[1]

    def _provisioning(self) -> tuple[float, tuple[float, float] | None]:
        """A new node's wait, and the start-up of the live replica whose wait it replays, where recorded."""
        j = self.model.node_jitter_ratio
        drawn = self.model.node_provisioning_s * self.rng.uniform(1 - j, 1 + j)
        replayed = _replayed(self._waits_left, self.now)
        if replayed is None:
            return drawn, None
        # the node arrives when the live one did: a provisioner launches by batch on its own clock, so a
        # request a little later than the live one is served by the same batch (at least at once)
        return max(0.0, replayed[0] + replayed[1] - self.now), (replayed[0], replayed[2]) if len(replayed) > 2 else None

    # -- observation ----------------------------------------------------------------------------------------
    @property
    def replicas(self) -> int:
        return len(self.pods)

    def ready(self, at: float | None = None) -> int:
        at = self.now if at is None else at
        return bisect.bisect_right(self.pods, at, key=_ready_key)  # the pods are sorted by ready_s

    def ready_times_between(self, start: float, end: float) -> list[float]:
        return [p.ready_s for p in self.pods if start < p.ready_s <= end]

    def state(self) -> ClusterState:
        ready = self.ready()
        warm_ready, idle = self._arrived_slots()
        # The pods Ready in (reported until, now], in list order: a slice of the list sorted by ready_s,
        # found by bisection rather than by a test of every pod (a 14-day replay runs up to 260 of them).
        since = bisect.bisect_right(self.pods, self._reported_until, key=_ready_key)
        seen = tuple(p.ready_s - p.created_s for p in self.pods[since:ready] if p.ready_s > p.created_s)
        self._reported_until = self.now
        return ClusterState(
            spec_replicas=len(self.pods),
            ready_replicas=ready,
            starting_replicas=len(self.pods) - ready,
            warm_slots_ready=warm_ready,
            idle_slots=idle,
            unschedulable_pods=len(self.unplaced),
            no_capacity_pods=len(self.unplaced),
            no_capacity_reason="the node pool's limit is reached" if self.unplaced else "",
            oldest_unschedulable_s=self.now - self.unplaced[0] if self.unplaced else 0.0,
            startup_durations_s=seen,
            at_s=self.now,
        )

    def scale_to(self, replicas: int) -> None:
        replicas = max(0, replicas)
        if replicas != len(self.pods):
            self.scaling_actions += 1
        while len(self.pods) < replicas:
            self._add_pod()
        while len(self.pods) > replicas:
            self._remove_pod()

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _settle(self, node: _Node, at: float) -> None:
        """Bill the node's free slots up to `at`: idle if it is empty, spare if not."""
        free = self.model.replicas_per_node - node.used
        if free and at > node.settled_s:
            if node.used:
                self.costs.spare_s += free * (at - node.settled_s)
            else:
                self.costs.idle_s += free * (at - node.settled_s)
        node.settled_s = max(node.settled_s, at)

    def _occupy(self, node: _Node) -> None:
        self._settle(node, self.now)
        node.empty_since = None

    def _vacated(self, node: _Node) -> None:
        """A slot of `node` was just freed (already settled)."""
        if node.used == 0:
            node.empty_since = self.now

    def _new_node(self) -> _Node:
        """A node requested now, with the live start-up recorded with the wait it replays (`_provisioning`)."""
        took, paired = self._provisioning()
        node = _Node(self.now, self.now + took, settled_s=self.now, startup=paired)
        self.nodes.append(node)
        return node

    def _arrival_startup(self, node: _Node, requested: float | None) -> float:
        """The start-up of a replica placed on `node` before its arrival: the first one starts up as the live
        replica that waited for the node it replays did (one live pod's pair: a start-up matched apart would
        pair a node with another pod's start-up), the rest as `_startup` matches them."""
        paired, node.startup = node.startup, None
        return self._startup(requested, paired=paired)

    def _drop(self, node: _Node, at: float) -> None:
        self._settle(node, at)
        self.costs.node_s += at - node.created_s
        self.nodes.remove(node)

    def _arrived(self, node: _Node) -> bool:
        return node.ready_s <= self.now

    @property
    def warm_slots(self) -> int:
        return self._placeholders

    @property
    def placed(self) -> int:
        """Replicas with a node, arrived or being provisioned: those that hold GPUs (not the unplaced)."""
        return len(self.pods) - len(self.unplaced)

    def _arrived_slots(self) -> tuple[int, int]:
        """(warm slots, free slots) on the nodes that have arrived: all of them, less those on nodes still being
        provisioned, which are among the last requested (every tick observes this; a fleet has hundreds of nodes)."""
        k, now = self.model.replicas_per_node, self.now
        warm, free = self._placeholders, k * len(self.nodes) - self.placed - self._placeholders
        surely_arrived_s = now - self.model.slowest_provisioning_s - 1.0
        for n in reversed(self.nodes):  # in order of request, the latest first
            if n.created_s < surely_arrived_s:
                break
            if n.ready_s > now:
                warm -= len(n.placeholders)
                free -= k - len(n.pods) - len(n.placeholders)
        return warm, free

    # -- placement ------------------------------------------------------------------------------------------
    def _room(self, *, arrived: bool) -> _Node | None:
        """A node with a free slot: of the ready ones the fullest (of empty ones the last emptied, so the
        others expire first), of those being provisioned the earliest."""
        k, now = self.model.replicas_per_node, self.now
        nodes = [n for n in self.nodes if (n.ready_s <= now) == arrived and len(n.pods) + len(n.placeholders) < k]
        if not nodes:
            return None
        if arrived:
            return max(nodes, key=lambda n: (n.used, -math.inf if n.empty_since is None else n.empty_since))
        return min(nodes, key=lambda n: n.ready_s)

    def _place(self, requested: float | None = None) -> tuple[_Node, float] | None:
        """Where a new replica goes and when it is Ready; None when only a node beyond the limit would do.
        `requested`: when it was ordered, if before now (it waited for the node limit)."""
        now = self.now
        warm = [n for n in self.nodes if n.placeholders and self._arrived(n)] if self._placeholders else []
        if warm:
            node = max(warm, key=lambda n: n.placeholders[-1])  # the newest placeholder
            self._occupy(node)
            self.costs.warm_pool_s += now - node.placeholders.pop()
            self._placeholders -= 1
            self.warm_churn.preempted += 1
            return node, now + self._startup(requested)
        node = self._room(arrived=True)
        if node is not None:
            self._occupy(node)
            return node, now + self._startup(requested)
        node = self._room(arrived=False)
        if node is not None:
            self._occupy(node)
            return node, node.ready_s + self._arrival_startup(node, requested)
        waiting = [n for n in self.nodes if n.placeholders] if self._placeholders else []
        if waiting:
            node = min(waiting, key=lambda n: n.ready_s)
            self._occupy(node)
            self.costs.warm_pool_s += now - node.placeholders.pop(0)
            self._placeholders -= 1
            self.warm_churn.preempted += 1
            return node, node.ready_s + self._arrival_startup(node, requested)
        if len(self.nodes) >= self.model.nodes_allowed(now):
            return None
        node = self._new_node()
        return node, node.ready_s + self._arrival_startup(node, requested)

    def _land(self, node: _Node, ready: float) -> _Pod:
        pod = _Pod(self.now, ready, node)
        node.pods.append(pod)
        bisect.insort(self.pods, pod, key=_ready_key)
        return pod

    def _add_pod(self) -> None:
        placed = self._place()
        if placed is None:
            self.unplaced.append(self.now)
            bisect.insort(self.pods, _Pod(self.now, math.inf), key=_ready_key)
            return
        pod = self._land(*placed)
        self.capacity_lags_s.append(pod.ready_s - pod.created_s)

    def _victim(self) -> _Pod:
        """Unplaced, then not ready (least ready first), then a ready one on the least-used node."""
        last = self.pods[-1]
        if last.ready_s > self.now or self.model.replicas_per_node == 1:
            return last  # one replica per node: every node in use holds one
        best = last
        for pod in reversed(self.pods):
            if pod.node.used < best.node.used:
                best = pod
        return best

    def _remove_pod(self) -> None:
        pod = self._victim()
        _remove_this(self.pods, pod)
        if pod.node is None:
            self.unplaced.remove(pod.created_s)
            return  # never had a node: nothing to bill, nothing freed
        self.costs.warming_s += min(self.now, pod.ready_s) - pod.created_s
        self.costs.serving_s += max(0.0, self.now - pod.ready_s)
        node = pod.node
        self._settle(node, self.now)
        _remove_this(node.pods, pod)
        waiting = [n for n in self.nodes if n.placeholders and not self._arrived(n)] \
            if self._placeholders and self._arrived(node) else []
        if waiting:
            source = max(waiting, key=lambda n: n.ready_s)
            self._settle(source, self.now)
            bisect.insort(node.placeholders, source.placeholders.pop())  # keeps its creation time: billed throughout
            self._vacated(source)
        self._vacated(node)

    # -- time and the warm pool ----------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Remove nodes empty for the idle timeout, then place unplaced replicas if there is room."""
        timeout = self.model.node_idle_timeout_s
        for node in [n for n in self.nodes if n.empty_since is not None and n.empty_since + timeout <= now]:
            self._drop(node, node.empty_since + timeout)
        self.now = now
        while self.unplaced:
            created = self.unplaced[0]
            placed = self._place(created)
            if placed is None:
                break
            self.unplaced.pop(0)
            self.pods.remove(next(p for p in self.pods if p.created_s == created and p.node is None))
            pod = self._land(*placed)  # billed from now on
            self.capacity_lags_s.append(pod.ready_s - created)

    def warm_to(self, slots: int) -> None:
        while self.warm_slots < slots:
            node = self._room(arrived=True) or self._room(arrived=False)
            if node is None:
                if len(self.nodes) >= self.model.nodes_allowed(self.now):
                    break  # a placeholder beyond the limit would stay Pending: it holds nothing
                node = self._new_node()
                self.warm_churn.new_nodes += 1
            self._occupy(node)
            node.placeholders.append(self.now)
            self._placeholders += 1
            self.warm_churn.created += 1
        while self.warm_slots > slots:
            # waiting placeholders first, then from the least-used node
            node = min((n for n in self.nodes if n.placeholders),
                       key=lambda n: (self._arrived(n), n.used, -n.placeholders[-1]))
            self._settle(node, self.now)
            self.costs.warm_pool_s += self.now - node.placeholders.pop()
            self._placeholders -= 1
            self.warm_churn.deleted += 1
            self._vacated(node)

    # -- one node pool over several clusters -----------------------------------------------------------------
    def ready_room(self) -> int:
        """Slots a new replica can start on now without waiting for a node: ready placeholders and free slots of
        arrived nodes, which `scale_to` fills before it waits for one."""
        return sum(self._arrived_slots())

    def borrow(self, lender: "SimCluster", *, warm: bool) -> int:
        """Move one arrived node that holds no replica from `lender` (a cluster of the same shape) to this one, as
        the scheduler would place a pending pod of this cluster's model on another model's node: an empty node,
        the last emptied (`warm` False), or one holding only ready placeholders, the newest (`warm` True).
        Returns the replica slots it brings, 0 if the lender has no such node.

        The node moves with its times (its request, its free slots billed up to `settled_s`, its placeholders'
        creation), so this cluster bills what it cost before and after the move: the lender's idle or warm
        time goes to the borrower, and the sum over the clusters is exact. The list of nodes stays in order of
        request, which `_arrived_slots` relies on."""
        if lender.model.shape != self.model.shape:
            raise ValueError(f"borrow: the lender's nodes {lender.model.shape} are not of this cluster's shape "
                             f"{self.model.shape} (GPUs per replica, per node)")
        now = self.now
        if warm:
            nodes = [n for n in lender.nodes if n.placeholders and not n.pods and n.ready_s <= now]
            node = max(nodes, key=lambda n: n.placeholders[-1], default=None)
        else:
            nodes = [n for n in lender.nodes if not n.used and n.ready_s <= now]
            node = max(nodes, key=lambda n: n.empty_since, default=None)
        if node is None:
            return 0
        lender.nodes.remove(node)
        lender._placeholders -= len(node.placeholders)
        bisect.insort(self.nodes, node, key=_created_key)
        self._placeholders += len(node.placeholders)
        return self.model.replicas_per_node

    def finish(self) -> Costs:
        """Stop the clock: replicas and placeholders billed up to now, every node to now or its expiry."""
        while self.pods:
            self._remove_pod()
        churn = replace(self.warm_churn)
        self.warm_to(0)
        self.warm_churn = churn  # the pool emptied at the end of the run is no churn
        timeout = self.model.node_idle_timeout_s
        for node in list(self.nodes):
            self._drop(node, min(node.empty_since + timeout, self.now))
        return self.costs
