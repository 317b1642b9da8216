"""Warm capacity on a real node provisioner (Karpenter's kwok provider), in both backends: placeholders that
the scheduler preempts for real replicas and that get new nodes, and a CapacityBuffer that Karpenter keeps
room for. Either way a replica ordered onto warm capacity is placed without waiting for a new node. The
fleet's pooled placeholders (one set per replica shape) go to whichever model scales first, and the node
the refill needs comes from Karpenter; the fleet's pooled CapacityBuffer (one per shape) has Karpenter keep
room for it with no pod of ours."""

import asyncio
import time

import pytest

from autoscaler.kube.capacity import NodeReader
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.pooledwarm import PooledCapacityBuffer, PooledWarmPool
from autoscaler.kube.warmpool import CapacityBufferPool, PlaceholderPool
from loadtest.kube.controlplane import control_plane
from loadtest.kube.karpenter import ONE_GPU, POOL, POOL_LABEL, karpenter, node_pool

from helpers import with_kube

NODE_START_S = 4.0


@pytest.fixture(scope="module")
def provisioned():
    with control_plane(with_pods=True) as cp, karpenter(cp, gpu_limit=12, node_start_s=NODE_START_S,
                                                      consolidate_after_s=600) as karp:
        cp.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                  "metadata": {"name": "placeholder"}, "value": -5, "preemptionPolicy": "Never"})
        yield cp, karp


def model(ns: str, replicas: int) -> dict:
    labels = {"app": "model"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "model", "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels, "annotations": {"pod-ready.stage.kwok.x-k8s.io/delay": "1s"}},
                "spec": {"nodeSelector": {POOL_LABEL: POOL}, "containers": [{
                    "name": "vllm", "image": "vllm",
                    "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"},
                                  "limits": {"nvidia.com/gpu": "1"}}}]}}}}



async def until(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.25)
    raise TimeoutError("condition not reached")


def scheduled_without_new_nodes(cp, karp, ns, before_nodes, replicas=3):
    """Scale the model to `replicas`; its new pods must be placed on nodes that already exist."""
    cp.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model", {"spec": {"replicas": replicas}})
    started = time.monotonic()
    while time.monotonic() - started < 30:
        pods = cp.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dmodel")[1]["items"]
        placed = [p for p in pods if p["spec"].get("nodeName")]
        if len(placed) == replicas:
            return time.monotonic() - started, {p["spec"]["nodeName"] for p in placed} <= before_nodes
        time.sleep(0.2)
    raise TimeoutError("the model's new replicas were not placed")


def ready_nodes(karp, *, at_least: int, timeout_s: float = 30.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        ready = {n["metadata"]["name"] for n in karp.nodes()
                 if any(c["type"] == "Ready" and c["status"] == "True"
                        for c in n.get("status", {}).get("conditions", []))}
        if len(ready) >= at_least or time.monotonic() > deadline:
            return ready
        time.sleep(0.25)


def test_capacity_buffer_keeps_room_for_replicas(provisioned):
    cp, karp = provisioned
    ns = "buffer"
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cp.apply(model(ns, 1))

    async def go(kube):
        pool = CapacityBufferPool(kube, namespace=ns, name="model-warm-pool", target_kind="Deployment",
                                  target="model", max_slots=4)
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", warm_pool=pool)
        await until(lambda: _ready(reader, 1))
        await pool.ensure(await reader.pod_template(), 2)
        await pool.ensure(await reader.pod_template(), 2)  # unchanged: no write
        state = await until(lambda: _warm(reader, 2))
        return state

    state = with_kube(cp, go)
    assert state.warm_slots_ready == 2  # Karpenter: "all 2 virtual pods fit on existing capacity"
    # (existing capacity includes NodeClaims still launching: wait for the nodes themselves)
    nodes = ready_nodes(karp, at_least=3)  # one for the replica, room for two more
    seconds, on_existing = scheduled_without_new_nodes(cp, karp, ns, nodes)
    assert on_existing, "replicas ordered onto the buffer needed new nodes"
    assert seconds < NODE_START_S + 5


def test_placeholders_are_preempted_and_get_new_nodes(provisioned):
    cp, karp = provisioned
    ns = "placeholders"
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cp.apply(model(ns, 1))

    async def go(kube):
        pool = PlaceholderPool(kube, namespace=ns, name="model-warm-pool", priority_class="placeholder",
                               pause_image="registry.k8s.io/pause:3.10", max_slots=4)
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", warm_pool=pool)
        await until(lambda: _ready(reader, 1))
        await pool.ensure(await reader.pod_template(), 2)
        return await until(lambda: _warm(reader, 2)), pool, reader

    state, _, _ = with_kube(cp, go)
    assert state.warm_slots_ready == 2
    nodes = ready_nodes(karp, at_least=1)
    seconds, on_existing = scheduled_without_new_nodes(cp, karp, ns, nodes)
    assert on_existing and seconds < NODE_START_S + 5  # the scheduler preempted placeholders for them
    events = cp.request("GET", f"/api/v1/namespaces/{ns}/events")[1]["items"]
    assert any(e["reason"] == "Preempted" and "warm-pool" in e["involvedObject"]["name"] for e in events)

    async def refilled(kube):
        pool = PlaceholderPool(kube, namespace=ns, name="model-warm-pool", priority_class="placeholder",
                               pause_image="registry.k8s.io/pause:3.10", max_slots=4)
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", warm_pool=pool)
        return await until(lambda: _warm(reader, 2), timeout_s=60)

    assert with_kube(cp, refilled).warm_slots_ready == 2  # the preempted placeholders got new nodes


def test_pooled_placeholders_go_to_whichever_model_scales_first_and_karpenter_refills_them(provisioned):
    """Two models of the same 1-GPU shape in two namespaces, one pooled slot in a third, on a NodePool of
    their own (no other test's empty node to land on). Model B scales first and takes the slot (no new
    node); the pool is refilled on a node Karpenter brings; then model A scales and takes the refilled slot,
    also without waiting for a node."""
    cp, karp = provisioned
    own_node_pool(cp, "fleet", gpu_limit=8, namespaces=("pooled-a", "pooled-b", "fleet-warm"),
                  models={"pooled-a": 1, "pooled-b": 1})

    def fleet_nodes(at_least):
        return pool_nodes(cp, "fleet", at_least=at_least)

    async def warm(kube):
        pooled = PooledWarmPool(kube, namespace="fleet-warm", priority_class="placeholder",
                                pause_image="registry.k8s.io/pause:3.10", max_slots=4, ready_ttl_s=0)
        readers = [ClusterReader(kube, namespace=ns, kind="Deployment", name="model")
                   for ns in ("pooled-a", "pooled-b")]
        for reader in readers:
            await until(lambda reader=reader: _ready(reader, 1))
        await pooled.ensure({1: 1}, {f"{r.namespace}/model": await r.pod_template() for r in readers})
        await until(lambda: _pooled(pooled, 1))
        return await pooled.share(namespace="pooled-a", kind="Deployment", name="model").ready()

    assert with_kube(cp, warm) == 1
    nodes = fleet_nodes(3)
    assert len(nodes) == 3  # two replicas and the pooled slot
    seconds, on_existing = scheduled_without_new_nodes(cp, karp, "pooled-b", nodes, replicas=2)
    assert on_existing and seconds < NODE_START_S + 5  # model B took the pooled slot
    assert with_kube(cp, warm) == 1  # refilled
    refilled = fleet_nodes(4)
    assert len(refilled) == 4 and nodes < refilled  # on the node Karpenter brought for the refill
    seconds, on_existing = scheduled_without_new_nodes(cp, karp, "pooled-a", refilled, replicas=2)
    assert on_existing and seconds < NODE_START_S + 5  # model A took the refilled slot
    events = cp.request("GET", "/api/v1/namespaces/fleet-warm/events")[1]["items"]
    assert sum(e["reason"] == "Preempted" for e in events) == 2


def test_a_pooled_capacity_buffer_makes_karpenter_keep_room_a_models_replica_then_takes(provisioned):
    """The fleet's pooled 1-GPU CapacityBuffer of 2 slots (a PodTemplate of ours, `podTemplateRef`), a NodePool
    of its own, a model at 0 replicas: with no pod of ours anywhere, Karpenter brings room for 2 replicas of the
    shape, `ready()` (and the model's view of the pool) reports both slots, and the model's 2 replicas land on
    that room without a new node."""
    cp, karp = provisioned
    own_node_pool(cp, "pooled-buffer", gpu_limit=4, namespaces=("buffered", "fleet-buffer"), models={"buffered": 0})

    async def warm(kube):
        pooled = PooledCapacityBuffer(kube, namespace="fleet-buffer", priority_class="placeholder",
                                      pause_image="registry.k8s.io/pause:3.10", max_slots=4, ready_ttl_s=0)
        template = (await kube.apps.read_namespaced_deployment("model", "buffered")).spec.template
        await pooled.ensure({1: 2}, {"buffered/model": template})
        await until(lambda: _pooled(pooled, 2))
        return await pooled.ready(), await pooled.share(namespace="buffered", kind="Deployment", name="model").ready()

    assert with_kube(cp, warm) == ({1: 2}, 2)
    nodes = pool_nodes(cp, "pooled-buffer", at_least=2)  # Karpenter counts launching nodes as room: wait for them
    assert len(nodes) == 2, nodes
    assert not [p for ns in ("buffered", "fleet-buffer")
                for p in cp.request("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"]]  # no pod of ours
    seconds, on_existing = scheduled_without_new_nodes(cp, karp, "buffered", nodes, replicas=2)
    assert on_existing and seconds < NODE_START_S + 5
    # The room for the buffer comes again behind them, but only at Karpenter's next look at the buffer (its
    # controller's 30-s resync: the replicas, placed at once, never were pending), so it is not waited for here.
    # Until then its status still says 2; the model's reader, which reads the nodes, counts no slot.

    async def counted(kube):
        pooled = PooledCapacityBuffer(kube, namespace="fleet-buffer", priority_class="placeholder",
                                      pause_image="registry.k8s.io/pause:3.10", max_slots=4, ready_ttl_s=0)
        reader = ClusterReader(kube, namespace="buffered", kind="Deployment", name="model", nodes=NodeReader(kube),
                               warm_pool=pooled.share(namespace="buffered", kind="Deployment", name="model"))
        return await pooled.ready(), (await reader.read(time.time())).warm_slots_ready

    said, counted_slots = with_kube(cp, counted)
    assert counted_slots == 0, said


def own_node_pool(cp, name: str, *, gpu_limit: int, namespaces, models) -> None:
    """A 1-GPU NodePool `name` labelling its nodes `POOL_LABEL: name` (no other test's empty node to land on),
    the namespaces, and a model Deployment per namespace of `models` (replicas) selecting that pool."""
    pool = node_pool(ONE_GPU, gpu_limit=gpu_limit, consolidate_after_s=600)
    pool["metadata"]["name"] = name
    pool["spec"]["template"]["metadata"]["labels"][POOL_LABEL] = name
    cp.apply(pool)
    for ns in namespaces:
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for ns, replicas in models.items():
        body = model(ns, replicas)
        body["spec"]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: name}
        cp.apply(body)


def pool_nodes(cp, pool: str, *, at_least: int, timeout_s: float = 30.0) -> set[str]:
    """The Ready nodes of the NodePool labelled `pool`, once there are `at_least` (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = cp.request("GET", f"/api/v1/nodes?labelSelector={POOL_LABEL}%3D{pool}")[1]["items"]
        ready = {n["metadata"]["name"] for n in nodes if any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))}
        if len(ready) >= at_least or time.monotonic() > deadline:
            return ready
        time.sleep(0.25)


async def _pooled(pooled, n):
    return (await pooled.ready()).get(1, 0) >= n


async def _ready(reader, n):
    state = await reader.read(time.time())
    return state if state.ready_replicas >= n else None


async def _warm(reader, n):
    state = await reader.read(time.time())
    return state if state.warm_slots_ready >= n else None
