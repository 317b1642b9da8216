"""Pooled warm capacity on a real kube-apiserver, scheduler and kwok nodes: one placeholder set per replica
shape for the whole fleet, taken by whichever model's replica of that shape comes first (the scheduler
preempts the placeholder) and refilled behind it. With Karpenter: tests/test_warm_capacity.py."""

import asyncio
import time

import pytest

from autoscaler.config import Settings
from autoscaler.errors import PermanentError
from autoscaler.kube.cache import KubeCache
from autoscaler.kube.pooledwarm import SHAPE_LABEL, PooledWarmPool, pool_name
from autoscaler.kube.warmpool import WARM_POOL_LABEL
from loadtest.kube.controlplane import gpu_node, model_deployment
from loadtest.kubecount import RequestCounter

from helpers import with_kube

PAUSE = "registry.k8s.io/pause:3.10"


@pytest.fixture
def fleet(cluster, namespace):
    """Two model namespaces beside `namespace` (which holds the pooled placeholders), a placeholder
    PriorityClass, and one 8-GPU kwok node only this test's pods select (label `pool` = `namespace`), all
    removed afterwards. The node has no `type=kwok` label: the other tests' pods select that, and those still
    waiting for a GPU (of a namespace being deleted, say) would take the node's GPUs before this test's."""
    node = gpu_node(f"{namespace}-n0")
    del node["metadata"]["labels"]["type"]
    node["metadata"]["labels"].update({"pool": namespace, "kubernetes.io/hostname": node["metadata"]["name"]})
    assert cluster.request("POST", "/api/v1/nodes", node)[0] == 201
    models = [f"{namespace}-a", f"{namespace}-b"]
    for ns in models:
        assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
    priority = f"placeholder-{namespace}"
    assert cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                           {"metadata": {"name": priority}, "value": -5})[0] == 201
    yield models, priority, node["metadata"]["name"]
    cluster.request("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")
    for ns in models:
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
    cluster.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{priority}")


def model(cluster, ns, *, replicas, pool, gpus="4", cpu="4", memory="32Gi", selector=None):
    body = model_deployment(ns, "model", replicas)
    spec = body["spec"]["template"]["spec"]
    spec["nodeSelector"] = selector or {"pool": pool}
    spec["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": gpus, "cpu": cpu, "memory": memory},
                                          "limits": {"nvidia.com/gpu": gpus}}
    status, created = cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert status == 201, created


def pods(cluster, ns, selector):
    return cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")[1]["items"]


async def until(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.25)


async def templates(kube, namespaces):
    return {f"{ns}/model": (await kube.apps.read_namespaced_deployment("model", ns)).spec.template
            for ns in namespaces}


def test_a_pooled_slot_goes_to_whichever_model_scales_first_and_is_refilled(cluster, namespace, fleet):
    """One 8-GPU node: model A holds 4 GPUs, the pooled 4-GPU placeholder the other 4. Model B (another
    namespace, the same shape) scales first: its replica preempts the placeholder and lands on the node at
    once, and a new placeholder is created behind it (pending: no node has room; a provisioner would bring
    one). The placeholder requests the larger of the two models' CPU and memory."""
    (ns_a, ns_b), priority, node = fleet
    model(cluster, ns_a, replicas=1, pool=namespace, cpu="4", memory="32Gi")
    model(cluster, ns_b, replicas=0, pool=namespace, cpu="8", memory="16Gi")
    placeholders = f"{WARM_POOL_LABEL}%3D{pool_name('fleet-warm', 4, 'nvidia.com/gpu')}"

    async def warm(kube):
        pooled = PooledWarmPool(kube, namespace=namespace, priority_class=priority, pause_image=PAUSE, max_slots=8)

        async def a_ready():
            found = pods(cluster, ns_a, "app%3Dmodel")
            return found and all(p["status"].get("phase") == "Running" for p in found)
        assert await until(a_ready), "model A's replica did not start"
        await pooled.ensure({4: 1}, await templates(kube, [ns_a, ns_b]))
        return await until(lambda: _ready(pooled, {4: 1}))

    assert with_kube(cluster, warm) == {4: 1}
    [placeholder] = pods(cluster, namespace, placeholders)
    assert placeholder["spec"]["nodeName"] == node
    assert placeholder["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}
    assert placeholder["spec"]["priorityClassName"] == priority

    started = time.monotonic()
    assert cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns_b}/deployments/model",
                           {"spec": {"replicas": 1}})[0] == 200
    while not [p for p in pods(cluster, ns_b, "app%3Dmodel") if p["spec"].get("nodeName")]:
        assert time.monotonic() - started < 20, "model B's replica was not placed on the pooled slot"
        time.sleep(0.2)
    [replica] = pods(cluster, ns_b, "app%3Dmodel")
    assert replica["spec"]["nodeName"] == node
    events = cluster.request("GET", f"/api/v1/namespaces/{namespace}/events")[1]["items"]
    assert any(e["reason"] == "Preempted" and e["involvedObject"]["name"] == placeholder["metadata"]["name"]
               for e in events)

    deadline = time.monotonic() + 20
    while not (refill := [p for p in pods(cluster, namespace, placeholders)
                          if p["metadata"]["name"] != placeholder["metadata"]["name"]]):
        assert time.monotonic() < deadline, "the pool was not refilled"
        time.sleep(0.2)
    assert not refill[0]["spec"].get("nodeName")  # the node is full: it waits for a new node


def test_a_shape_whose_models_cannot_share_a_placeholder_is_held_and_a_shape_gone_goes_to_zero(
        cluster, namespace, fleet):
    """Two 4-GPU models on different node pools cannot share a placeholder: that shape is refused with an
    error naming both, the 1-GPU shape is still applied; when no model of that shape is left, its pool is
    scaled to 0 (not deleted)."""
    (ns_a, ns_b), priority, _ = fleet
    model(cluster, ns_a, replicas=0, pool="x", selector={"pool": "east"})
    model(cluster, ns_b, replicas=0, pool="x", selector={"pool": "west"})
    small = f"{namespace}-c"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": small}})[0] == 201
    model(cluster, small, replicas=0, pool="x", gpus="1")

    async def go(kube):
        pooled = PooledWarmPool(kube, namespace=namespace, priority_class=priority, pause_image=PAUSE, max_slots=8)
        with pytest.raises(PermanentError) as refused:
            await pooled.ensure({4: 2, 1: 3}, await templates(kube, [ns_a, ns_b, small]))
        one = await kube.apps.read_namespaced_deployment("fleet-warm-1gpu", namespace)
        await pooled.ensure({}, {})
        gone = await kube.apps.read_namespaced_deployment("fleet-warm-1gpu", namespace)
        return str(refused.value), one, gone

    try:
        message, one, gone = with_kube(cluster, go)
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{small}")
    assert f"{ns_a}/model and {ns_b}/model differ in node selector" in message and "4-GPU" in message
    assert one.spec.replicas == 3 and one.metadata.labels[SHAPE_LABEL] == "1"
    assert gone.spec.replicas == 0
    listed = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")[1]["items"]
    assert [d["metadata"]["name"] for d in listed] == ["fleet-warm-1gpu"]  # no 4-GPU pool was made


def test_the_cache_gives_each_model_the_ready_pooled_slots_of_its_shape_without_reads(cluster, namespace, fleet):
    """In fleet mode with the watch cache, a model's warm slots are the fleet's ready pooled placeholders of its
    shape (so its lead time is the start-up, not the node wait), read from the cache: a tick makes no request."""
    (ns_a, ns_b), priority, _ = fleet
    model(cluster, ns_a, replicas=0, pool=namespace)
    model(cluster, ns_b, replicas=0, pool=namespace, gpus="1")

    async def go(kube):
        pooled = PooledWarmPool(kube, namespace=namespace, priority_class=priority, pause_image=PAUSE, max_slots=8)
        await pooled.ensure({4: 1}, await templates(kube, [ns_a]))
        assert await until(lambda: _ready(pooled, {4: 1})) == {4: 1}
        cache = KubeCache(kube)
        cache.use_pooled(pooled)
        await cache.start()
        try:
            assert await cache.wait_synced(30.0)
            four, one = (Settings(target={"namespace": ns, "name": "model"}, prometheus={"url": "http://127.0.0.1:9"})
                         for ns in (ns_a, ns_b))

            async def warm_slots():
                return (await cache.cluster_source((ns_a, "model"), four).read(time.time())).warm_slots_ready
            assert await until(warm_slots) == 1  # once the watch has seen the placeholder Ready
            counter = RequestCounter(kube)
            states = [await cache.cluster_source(key, s).read(time.time())
                      for key, s in (((ns_a, "model"), four), ((ns_b, "model"), one))]
            return [s.warm_slots_ready for s in states], counter.reads()
        finally:
            await cache.stop()

    slots, reads = with_kube(cluster, go)
    assert slots == [1, 0]  # the 4-GPU model sees the 4-GPU slot, the 1-GPU model none
    assert reads == 0


async def _ready(pooled, wanted):
    ready = await pooled.ready()
    return ready if ready == wanted else None


def test_the_cache_counts_only_our_placeholder_pools_and_skips_a_shape_label_that_does_not_parse():
    """`ready_by_shape` (the watch cache's pooled count): a Deployment of another's with our shape label is not
    counted, and one of ours whose label is not a number is skipped, not raised (that would fail every tick)."""
    from kubernetes_asyncio.client import V1Deployment, V1DeploymentStatus, V1ObjectMeta

    from autoscaler.kube.pooledwarm import ready_by_shape
    from autoscaler.kube.warmpool import MANAGED_BY

    def deployment(name, labels, ready):
        return V1Deployment(metadata=V1ObjectMeta(name=name, labels=labels),
                            status=V1DeploymentStatus(ready_replicas=ready))

    found = ready_by_shape([deployment("fleet-warm-1gpu", {SHAPE_LABEL: "1", **MANAGED_BY}, 2),
                            deployment("theirs", {SHAPE_LABEL: "1"}, 5),
                            deployment("garbled", {SHAPE_LABEL: "x", **MANAGED_BY}, 3)])
    assert found == {1: 2}
