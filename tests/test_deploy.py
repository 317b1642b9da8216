"""deploy/: rendered with kustomize, created on a real apiserver, and its RBAC exercised for real."""

import asyncio
import json
import os

import pytest
import yaml

from autoscaler.config import load_config
from autoscaler.errors import PermanentError
from autoscaler.kube.client import Kube
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.deletion import PENDING_COST, DeletionOrder
from autoscaler.kube.events import EventRecorder
from autoscaler.kube.lease import LeaderElector
from autoscaler.kube.scale import ScaleActuator
from autoscaler.kube.warmpool import PlaceholderPool

from loadtest.kube.controlplane import ROOT, model_deployment
from helpers import render
from overlays import find, render_overlay

NS, MODEL, SA = "llm", "llama-3-8b", "inference-autoscaler"
PATHS = {
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ("coordination.k8s.io/v1", "Lease"): "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    ("scheduling.k8s.io/v1", "PriorityClass"): "/apis/scheduling.k8s.io/v1/priorityclasses",
}


@pytest.fixture(scope="module")
def installed(cluster):
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})[0] in (201, 409)
    deployments = f"/apis/apps/v1/namespaces/{NS}/deployments"
    assert cluster.request("POST", deployments, model_deployment(NS, MODEL, 1))[0] == 201
    assert cluster.request("POST", deployments, model_deployment(NS, "other", 1))[0] == 201
    created = []
    for doc in render("example"):
        path = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=doc["metadata"].get("namespace", NS))
        status, body = cluster.request("POST", path + "?fieldValidation=Strict", doc)
        assert status == 201, (doc["kind"], doc["metadata"]["name"], body.get("message"))
        created.append((doc["kind"], doc["metadata"]["name"]))
    return created


def test_every_rendered_manifest_is_accepted_by_the_apiserver(installed):
    kinds = {kind for kind, _ in installed}
    assert {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service", "Lease",
            "PriorityClass", "ClusterRole", "ClusterRoleBinding"} <= kinds
    assert ("Deployment", f"{MODEL}-warm-pool") in installed and ("Lease", f"{MODEL}-autoscaler") in installed
    # cluster-scoped, so named after the model like the Lease
    assert ("ClusterRole", f"{MODEL}-autoscaler-nodes") in installed
    assert ("ClusterRoleBinding", f"{MODEL}-autoscaler-nodes") in installed


def impersonated(cluster, method, path, body=None, ns=NS):
    import ssl
    import urllib.request

    request = urllib.request.Request(
        cluster.url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json",
                 "Impersonate-User": f"system:serviceaccount:{ns}:{SA}"},
    )
    try:
        context = ssl.create_default_context(cafile=cluster.ca_file)
        with urllib.request.urlopen(request, context=context, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("method,path,allowed", [
    ("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}/scale", True),
    ("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}", True),
    ("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}-warm-pool", True),
    ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{MODEL}-autoscaler", True),
    ("GET", f"/api/v1/namespaces/{NS}/pods", True),
    ("GET", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/localqueues/models", True),  # a quota to follow
    ("GET", "/apis/kueue.x-k8s.io/v1beta1/clusterqueues", True),
    ("GET", "/api/v1/pods", False),  # every namespace's pods: only with the idle-slots component
    ("PATCH", f"/api/v1/namespaces/{NS}/pods/any", True),  # the pod-deletion-cost annotation
    ("GET", "/api/v1/nodes", True),  # which nodes are going away, before a scale-down
    ("GET", "/api/v1/nodes/gpu-0", True),
    ("PATCH", "/api/v1/nodes/gpu-0", False),
    ("DELETE", f"/api/v1/namespaces/{NS}/pods/any", False),
    ("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/other/scale", False),
    ("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/other", False),
    ("GET", f"/api/v1/namespaces/{NS}/secrets", False),
    ("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}", False),
    ("GET", "/api/v1/namespaces/kube-system/pods", False),
])
def test_rbac_by_impersonation(cluster, installed, method, path, allowed):
    status = impersonated(cluster, method, path)
    assert (status != 403) == allowed, status
    if not allowed:
        assert status == 403


def service_account_kubeconfig(cluster, ns: str, context: str) -> str:
    """A kubeconfig with the controller's service account's own token (TokenRequest)."""
    status, body = cluster.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{SA}/token",
                                   {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": 3600}})
    assert status == 201, body
    return cluster.kubeconfig_for(body["status"]["token"], context)


async def scale_and_warm(kube, ns: str, kind: str, model: str) -> int:
    """Read the target, scale it up by one, size its warm pool to one slot, and find another target of the
    same kind forbidden. Returns the replicas before."""
    pool = PlaceholderPool(kube, namespace=ns, name=f"{model}-warm-pool",
                           priority_class="inference-autoscaler-placeholder", pause_image="registry.k8s.io/pause:3.10",
                           max_slots=2)
    reader = ClusterReader(kube, namespace=ns, kind=kind, name=model, warm_pool=pool)
    state = await reader.read(0.0)
    assert await ScaleActuator(kube, namespace=ns, kind=kind, name=model, min_replicas=1,
                               max_replicas=4).scale(state.spec_replicas + 1) is not None
    await pool.ensure(await reader.pod_template(), 1)
    with pytest.raises(PermanentError) as err:
        await ScaleActuator(kube, namespace=ns, kind=kind, name="other", min_replicas=1, max_replicas=4).scale(3)
    assert err.value.kind == "forbidden"
    # the provisioner's Events about waiting pods can be read (capacity that is not coming)
    assert await reader._no_capacity({"some-pod": 0.0}, 0.0) == (set(), "")
    return state.spec_replicas


def test_controller_components_work_with_the_service_accounts_own_token(cluster, installed, tmp_path):
    kubeconfig = service_account_kubeconfig(cluster, NS, "sa")

    async def go():
        kube = await Kube.connect(kubeconfig)
        try:
            await scale_and_warm(kube, NS, "Deployment", MODEL)
            # before a scale-down: the pods listed and annotated, their nodes read, all with the SA's own rights
            errors = []
            for _ in range(40):  # until the scheduler has placed a pod (a fresh control plane takes a moment)
                marked = await DeletionOrder(kube, namespace=NS, on_error=errors.append).mark(f"app={MODEL}")
                if errors or any(cost > PENDING_COST for cost in marked.values()):
                    break
                await asyncio.sleep(0.5)
            assert errors == [] and any(cost > PENDING_COST for cost in marked.values()), (errors, marked)
            elector = LeaderElector(kube, namespace=NS, name=f"{MODEL}-autoscaler", identity="pod-a",
                                    lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
            assert await elector.try_acquire_or_renew()
            await EventRecorder(kube, namespace=NS, kind="Deployment", name=MODEL, instance="pod-a").scaled(
                before=1, after=2, reasons=("test",), now=0.0)
        finally:
            await kube.close()

    asyncio.run(go())
    pool = cluster.request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}-warm-pool")[1]
    assert pool["spec"]["replicas"] == 1
    assert pool["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}


def test_shipped_configmap_validates(monkeypatch, tmp_path):
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "configmap.yaml").read_text()) if d]
    config = next(d for d in docs if d["metadata"]["name"] == "inference-autoscaler")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(config)
    # the Deployment provides these through the environment
    monkeypatch.setenv("AUTOSCALER_TARGET__NAMESPACE", NS)
    monkeypatch.setenv("AUTOSCALER_TARGET__NAME", MODEL)
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS__SELECTOR", f'namespace="{NS}"')
    settings = load_config(path)
    assert settings.target.name == MODEL and settings.mode.value == "shadow"
    assert settings.queries["queue_depth"] == f'sum(vllm:num_requests_waiting{{namespace="{NS}"}})'


def test_keda_scaled_object_targets_the_scaler_service():
    [scaled] = render("keda")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "external-push" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["scalerAddress"].endswith(":9090")
    assert scaled["metadata"]["name"] == scaled["spec"]["scaleTargetRef"]["name"]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 0


STS_NS, STS_MODEL = "llm-sts", "llama-sts"


def model_statefulset(namespace: str, name: str, replicas: int) -> dict:
    doc = model_deployment(namespace, name, replicas)
    doc["kind"] = "StatefulSet"
    doc["spec"]["serviceName"] = name
    return doc


@pytest.fixture(scope="module")
def statefulset_installed(cluster, tmp_path_factory):
    """A user's overlay for a model served by a StatefulSet: base + model-name + statefulset components."""
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": STS_NS}})[0] in (201, 409)
    for name in (STS_MODEL, "other"):
        status, body = cluster.request("POST", f"/apis/apps/v1/namespaces/{STS_NS}/statefulsets",
                                       model_statefulset(STS_NS, name, 1))
        assert status == 201, body.get("message")
    docs = render_overlay(tmp_path_factory.mktemp("overlay"), namespace=STS_NS, model=STS_MODEL,
                          components=("model-name", "statefulset"))
    for doc in docs:
        path = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=doc["metadata"].get("namespace", STS_NS))
        status, body = cluster.request("POST", path + "?fieldValidation=Strict", doc)
        assert status == 201 or (status == 409 and doc["kind"] == "PriorityClass"), body.get("message")
    return docs


@pytest.mark.parametrize("path,allowed", [
    (f"/apis/apps/v1/namespaces/{STS_NS}/statefulsets/{STS_MODEL}/scale", True),
    (f"/apis/apps/v1/namespaces/{STS_NS}/statefulsets/{STS_MODEL}", True),
    (f"/apis/apps/v1/namespaces/{STS_NS}/deployments/{STS_MODEL}-warm-pool", True),
    (f"/apis/apps/v1/namespaces/{STS_NS}/statefulsets/other/scale", False),
    (f"/apis/apps/v1/namespaces/{STS_NS}/deployments/{STS_MODEL}/scale", False),
])
def test_statefulset_component_grants_the_models_statefulset(cluster, statefulset_installed, path, allowed):
    status = impersonated(cluster, "GET", path, ns=STS_NS)
    assert (status != 403) == allowed, status


def test_statefulset_target_scales_with_the_service_accounts_own_token(cluster, statefulset_installed, monkeypatch,
                                                                       tmp_path):
    controller = next(d for d in statefulset_installed if d["kind"] == "Deployment" and "warm-pool" not in
                      d["metadata"]["name"])
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    config = next(d for d in statefulset_installed if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "inference-autoscaler")["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config)
    monkeypatch.setenv("AUTOSCALER_TARGET__KIND", env["AUTOSCALER_TARGET__KIND"])
    monkeypatch.setenv("AUTOSCALER_TARGET__NAMESPACE", STS_NS)
    monkeypatch.setenv("AUTOSCALER_TARGET__NAME", STS_MODEL)
    target = load_config(tmp_path / "config.yaml").target
    assert target.kind == "StatefulSet"
    kubeconfig = service_account_kubeconfig(cluster, STS_NS, "sa-sts")

    async def go():
        kube = await Kube.connect(kubeconfig)
        try:
            return await scale_and_warm(kube, STS_NS, target.kind, STS_MODEL)
        finally:
            await kube.close()

    before = asyncio.run(go())
    model = cluster.request("GET", f"/apis/apps/v1/namespaces/{STS_NS}/statefulsets/{STS_MODEL}")[1]
    assert model["spec"]["replicas"] == before + 1
    pool = cluster.request("GET", f"/apis/apps/v1/namespaces/{STS_NS}/deployments/{STS_MODEL}-warm-pool")[1]
    assert pool["spec"]["replicas"] == 1


MODEL_SERVER_NS = "llm-model-server"


def test_model_server_example_drains_and_is_accepted(cluster):
    """deploy/model: created with strict validation (in a namespace of its own: the installed fixture has a
    stand-in model of the same name in `llm`), and its drain settings add up."""
    docs = render("model")
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": MODEL_SERVER_NS}})[0] in (201, 409)
    try:
        for doc in docs:
            doc["metadata"]["namespace"] = MODEL_SERVER_NS
            path = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=MODEL_SERVER_NS)
            status, body = cluster.request("POST", path + "?fieldValidation=Strict", doc)
            assert status == 201, (doc["kind"], doc["metadata"]["name"], body.get("message"))
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{MODEL_SERVER_NS}")
    [server] = [d for d in docs if d["kind"] == "Deployment"]
    assert server["metadata"]["name"] == MODEL  # the controller's target in deploy/example
    spec = server["spec"]["template"]["spec"]
    [vllm] = spec["containers"]
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    shutdown_s = next(int(a.split("=", 1)[1]) for a in vllm["args"] if a.startswith("--shutdown-timeout="))
    sleep_s = vllm["lifecycle"]["preStop"]["sleep"]["seconds"]
    # SIGKILL comes at the grace period, counted from the deletion: after the sleep and the drain
    assert sleep_s > 0 and shutdown_s > 0 and spec["terminationGracePeriodSeconds"] > sleep_s + shutdown_s
    [service] = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["selector"] == server["spec"]["selector"]["matchLabels"]


def test_idle_slots_component_grants_listing_pods_everywhere_and_turns_the_reading_on(tmp_path):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render_overlay(
        tmp_path, namespace="llm", model="llama", components=("idle-slots", "model-name"))}
    rules = docs[("ClusterRole", "llama-autoscaler-nodes")]["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]} in rules
    env = docs[("Deployment", "inference-autoscaler")]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "AUTOSCALER_CAPACITY__READ_NODES", "value": "true"} in env


@pytest.mark.parametrize("components", [("fleet-crd", "fleet", "capacity-buffer", "model-name"),
                                        ("fleet-crd", "capacity-buffer", "fleet", "model-name")])
def test_the_fleet_component_keeps_what_another_component_adds_to_the_environment_in_either_order(tmp_path,
                                                                                                components):
    """The fleet component drops the single-model entries and adds its own by name: the capacity-buffer
    component's backend stays whether it is listed before or after it."""
    docs = render_overlay(tmp_path, namespace="ctl", model="fleet", components=components)
    env = find(docs, "Deployment", "inference-autoscaler")["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert sorted(names) == ["AUTOSCALER_FLEET__ENABLED", "AUTOSCALER_LEADER_ELECTION__LEASE_NAME",
                             "AUTOSCALER_WARM_POOL__BACKEND", "MODEL_NAME", "POD_NAME", "POD_NAMESPACE"], names
    assert {"name": "AUTOSCALER_WARM_POOL__BACKEND", "value": "capacity-buffer"} in env
    # $(MODEL_NAME) is expanded only from an entry listed before it
    assert names.index("MODEL_NAME") < names.index("AUTOSCALER_LEADER_ELECTION__LEASE_NAME")


def test_network_policy_component_admits_keda_the_gateway_and_monitoring_only_and_is_accepted(cluster, installed,
                                                                                            tmp_path):
    docs = render_overlay(tmp_path, namespace=NS, model=MODEL, components=("model-name", "network-policy"))
    policy = find(docs, "NetworkPolicy")
    status, body = cluster.request("POST", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
                                   "?fieldValidation=Strict", policy)
    assert status == 201, body.get("message")
    controller = find(docs, "Deployment", "inference-autoscaler")
    pod = controller["spec"]["template"]
    # it selects the controller's pods, and each port it opens is one of their container ports (by name)
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    sources = {}
    for rule in body["spec"]["ingress"]:
        [port] = rule["ports"]
        assert port["port"] in ports
        [peer] = rule["from"]  # one peer: namespace AND pods when both are given
        sources[port["port"]] = (peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                                 peer.get("podSelector", {}).get("matchLabels"))
    assert sources == {
        "grpc": ("keda", {"app.kubernetes.io/name": "keda-operator"}),
        "admission": ("gateway", {"app.kubernetes.io/name": "gateway"}),
        "http": ("monitoring", None),
    }
    # the probes' port is the metrics port: the kubelet reaches it from the node, which a policy never blocks
    assert {pod["spec"]["containers"][0][p]["httpGet"]["port"] for p in ("readinessProbe", "livenessProbe")} == {"http"}


def test_keda_tls_component_mounts_the_secret_and_sets_the_tls_config_and_the_trigger_authentication(tmp_path):
    from autoscaler.config import ScalerTLS

    docs = render_overlay(tmp_path, namespace=NS, model=MODEL, resources=("base", "keda"),
                          components=("model-name", "keda-tls"))
    spec = find(docs, "Deployment", "inference-autoscaler")["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if "secret" in v]
    [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    tls = {k.removeprefix("AUTOSCALER_KEDA__TLS__").lower(): v for k, v in env.items()
           if k.startswith("AUTOSCALER_KEDA__TLS__")}
    assert set(tls) == set(ScalerTLS.model_fields)  # every field set, each one a field of the config
    assert {os.path.dirname(v) for v in tls.values()} == {mount["mountPath"]}
    assert {os.path.basename(v) for v in tls.values()} == {"tls.crt", "tls.key", "ca.crt"}  # cert-manager's keys
    auth = find(docs, "TriggerAuthentication")
    [trigger] = find(docs, "ScaledObject")["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == {"caCert", "tlsClientCert", "tlsClientKey"}
    assert auth["metadata"]["namespace"] == NS  # KEDA reads its Secret in the ScaledObject's namespace


def _images(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


def test_every_shipped_image_is_pinned_to_a_release():
    """A manifest's image names a tag (or digest) other than `latest`: an upgrade is a reviewed change, and the
    model server's drain relies on a release that has --shutdown-timeout."""
    images = {}
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for image in _images(doc):
                images[image] = path.relative_to(ROOT)
    assert "vllm/vllm-openai:v0.18.0" in images
    for image, path in images.items():
        name, _, tag = image.rpartition("@")[0].rpartition(":") if "@" in image else image.rpartition(":")
        assert "@sha256:" in image or (name and tag and "/" not in tag and tag != "latest"), (str(path), image)


CB_NS, CB_MODEL = "llm-cb", "llama-cb"


def test_capacity_buffer_component_lets_the_controller_keep_its_buffer_and_nothing_more(cluster, tmp_path):
    """The capacity-buffer component on the real apiserver: with the service account's own token, the
    controller's single-model buffer is created, resized and read; deleting it, and any buffer of another
    namespace, stays forbidden."""
    from autoscaler.kube.warmpool import BUFFER_GROUP, BUFFER_PLURAL, BUFFER_VERSION, CapacityBufferPool

    crd_file = cluster.bin_dir / "karpenter-crds" / f"{BUFFER_GROUP}_{BUFFER_PLURAL}.yaml"
    [crd] = cluster.apply_yaml(crd_file.read_text())
    cluster.wait_established([crd["metadata"]["name"]])
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": CB_NS}})[0] in (201, 409)
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{CB_NS}/deployments",
                           model_deployment(CB_NS, CB_MODEL, 1))[0] == 201
    docs = render_overlay(tmp_path / "overlay", namespace=CB_NS, model=CB_MODEL,
                          components=("capacity-buffer", "model-name"))
    env = find(docs, "Deployment", "inference-autoscaler")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "AUTOSCALER_WARM_POOL__BACKEND", "value": "capacity-buffer"} in env
    for doc in docs:
        path = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=doc["metadata"].get("namespace", CB_NS))
        status, body = cluster.request("POST", path + "?fieldValidation=Strict", doc)
        assert status == 201 or (status == 409 and doc["kind"] == "PriorityClass"), body.get("message")
    kubeconfig = service_account_kubeconfig(cluster, CB_NS, "sa-cb")

    async def go():
        kube = await Kube.connect(kubeconfig)
        try:
            pool = CapacityBufferPool(kube, namespace=CB_NS, name=f"{CB_MODEL}-warm-pool", target_kind="Deployment",
                                      target=CB_MODEL, max_slots=3)
            await pool.ensure(None, 2)
            await pool.ensure(None, 1)
            return await pool.ready()
        finally:
            await kube.close()

    assert asyncio.run(go()) == 0  # no provisioner here to report room
    buffers = f"/apis/{BUFFER_GROUP}/{BUFFER_VERSION}/namespaces/{{ns}}/{BUFFER_PLURAL}"
    status, buffer = cluster.request("GET", buffers.format(ns=CB_NS) + f"/{CB_MODEL}-warm-pool")
    assert status == 200 and buffer["spec"]["replicas"] == 1, buffer
    assert buffer["spec"]["scalableRef"] == {"apiGroup": "apps", "kind": "Deployment", "name": CB_MODEL}
    assert impersonated(cluster, "DELETE", buffers.format(ns=CB_NS) + f"/{CB_MODEL}-warm-pool", ns=CB_NS) == 403
    assert impersonated(cluster, "GET", buffers.format(ns=NS), ns=CB_NS) == 403
