"""Actuators, cluster state and leader election against a real kube-apiserver."""

import asyncio
import time

import pytest

from autoscaler.errors import ConfigError, PermanentError
from autoscaler.kube.client import Kube
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.events import EventRecorder
from autoscaler.kube.lease import LeaderElector
from autoscaler.kube.scale import ScaleActuator
from autoscaler.kube.warmpool import PlaceholderPool

from loadtest.kube.controlplane import model_deployment

from helpers import tell_no_capacity, with_kube

def deploy(cluster, ns, name="model", replicas=2, **kw):
    status, body = cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                                   model_deployment(ns, name, replicas, **kw))
    assert status == 201, body
    return body



def replicas_of(cluster, ns, name="model"):
    return cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")[1]["spec"]["replicas"]


def test_scale_subresource_within_bounds(cluster, namespace):
    ns = namespace
    deploy(cluster, ns)

    async def go(kube):
        actuator = ScaleActuator(kube, namespace=ns, kind="Deployment", name="model", min_replicas=1, max_replicas=6)
        assert await actuator.scale(5) == (2, 5)
        assert await actuator.scale(5) is None  # nothing to write
        assert await actuator.scale(50) == (5, 6)  # clamped to the bound
        assert await actuator.scale(0) == (6, 1)

    with_kube(cluster, go)
    assert replicas_of(cluster, ns) == 1


def test_scale_conflict_is_retried_on_fresh_state(cluster, namespace):
    ns = namespace
    deploy(cluster, ns, replicas=3)

    async def go(kube):
        actuator = ScaleActuator(kube, namespace=ns, kind="Deployment", name="model", min_replicas=1, max_replicas=20)
        real = actuator._replace
        raced = {"count": 0}

        async def racing_replace(name, namespace_, body):
            if raced["count"] == 0:  # someone else writes between our read and our write
                raced["count"] += 1
                status, _ = cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model",
                                            {"metadata": {"annotations": {"touched": "yes"}}})
                assert status == 200
            return await real(name, namespace_, body)

        actuator._replace = racing_replace
        result = await actuator.scale(8)
        return raced["count"], result

    raced, result = with_kube(cluster, go)
    assert raced == 1 and result == (3, 8)
    assert replicas_of(cluster, ns) == 8


def test_cluster_state_learns_startup_durations(cluster, namespace):
    ns = namespace
    deploy(cluster, ns, replicas=1, ready_delay="3s")

    async def go(kube):
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model")
        learned = []
        for _ in range(40):
            state = await reader.read(time.time())
            learned += state.startup_durations_s
            if state.ready_replicas == 1:
                break
            await asyncio.sleep(0.5)
        # a controller started later (a restart) gets back the start-up of the pod already Ready
        late = ClusterReader(kube, namespace=ns, kind="Deployment", name="model")
        [given_back] = (await late.read(time.time())).startup_durations_s
        assert 2.0 <= given_back <= 15.0
        await ScaleActuator(kube, namespace=ns, kind="Deployment", name="model", min_replicas=1,
                            max_replicas=4).scale(3)
        for _ in range(60):
            state = await reader.read(time.time())
            learned += state.startup_durations_s
            if state.ready_replicas == 3 and len(learned) == 3:
                break
            await asyncio.sleep(0.5)
        again = await reader.read(time.time())
        return state, learned, again

    state, learned, again = with_kube(cluster, go)
    assert state.spec_replicas == 3 and state.ready_replicas == 3 and state.starting_replicas == 0
    # one duration per pod, each reported once, close to kwok's 3 s ready delay
    assert len(learned) == 3 and all(2.5 <= d <= 15.0 for d in learned)
    assert again.startup_durations_s == ()


def test_placeholder_copies_the_replica_shape(cluster, namespace):
    ns = namespace
    target = deploy(cluster, ns, replicas=1)
    # an affinity, CPU and memory, a sidecar and an init container, so the shape is non-trivial: the pod
    # needs max(7.5 CPU running, 16 CPU to init) and max(32Gi, 8Gi)
    patch = {"spec": {"template": {"spec": {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}},
        "containers": [
            {"name": "vllm", "image": "vllm/vllm-openai:v0.18.0",
             "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "7", "memory": "30Gi"},
                           "limits": {"nvidia.com/gpu": "1", "memory": "30Gi"}}},
            {"name": "proxy", "image": "envoy", "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}}}],
        "initContainers": [
            {"name": "download", "image": "fetch", "resources": {"requests": {"cpu": "16", "memory": "8Gi"}}}],
    }}}}
    status, _ = cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model", patch)
    assert status == 200
    status, _ = cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                {"metadata": {"name": f"placeholder-{ns}"}, "value": -5})
    assert status == 201

    async def go(kube):
        pool = PlaceholderPool(kube, namespace=ns, name="model-warm", priority_class=f"placeholder-{ns}",
                               pause_image="registry.k8s.io/pause:3.10", max_slots=4)
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", warm_pool=pool)
        template = await reader.pod_template()
        await pool.ensure(template, 2)
        await pool.ensure(template, 9)  # clamped to max_slots, updates in place
        for _ in range(40):
            state = await reader.read(time.time())
            if state.warm_slots_ready == 4:
                return state
            await asyncio.sleep(0.5)
        return state

    state = with_kube(cluster, go)
    assert state.warm_slots_ready == 4
    status, pool = cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/model-warm")
    spec = pool["spec"]["template"]["spec"]
    want = target["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == f"placeholder-{ns}"
    assert spec["nodeSelector"] == want["nodeSelector"]
    assert spec["tolerations"] == want["tolerations"]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spec["containers"][0]["resources"]["requests"] == {"cpu": "16", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert spec["containers"][0]["image"].startswith("registry.k8s.io/pause")


def test_warm_pool_refuses_a_deployment_it_does_not_own(cluster, namespace):
    ns = namespace
    deploy(cluster, ns, name="model")
    deploy(cluster, ns, name="model-warm")

    async def go(kube):
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model")
        pool = PlaceholderPool(kube, namespace=ns, name="model-warm", priority_class="x",
                               pause_image="pause", max_slots=2)
        with pytest.raises(PermanentError, match="not ours"):
            await pool.ensure(await reader.pod_template(), 1)

    with_kube(cluster, go)
    assert replicas_of(cluster, ns, "model-warm") == 2


def test_scaling_event_carries_the_reasons(cluster, namespace):
    ns = namespace
    deploy(cluster, ns)

    async def go(kube):
        recorder = EventRecorder(kube, namespace=ns, kind="Deployment", name="model", instance="test-0")
        await recorder.scaled(before=2, after=5, reasons=("predictive: 5 replicas for upper forecast 80 req/s",),
                              now=time.time())

    with_kube(cluster, go)
    status, events = cluster.request("GET", f"/api/v1/namespaces/{ns}/events")
    assert status == 200
    [event] = [e for e in events["items"] if e.get("reportingComponent") == "inference-autoscaler"]
    assert event["reason"] == "ScaledUp" and event["involvedObject"]["name"] == "model"
    assert "predictive: 5 replicas" in event["message"]


def test_leader_election_one_acts_the_other_takes_over(cluster, namespace):
    ns = namespace

    async def go(kube):
        def elector(identity):
            return LeaderElector(kube, namespace=ns, name="model-autoscaler", identity=identity,
                                 lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.3)

        a, b = elector("a"), elector("b")
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        task_a = asyncio.create_task(a.run(stop_a))
        await asyncio.sleep(0.5)
        task_b = asyncio.create_task(b.run(stop_b))
        await asyncio.sleep(1.5)
        both = (a.is_leader, b.is_leader)
        # graceful stop releases the lease: b takes over within a retry period or two
        stop_a.set()
        await task_a
        for _ in range(20):
            if b.is_leader:
                break
            await asyncio.sleep(0.2)
        after_release = (a.is_leader, b.is_leader)
        # b dies without releasing: a fresh candidate must wait for expiry, then take over
        task_b.cancel()
        try:
            await task_b
        except asyncio.CancelledError:
            pass
        c = elector("c")
        assert not await c.try_acquire_or_renew()
        await asyncio.sleep(3.2)
        took_over = await c.try_acquire_or_renew()
        return both, after_release, took_over

    both, after_release, took_over = with_kube(cluster, go)
    assert both == (True, False)
    assert after_release == (False, True)
    assert took_over


def test_cluster_state_tells_waiting_for_a_node_from_no_node_coming(cluster, namespace):
    """A pod no node fits waits (the scheduler's FailedScheduling says nothing about provisioning); once a
    provisioner's Event says it cannot place it, the pod is not capacity on the way, with that message."""
    ns = namespace
    body = model_deployment(ns, "model", 1)
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "100"},
                                                                       "requests": {"nvidia.com/gpu": "100"}}
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)[0] == 201

    async def go(kube):
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model")
        for _ in range(40):
            state = await reader.read(time.time())
            if state.unschedulable_pods:
                break
            await asyncio.sleep(0.5)
        pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"]
        tell_no_capacity(cluster, ns, pods[0]["metadata"])
        told = await reader.read(time.time())
        return state, told

    waiting, told = with_kube(cluster, go)
    assert waiting.unschedulable_pods == 1 and waiting.no_capacity_pods == 0  # the scheduler's own word only
    assert told.unschedulable_pods == 1 and told.no_capacity_pods == 1
    assert told.no_capacity_reason.startswith("karpenter: Failed to schedule pod") and told.oldest_unschedulable_s >= 0


@pytest.mark.parametrize("content", [None, "just text\n", "apiVersion: v1\nkind: Config\n"])
def test_a_missing_or_malformed_kubeconfig_is_a_config_error_naming_the_file(tmp_path, content):
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=str(path)):
        asyncio.run(Kube.connect(str(path)))
