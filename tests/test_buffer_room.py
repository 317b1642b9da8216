"""A CapacityBuffer's ready slots against the nodes' free room, in the readers (autoscaler/kube/cluster.py
`warm_and_idle`): at most the room left on Ready nodes, never also idle slots; bounded on the fleet's watch
cache even when `capacity.read_nodes` counts no idle slot. The cluster's items come from a fake `ClusterReads`
(the readers' seam); the same on a real kube-apiserver: tests/test_capacity_kube.py."""

import asyncio

import pytest
from kubernetes_asyncio.client import (V1Container, V1Deployment, V1DeploymentSpec, V1DeploymentStatus,
                                       V1LabelSelector, V1Node, V1NodeCondition, V1NodeSpec, V1NodeStatus,
                                       V1ObjectMeta, V1Pod, V1PodSpec, V1PodStatus, V1PodTemplateSpec,
                                       V1ResourceRequirements)

from autoscaler.config import Settings
from autoscaler.errors import TransientError
from autoscaler.kube.capacity import NodeReader
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.pooledwarm import PooledView, SharedSlots
from autoscaler.kube.readers import build_cluster_reader

GPU = "nvidia.com/gpu"
LABELS = {"app": "m"}


def pod_spec(node: str | None = None) -> V1PodSpec:
    return V1PodSpec(node_name=node, containers=[V1Container(name="c", resources=V1ResourceRequirements(
        requests={GPU: "1"}))])


class Reads:
    """The cluster: one Ready node of `gpus` GPUs, the model's `replicas` 1-GPU pods on it."""

    def __init__(self, *, gpus: int, replicas: int, nodes_fail: bool = False):
        self.gpus, self.nodes_fail = gpus, nodes_fail
        self.template = V1PodTemplateSpec(metadata=V1ObjectMeta(labels=LABELS), spec=pod_spec())
        self.running = [V1Pod(metadata=V1ObjectMeta(name=f"m-{i}", namespace="llm", uid=f"u{i}", labels=LABELS),
                              spec=pod_spec("n1"), status=V1PodStatus(phase="Running")) for i in range(replicas)]

    async def workload(self, namespace, kind, name):
        return V1Deployment(spec=V1DeploymentSpec(replicas=len(self.running), template=self.template,
                                                  selector=V1LabelSelector(match_labels=LABELS)),
                            status=V1DeploymentStatus(ready_replicas=len(self.running)))

    async def pods(self, namespace, match_labels):
        return list(self.running)

    async def live_pods(self, namespace):
        return list(self.running)

    async def pod_events(self, namespace):
        return []

    async def nodes(self):
        if self.nodes_fail:
            raise TransientError("list nodes: HTTP 503", kind="apiserver_unavailable")
        ready = V1NodeCondition(type="Ready", status="True")
        return [V1Node(metadata=V1ObjectMeta(name="n1", labels={}), spec=V1NodeSpec(),
                       status=V1NodeStatus(allocatable={GPU: str(self.gpus)}, conditions=[ready]))]


def pooled_view(reads: Reads, ready_slots: int) -> SharedSlots:
    """The model's view of the fleet's pooled CapacityBuffer, as the watch cache builds it (cache.py)."""
    async def ready():
        return {1: ready_slots}

    async def template():
        return reads.template

    return SharedSlots(PooledView("fleet-warm", ready, room_kept=True), template)


def read(reads: Reads, *, buffer_says: int, read_nodes: bool, nodes_in_memory: bool = True):
    settings = Settings(target={"namespace": "llm", "name": "m"}, prometheus={"url": "http://127.0.0.1:9"},
                        capacity={"read_nodes": read_nodes})
    reader = build_cluster_reader(settings, None, pooled_view(reads, buffer_says), reads=reads,
                                  nodes_in_memory=nodes_in_memory)
    return asyncio.run(asyncio.wait_for(reader.read(100.0), 5.0))


@pytest.mark.parametrize("read_nodes", [False, True])
def test_a_buffer_whose_room_replicas_took_has_no_ready_slot(read_nodes):
    """The buffer's status still says 2 (Karpenter sees the take at its next look, up to ~30 s later), but the
    model's 2 replicas fill the 2-GPU node: 0 warm slots at once, with or without idle slots counted."""
    state = read(Reads(gpus=2, replicas=2), buffer_says=2, read_nodes=read_nodes)
    assert (state.warm_slots_ready, state.idle_slots) == (0, 0)


def test_a_buffers_room_is_warm_slots_and_the_rest_idle_slots():
    """An empty 3-GPU node and a buffer of 2 ready 1-GPU slots: 2 warm, 1 idle (not 3); with idle slots not
    counted (`read_nodes` off), 2 warm and none idle; a buffer ahead of the nodes (3 said, room for 1 left
    beside 2 replicas) gives 1."""
    assert (lambda s: (s.warm_slots_ready, s.idle_slots))(
        read(Reads(gpus=3, replicas=0), buffer_says=2, read_nodes=True)) == (2, 1)
    assert (lambda s: (s.warm_slots_ready, s.idle_slots, s.gpus_held))(
        read(Reads(gpus=3, replicas=0), buffer_says=2, read_nodes=False)) == (2, 0, 0.0)
    assert read(Reads(gpus=3, replicas=2), buffer_says=3, read_nodes=False).warm_slots_ready == 1


def test_where_the_room_is_not_known_the_buffers_status_is_taken():
    """Not on the watch cache with `read_nodes` off (the single-model controller without the node-reading
    ClusterRole), or the nodes' read failed: the buffer's status as it is (the gap docs/fleet.md describes)."""
    assert read(Reads(gpus=2, replicas=2), buffer_says=2, read_nodes=False,
                nodes_in_memory=False).warm_slots_ready == 2
    failed = read(Reads(gpus=2, replicas=2, nodes_fail=True), buffer_says=2, read_nodes=True)
    assert (failed.warm_slots_ready, failed.idle_slots) == (2, 0)


def test_placeholders_keep_their_room_with_pods_so_their_slots_are_not_bounded():
    """A placeholder pool's ready slots are pods on the nodes, not free room: neither bounded nor subtracted."""
    reads = Reads(gpus=2, replicas=2)
    view = pooled_view(reads, 2)
    view.room_kept = False
    reader = ClusterReader(None, namespace="llm", kind="Deployment", name="m", warm_pool=view, reads=reads,
                           nodes=NodeReader(None, reads=reads))
    state = asyncio.run(reader.read(100.0))
    assert (state.warm_slots_ready, state.idle_slots) == (2, 0)
