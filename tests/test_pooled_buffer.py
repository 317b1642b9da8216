"""Pooled warm capacity as CapacityBuffers (`PooledCapacityBuffer`) on a real kube-apiserver serving the
CapacityBuffer CRD that Karpenter ships: one PodTemplate and one buffer per replica shape, written, updated,
scaled to 0 and refused as the module docstring of autoscaler/kube/pooledwarm.py says, and chosen by the fleet
controller for `warm_pool.backend: capacity-buffer`. With Karpenter keeping the room: tests/test_warm_capacity.py.
"""

import asyncio
import time

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from structlog.testing import capture_logs

from autoscaler.errors import PermanentError
from autoscaler.kube.pooledwarm import SHAPE_LABEL, TEMPLATE_HASH, PooledCapacityBuffer, owned_pod
from autoscaler.kube.warmpool import (BUFFER_GROUP, BUFFER_PLURAL, BUFFER_VERSION, MANAGED_BY, CapacityBufferPool,
                                      write_ours)

from loadtest.kubecount import RequestCounter

from helpers import with_kube
from test_fleet import Running, crd  # noqa: F401 - crd: the fixture
from test_fleet_allocation import RateHub, two_pooling_models
from test_pooled_warm import PAUSE, fleet, model, templates  # noqa: F401 - fleet: the fixture

CRD_NAME = f"{BUFFER_PLURAL}.{BUFFER_GROUP}"
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"


@pytest.fixture
def buffer_api(cluster):
    """The CapacityBuffer CRD (autoscaling.x-k8s.io/v1beta1) served, as Karpenter's chart installs it."""
    [crd_doc] = cluster.apply_yaml((cluster.bin_dir / "karpenter-crds" / f"{BUFFER_GROUP}_{BUFFER_PLURAL}.yaml")
                                   .read_text())
    cluster.wait_established([crd_doc["metadata"]["name"]])


def buffers_path(ns, name=""):
    return f"/apis/{BUFFER_GROUP}/{BUFFER_VERSION}/namespaces/{ns}/{BUFFER_PLURAL}" + (f"/{name}" if name else "")


def get(cluster, path):
    status, body = cluster.request("GET", path)
    assert status == 200, body
    return body


def pooled(kube, ns, **kwargs):
    return PooledCapacityBuffer(kube, namespace=ns, priority_class="placeholder", pause_image=PAUSE, max_slots=3,
                                ready_ttl_s=0, **kwargs)


def test_a_pooled_buffer_per_shape_is_written_updated_and_scaled_to_zero(cluster, namespace, fleet, buffer_api):  # noqa: F811
    """Two 4-GPU models (4 CPUs, 32 Gi and 8 CPUs, 16 Gi) and a 1-GPU one: per shape a PodTemplate holding the
    merged placeholder pod (8 CPUs, 32 Gi) and a buffer pointing at it with the pooled slots (at most
    max_slots). Unchanged, the PodTemplate is not rewritten; a model's larger request rewrites it. ready() is
    what the buffers' status says; a shape no model has any more goes to replicas 0, not deleted."""
    (ns_a, ns_b), _, _ = fleet
    small = f"{namespace}-c"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": small}})[0] == 201
    model(cluster, ns_a, replicas=0, pool=namespace, cpu="4", memory="32Gi")
    model(cluster, ns_b, replicas=0, pool=namespace, cpu="8", memory="16Gi")
    # 1 GB: written as "1000000000", kept by the apiserver as "1G", the same quantity (no rewrite every tick)
    model(cluster, small, replicas=0, pool=namespace, gpus="1", memory="1G")
    templates_path = f"/api/v1/namespaces/{namespace}/podtemplates"

    async def go(kube):
        pool = pooled(kube, namespace)
        await pool.ensure({4: 9, 1: 1}, await templates(kube, [ns_a, ns_b, small]))
        first = get(cluster, f"{templates_path}/fleet-warm-4gpu")
        clamped = get(cluster, buffers_path(namespace, "fleet-warm-4gpu"))["spec"]["replicas"]
        models = await templates(kube, [ns_a, ns_b, small])
        counter = RequestCounter(kube)
        await pool.ensure({4: 2, 1: 1}, models)
        writes = counter.requests.copy()
        same = get(cluster, f"{templates_path}/fleet-warm-4gpu")
        deployment = get(cluster, f"/apis/apps/v1/namespaces/{ns_b}/deployments/model")
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "64Gi"
        assert cluster.request("PUT", f"/apis/apps/v1/namespaces/{ns_b}/deployments/model", deployment)[0] == 200
        await pool.ensure({4: 2, 1: 1}, await templates(kube, [ns_a, ns_b, small]))
        grown = get(cluster, f"{templates_path}/fleet-warm-4gpu")
        status = {"replicas": 2, "conditions": [{
            "type": "Provisioning", "status": "True", "reason": "Provisioned", "message": "fits",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        assert cluster.request("PATCH", buffers_path(namespace, "fleet-warm-4gpu") + "/status",
                               {"status": status})[0] == 200
        ready = await pool.ready()
        await pool.ensure({}, {})
        return first, clamped, writes, same, grown, ready

    try:
        first, clamped, writes, same, grown, ready = with_kube(cluster, go)
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{small}")
    pod = first["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
                                                 "limits": {"nvidia.com/gpu": "4"}}
    assert pod["nodeSelector"] == {"pool": namespace} and pod["containers"][0]["image"] == PAUSE
    assert first["metadata"]["labels"] == {SHAPE_LABEL: "4", **MANAGED_BY}
    assert clamped == 3  # 9 decided, max_slots 3
    # only the 4-GPU buffer's new size is written: neither PodTemplate, nor the unchanged 1-GPU buffer
    assert [(method, path.rsplit("/", 2)[-2:]) for (method, path), n in writes.items() if method != "GET"] == [
        ("PUT", [BUFFER_PLURAL, "fleet-warm-4gpu"])]
    assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert grown["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Gi"
    assert grown["metadata"]["annotations"][TEMPLATE_HASH] != first["metadata"]["annotations"][TEMPLATE_HASH]
    assert ready == {4: 2, 1: 0}  # the 1-GPU buffer's status says nothing yet
    buffers = {b["metadata"]["name"]: b for b in get(cluster, buffers_path(namespace))["items"]}
    assert sorted(buffers) == ["fleet-warm-1gpu", "fleet-warm-4gpu"]
    four = buffers["fleet-warm-4gpu"]
    assert four["spec"] == {"podTemplateRef": {"name": "fleet-warm-4gpu"}, "replicas": 0,
                            "provisioningStrategy": "buffer.x-k8s.io/active-capacity"}
    assert four["metadata"]["labels"] == {SHAPE_LABEL: "4", **MANAGED_BY}
    assert buffers["fleet-warm-1gpu"]["spec"]["replicas"] == 0


def test_a_pooled_buffers_pod_template_edited_by_someone_else_is_put_back(cluster, namespace, fleet, buffer_api):  # noqa: F811
    """Someone else changes the image, a request, the tolerations and a pod label of our PodTemplate (leaving
    the hash annotation): the next tick writes the fields we own back. Unedited, with tolerations and affinity
    (which the apiserver echoes as written), a tick writes nothing."""
    (ns_a, _), _, _ = fleet
    model(cluster, ns_a, replicas=0, pool=namespace, gpus="1")
    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    scheduling = {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                  "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}}}
    assert cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns_a}/deployments/model",
                           {"spec": {"template": {"spec": scheduling}}})[0] == 200
    path = f"/api/v1/namespaces/{namespace}/podtemplates/fleet-warm-1gpu"

    async def go(kube):
        pool, models = pooled(kube, namespace), await templates(kube, [ns_a])
        await pool.ensure({1: 1}, models)
        first = get(cluster, path)
        counter = RequestCounter(kube)
        await pool.ensure({1: 1}, models)
        writes = [key for key in counter.requests if key[0] != "GET"]
        edited = get(cluster, path)
        pod = edited["template"]
        pod["spec"]["containers"][0]["image"] = "theirs"
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
        pod["spec"]["tolerations"].append({"key": "spot", "operator": "Exists"})
        pod["metadata"]["labels"]["extra"] = "theirs"
        assert cluster.request("PUT", path, edited)[0] == 200
        await pool.ensure({1: 1}, models)
        return first, writes, get(cluster, path)

    first, writes, restored = with_kube(cluster, go)
    assert first["template"]["spec"]["tolerations"] == scheduling["tolerations"]
    assert writes == []
    assert owned_pod(restored["template"]) == owned_pod(first["template"])
    assert restored["template"]["spec"]["containers"][0]["image"] == PAUSE
    assert restored["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]


def test_a_buffer_left_behind_by_a_change_of_gpu_resource_goes_to_zero_and_a_held_one_stays(
        cluster, namespace, fleet, buffer_api):  # noqa: F811 - the fixture
    """A 1-GPU model moves from nvidia.com/gpu to a MIG profile: its shape's pool is now `fleet-warm-1x-mig-...`
    (the same GPU count) and the old `fleet-warm-1gpu` goes to 0 (keyed by name, not GPU count). A second MIG
    model on another node pool makes the shape refused: its buffer is held, not scaled to 0."""
    (ns_a, ns_b), _, _ = fleet
    model(cluster, ns_a, replicas=0, pool=namespace, gpus="1")
    model(cluster, ns_b, replicas=0, pool="other", gpus="1")
    mig = "nvidia.com/mig-1g.10gb"

    def to_mig(ns):
        deployment = get(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/model")
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {mig: "1"},
                                                                               "limits": {mig: "1"}}
        assert cluster.request("PUT", f"/apis/apps/v1/namespaces/{ns}/deployments/model", deployment)[0] == 200

    async def go(kube):
        pool = pooled(kube, namespace)
        await pool.ensure({1: 2}, await templates(kube, [ns_a]))
        to_mig(ns_a)
        await pool.ensure({1: 2}, await templates(kube, [ns_a]))
        moved = replicas_by_name()
        to_mig(ns_b)
        with pytest.raises(PermanentError) as held:
            await pool.ensure({1: 3}, await templates(kube, [ns_a, ns_b]))
        return moved, held.value

    def replicas_by_name():
        return {b["metadata"]["name"]: b["spec"]["replicas"] for b in get(cluster, buffers_path(namespace))["items"]}

    moved, held = with_kube(cluster, go)
    assert moved == {"fleet-warm-1gpu": 0, "fleet-warm-1x-mig-1g.10gb": 2}
    assert held.kind == "pooled_warm_shape" and "differ in node selector" in str(held)
    assert replicas_by_name() == moved


def test_a_pooled_buffer_refuses_objects_not_ours_and_models_that_cannot_share_a_pod(
        cluster, namespace, fleet, buffer_api):  # noqa: F811 - the fixture
    """A PodTemplate of the pool's name that is not ours is refused, and so is such a buffer: neither is
    changed. Two 4-GPU models on different node pools are refused with the error naming both (the 1-GPU shape
    is still written)."""
    (ns_a, ns_b), _, _ = fleet
    model(cluster, ns_a, replicas=0, pool="x", selector={"pool": "east"})
    model(cluster, ns_b, replicas=0, pool="x", gpus="1")
    foreign = {"metadata": {"name": "fleet-warm-1gpu"}, "template": {"spec": {"containers": [
        {"name": "c", "image": "theirs"}]}}}
    assert cluster.request("POST", f"/api/v1/namespaces/{namespace}/podtemplates", foreign)[0] == 201
    theirs = {"apiVersion": f"{BUFFER_GROUP}/{BUFFER_VERSION}", "kind": "CapacityBuffer",
              "metadata": {"name": "fleet-warm-4gpu"}, "spec": {"podTemplateRef": {"name": "theirs"}, "replicas": 5}}
    assert cluster.request("POST", buffers_path(namespace), theirs)[0] == 201

    async def refused(kube, slots, namespaces):
        with pytest.raises(PermanentError) as caught:
            await pooled(kube, namespace).ensure(slots, await templates(kube, namespaces))
        return caught.value

    template_refused = with_kube(cluster, lambda kube: refused(kube, {1: 1}, [ns_b]))
    buffer_refused = with_kube(cluster, lambda kube: refused(kube, {4: 1}, [ns_a]))
    assert template_refused.kind == "not_owned" and buffer_refused.kind == "not_owned"
    assert f"PodTemplate {namespace}/fleet-warm-1gpu exists and is not ours" in str(template_refused)
    assert f"CapacityBuffer {namespace}/fleet-warm-4gpu exists and is not ours" in str(buffer_refused)
    assert get(cluster, buffers_path(namespace, "fleet-warm-4gpu"))["spec"]["replicas"] == 5
    podtemplates = get(cluster, f"/api/v1/namespaces/{namespace}/podtemplates")["items"]
    assert [t["template"]["spec"]["containers"][0]["image"] for t in podtemplates] == ["theirs", PAUSE]

    other = f"{namespace}-c"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": other}})[0] == 201
    try:
        model(cluster, other, replicas=0, pool="x", selector={"pool": "west"})
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/podtemplates/fleet-warm-1gpu")
        differ = with_kube(cluster, lambda kube: refused(kube, {4: 2, 1: 1}, [ns_a, other, ns_b]))
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{other}")
    assert differ.kind == "pooled_warm_shape"
    assert f"{ns_a}/model and {other}/model differ in node selector" in str(differ) and "4-GPU" in str(differ)
    assert get(cluster, buffers_path(namespace, "fleet-warm-1gpu"))["spec"]["replicas"] == 1


def buffer(name, labels, *, replicas):
    return {"apiVersion": f"{BUFFER_GROUP}/{BUFFER_VERSION}", "kind": "CapacityBuffer",
            "metadata": {"name": name, "labels": labels},
            "spec": {"podTemplateRef": {"name": name}, "replicas": replicas}}


def fits(replicas):
    return {"status": {"replicas": replicas, "conditions": [{
        "type": "Provisioning", "status": "True", "reason": "Provisioned", "message": "fits",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def test_only_our_buffers_are_listed_and_a_shape_label_that_does_not_parse_is_skipped(
        cluster, namespace, fleet, buffer_api):  # noqa: F811 - the fixture
    """Buffers of another's with our shape label (one of a shape we keep, with 5 slots ready; one of a shape no
    model has) are neither counted nor scaled to 0 (which would fail as not ours every tick), and one of ours
    whose shape label is not a number is skipped with a warning (once, not at every read): the tick writes our
    1-GPU buffer all the same."""
    (ns_a, _), _, _ = fleet
    model(cluster, ns_a, replicas=0, pool=namespace, gpus="1")
    for name, labels, replicas in (("theirs-1", {SHAPE_LABEL: "1"}, 5), ("theirs-2", {SHAPE_LABEL: "2"}, 3),
                                   ("garbled", {SHAPE_LABEL: "four", **MANAGED_BY}, 2)):
        assert cluster.request("POST", buffers_path(namespace), buffer(name, labels, replicas=replicas))[0] == 201
    assert cluster.request("PATCH", buffers_path(namespace, "theirs-1") + "/status", fits(5))[0] == 200

    async def go(kube):
        pool = pooled(kube, namespace)
        with capture_logs() as logs:
            for _ in range(2):  # two ticks: warned once
                await pool.ensure({1: 1}, await templates(kube, [ns_a]))
                ready = await pool.ready()
        return ready, logs

    ready, logs = with_kube(cluster, go)
    assert ready.get(1) == 0 and 2 not in ready  # another's slots are not ours to count
    replicas = {b["metadata"]["name"]: b["spec"]["replicas"] for b in get(cluster, buffers_path(namespace))["items"]}
    assert replicas == {"fleet-warm-1gpu": 1, "garbled": 2, "theirs-1": 5, "theirs-2": 3}
    assert [(e["kind"], e["object"]) for e in logs if e.get("kind") == "bad_shape_label"] == [
        ("bad_shape_label", "garbled")]


def test_without_the_capacity_buffer_api_the_pooled_buffer_says_so(cluster, namespace, fleet):  # noqa: F811 - the fixture
    """Where no CapacityBuffer CRD is served, `ensure` raises the clear error of the single-model buffer (install
    the CRD or use placeholders) and `ready()` reads no slot."""
    (ns_a, _), _, _ = fleet
    model(cluster, ns_a, replicas=0, pool=namespace, gpus="1")
    cluster.request("DELETE", CRD_PATH)
    deadline = time.monotonic() + 30
    while cluster.request("GET", CRD_PATH)[0] != 404:
        assert time.monotonic() < deadline, "the CapacityBuffer CRD is still there"
        time.sleep(0.1)

    async def go(kube):
        while True:  # until the apiserver stops serving it (its handler follows the CRD's deletion)
            try:
                await kube.custom.list_namespaced_custom_object(BUFFER_GROUP, BUFFER_VERSION, namespace, BUFFER_PLURAL)
            except ApiException as exc:
                if exc.status == 404:
                    break
            assert time.monotonic() < deadline, "the CapacityBuffer API is still served"
            await asyncio.sleep(0.1)
        pool = pooled(kube, namespace)
        with pytest.raises(PermanentError) as caught:
            await pool.ensure({1: 1}, await templates(kube, [ns_a]))
        with pytest.raises(PermanentError) as gone_too:
            await pool.ensure({}, {})  # no shape: the listing of our buffers finds no API either
        return caught.value, gone_too.value, await pool.ready()

    error, listed, ready = with_kube(cluster, go)
    assert error.kind == listed.kind == "no_capacity_buffer_api"
    assert "the CapacityBuffer API (autoscaling.x-k8s.io/v1beta1) is not served here" in str(error)
    assert ready == {}


def test_a_buffer_in_a_missing_namespace_says_so_and_one_deleted_before_its_update_is_made_again(
        cluster, namespace, buffer_api):
    """The create's 404 where the CapacityBuffer API is served names the missing namespace (not the API). An
    object deleted between the read and the replace (a 404 from the replace) is created again."""
    gone = f"{namespace}-gone"
    path = buffers_path(namespace, "b")
    assert cluster.request("POST", buffers_path(namespace), buffer("b", dict(MANAGED_BY), replicas=1))[0] == 201

    async def go(kube):
        with pytest.raises(PermanentError) as missing:
            await CapacityBufferPool(kube, namespace=gone, name="b", max_slots=3, pod_template="b").ensure(None, 1)
        custom, args = kube.custom, (BUFFER_GROUP, BUFFER_VERSION, namespace, BUFFER_PLURAL)

        async def read_then_deleted():
            current = await custom.get_namespaced_custom_object(*args, "b")
            assert cluster.request("DELETE", path)[0] == 200  # another deletes it meanwhile
            return current

        body = buffer("b", dict(MANAGED_BY), replicas=2)
        body["metadata"]["namespace"] = namespace
        await write_ours(kube, what=f"CapacityBuffer {namespace}/b", body=body, read=read_then_deleted,
                         create=lambda b: custom.create_namespaced_custom_object(*args, b),
                         replace=lambda b: custom.replace_namespaced_custom_object(*args, "b", b))
        return missing.value

    missing = with_kube(cluster, go)
    assert missing.kind == "no_namespace", missing
    assert f"the namespace {gone} does not exist" in str(missing) and "not served" not in str(missing)
    assert get(cluster, path)["spec"]["replicas"] == 2


def test_the_fleet_pools_capacity_buffers_for_the_capacity_buffer_backend(cluster, crd, namespace, buffer_api):  # noqa: F811
    """The fleet controller with `warm_pool.backend: capacity-buffer`: two models each needing 2 warm slots alone
    pool 3 in one 1-GPU buffer in the controller's namespace, not a buffer each. Once the buffer's status says
    its slots fit, the models' readers (on the fleet's watch cache) count them: their lead time drops the
    node provisioning."""
    ns = namespace
    settings = two_pooling_models(cluster, ns)
    settings = settings.model_copy(update={"warm_pool": settings.warm_pool.model_copy(
        update={"backend": "capacity-buffer"})})

    async def go():
        async with Running(cluster, settings, RateHub({(ns, "a"): 64, (ns, "b"): 64}), cached=True) as run:
            await run.fleet.tick()
            first = {k[1]: m.decision for k, m in run.fleet.models.items()}
            status = {"replicas": 3, "conditions": [{
                "type": "Provisioning", "status": "True", "reason": "Provisioned", "message": "fits",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
            assert cluster.request("PATCH", buffers_path(ns, "fleet-warm-1gpu") + "/status",
                                   {"status": status})[0] == 200
            await asyncio.sleep(run.fleet.step.pooled.ready_ttl_s)
            await run.fleet.tick()
            return type(run.fleet.step.pooled), first, {k[1]: m.decision for k, m in run.fleet.models.items()}

    kind, decisions, later = asyncio.run(go())
    assert kind is PooledCapacityBuffer
    buffers = {b["metadata"]["name"]: b["spec"] for b in get(cluster, buffers_path(ns))["items"]}
    assert buffers == {"fleet-warm-1gpu": {"podTemplateRef": {"name": "fleet-warm-1gpu"}, "replicas": 3,
                                           "provisioningStrategy": "buffer.x-k8s.io/active-capacity"}}
    assert [t["metadata"]["name"] for t in get(cluster, f"/api/v1/namespaces/{ns}/podtemplates")["items"]] == [
        "fleet-warm-1gpu"]
    assert all(d.warm_slots == 0 for d in decisions.values())  # none of their own
    assert all(d.lead_time_s >= 300 for d in decisions.values()), decisions
    assert all(d.lead_time_s < 300 for d in later.values()), later


@pytest.mark.parametrize("ref", [{}, {"target_kind": "Deployment"}, {"target": "model"},
                                 {"target_kind": "Deployment", "target": "model", "pod_template": "t"}])
def test_a_buffer_needs_either_a_target_or_a_pod_template(ref):
    """Neither (which wrote `scalableRef: {kind: "", name: ""}` silently), half a target, or both: refused."""
    with pytest.raises(ValueError, match="needs either a target .* or a pod_template"):
        CapacityBufferPool(None, namespace="ns", name="b", max_slots=1, **ref)
    assert CapacityBufferPool(None, namespace="ns", name="b", max_slots=1, pod_template="t").ref == {
        "podTemplateRef": {"name": "t"}}
