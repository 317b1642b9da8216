"""What waiting for a new node cost the target's pods, per node type, for the policy's lead time.

A pod placed on a node that was created after the pod waited for that node: from the pod's creation to its
placement (PodScheduled=True) is the node provisioning a replica pays (the provisioner's batching, the
machine's boot, registration, the GPU driver and device plugin advertising the GPUs). A pod placed on a node
that already existed (an idle slot, a preempted warm placeholder) is no such sample, nor is a pod the caller
names in `skip` (one a provisioner said it could not place: it waited for a limit, not a boot). Each pod counts once;
at the first read every placed pod does, so a restarted controller gets back what it had learned. The node
type is the node's instance-type label (or its GPU product). Reading a node needs `get` on nodes (the base
ClusterRole grants it); without it, no waits are learned and the policy keeps `node_provisioning_s`. At
most `NODE_READS_PER_TICK` nodes are read per tick (each node once), so a large fleet's first read does not
hold up the tick; the other pods are looked at in the next ones.
"""

from __future__ import annotations

from typing import Collection, Iterable

import structlog

from autoscaler.errors import EdgeError, PermanentError
from autoscaler.kube.capacity import node_type
from autoscaler.kube.client import Kube, object_time
from autoscaler.kube.pods import PodFacts
from autoscaler.kube.reads import ApiReads, ClusterReads

log = structlog.get_logger("autoscaler")

NODE_READS_PER_TICK = 8


class NodeWaits:
    def __init__(self, kube: Kube, *, reads: ClusterReads | None = None) -> None:
        self.kube = kube
        self.reads = reads or ApiReads(kube)
        self._counted: set[str] = set()  # pods already looked at (by uid)
        self._nodes: dict[str, tuple[float | None, str]] = {}  # node name -> (created, type)
        self._warned = False
        self._forbidden = False
        self._reads = 0

    async def _node(self, name: str) -> tuple[float | None, str] | None:
        if name not in self._nodes:
            if self._forbidden or self._reads >= NODE_READS_PER_TICK:
                return None
            self._reads += 1
            try:
                node = await self.reads.node(name)
            except EdgeError as exc:
                self._forbidden = isinstance(exc, PermanentError) and exc.kind == "forbidden"
                if not self._warned:
                    log.warning("node provisioning not learned (reading a node failed)", node=name, error=str(exc))
                    self._warned = True
                return None
            self._nodes[name] = (object_time(node.metadata.creation_timestamp), node_type(node))
        return self._nodes[name]

    async def learn(self, pods: Iterable[PodFacts],
                    skip: Collection[str] = frozenset()) -> tuple[tuple[str, float], ...]:
        """(node type, seconds waited) of the pods placed since the previous call on a node newer than them,
        leaving out the pods whose uids are in `skip`."""
        waits, live, on = [], set(), set()
        self._reads = 0
        for pod in pods:
            uid = pod.uid
            live.add(uid)
            placed = pod.placed_s
            if placed is None or pod.node is None:
                continue
            on.add(pod.node)
            if uid in self._counted:
                continue
            if uid in skip:
                self._counted.add(uid)
                continue
            node = await self._node(pod.node)
            if node is None:
                continue  # unknown for now: asked again next tick
            self._counted.add(uid)
            created, kind = node
            began = pod.created_s
            if created is not None and began is not None and created > began and placed > began:
                waits.append((kind, placed - began))
        self._counted &= live
        self._nodes = {name: known for name, known in self._nodes.items() if name in on}
        return tuple(waits)
