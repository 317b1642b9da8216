"""KEDA mode end to end: KEDA's own operator and metrics adapter (built from its Go module) on the test control
plane, the shipped ScaledObject (deploy/keda, rendered with kustomize), the HPA that KEDA creates, and our gRPC
external scaler serving the controller's decisions. The Deployment's replicas must equal each decision. With
the keda-tls component, KEDA reaches the scaler over mutual TLS with the Secrets the component names."""

from __future__ import annotations

import base64
import copy
import threading
import time
from pathlib import Path

import pytest

from autoscaler.board import DecisionBoard, Published
from autoscaler.config import ScalerTLS
from autoscaler.external_scaler.server import start as start_scaler
from autoscaler.external_scaler.tls import server_credentials
from loadtest.certs import authority, issue
from loadtest.kube.controlplane import control_plane, gpu_node, model_deployment
from loadtest.kube.keda import keda
from loadtest.realservers import free_port
from policies import Decision

from helpers import render
from loopthread import LoopThread
from overlays import find, render_overlay

HPA_SYNC_S = 2.0
METRIC = "desired-replicas"


@pytest.fixture(scope="module")
def cluster():
    with control_plane(with_pods=True, hpa_sync_s=HPA_SYNC_S) as cp, keda(cp):
        cp.apply(gpu_node("gpu-0", gpus=64))
        yield cp


@pytest.fixture(scope="module")
def loop():
    thread = LoopThread()
    yield thread
    thread.close()


class Scaler:
    """The product's external scaler for one ScaledObject, in this process: publish() is the controller
    deciding, stop() is the controller gone (its port closed), withdraw() a controller up without a decision."""

    def __init__(self, loop: LoopThread, namespace: str, name: str) -> None:
        self.loop, self.namespace, self.name = loop, namespace, name
        self.tls: ScalerTLS | None = None  # plaintext unless set before start()
        self.board = DecisionBoard()
        self.port = free_port()
        self.server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = self.loop.run(start_scaler(self.board, host="127.0.0.1", port=self.port,
                                                 namespace=self.namespace, scaled_object=self.name,
                                                 metric_name=METRIC, credentials=self.credentials()))

    def credentials(self):
        return server_credentials(self.tls) if self.tls is not None else None

    def stop(self) -> None:
        if self.server is not None:
            self.loop.run(self.server.stop(None))
            self.server = None

    def publish(self, replicas: int) -> None:
        self.loop.run(self.board.publish(Published(Decision(replicas=replicas), 0, None, time.time())))

    def withdraw(self) -> None:
        async def clear():
            self.board.latest = None
        self.loop.run(clear())


class Watch:
    """The Deployment, KEDA's HPA and the ScaledObject, read every 0.2 s in a thread."""

    def __init__(self, cp, namespace: str, name: str) -> None:
        self.cp, self.ns, self.name = cp, namespace, name
        self.state: dict = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read(self) -> dict:
        state: dict = {}
        status, dep = self.cp.request("GET", f"/apis/apps/v1/namespaces/{self.ns}/deployments/{self.name}")
        if status == 200:
            state["replicas"] = dep["spec"].get("replicas")
            state["ready"] = dep.get("status", {}).get("readyReplicas", 0)
        status, hpa = self.cp.request(
            "GET", f"/apis/autoscaling/v2/namespaces/{self.ns}/horizontalpodautoscalers/keda-hpa-{self.name}")
        if status == 200:
            state["hpa"] = hpa
            conditions = {c["type"]: c for c in hpa.get("status", {}).get("conditions", [])}
            active = conditions.get("ScalingActive")
            state["scaling_active"] = f"{active['status']}/{active['reason']}" if active else None
            state["hpa_min"] = hpa["spec"].get("minReplicas")
        status, so = self.cp.request("GET", f"/apis/keda.sh/v1alpha1/namespaces/{self.ns}/scaledobjects/{self.name}")
        if status == 200:
            conditions = {c["type"]: c.get("status") for c in so.get("status", {}).get("conditions", [])}
            state["fallback"] = conditions.get("Fallback")
            state["active"] = conditions.get("Active")
        return state

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                new = self._read()
            except OSError:
                new = None
            if new is not None:
                with self.lock:
                    self.state = new
            time.sleep(0.2)

    def get(self, key: str):
        with self.lock:
            return self.state.get(key)

    def wait(self, predicate, timeout_s: float) -> float | None:
        """Seconds until predicate(state) holds; None if it did not within timeout_s."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            with self.lock:
                state = dict(self.state)
            if predicate(state):
                return time.monotonic() - start
            time.sleep(0.05)
        return None

    def holds(self, predicate, for_s: float) -> bool:
        end = time.monotonic() + for_s
        while time.monotonic() < end:
            with self.lock:
                state = dict(self.state)
            if not predicate(state):
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(2)


def shipped_scaled_object(namespace: str, name: str, address: str, rendered: dict | None = None) -> dict:
    """deploy/keda as rendered (or `rendered`, from an overlay), pointed at this namespace's Deployment and
    scaler."""
    doc = copy.deepcopy(rendered or render("keda")[0])
    doc["metadata"].update(name=name, namespace=namespace)
    doc["spec"]["scaleTargetRef"]["name"] = name
    doc["spec"]["triggers"][0]["metadata"]["scalerAddress"] = address
    doc["spec"]["maxReplicaCount"] = 64  # at least the controller's own max_replicas
    return doc


def secret(namespace: str, name: str, files: dict[str, Path]) -> dict:
    data = {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "data": data}


def keda_tls(cluster, namespace: str, address: str, folder: Path) -> tuple[ScalerTLS, dict]:
    """The keda-tls component as a user deploys it: one CA, a server certificate for the scaler's address and
    a client certificate for KEDA, in the two Secrets it names. Returns the scaler's TLS settings (the
    Deployment's environment, its paths read where the Secret is "mounted") and the ScaledObject."""
    docs = render_overlay(folder / "overlay", namespace=namespace, model="llama", resources=("base", "keda"),
                          components=("model-name", "keda-tls"))
    ca = authority(folder / "ca", subject="/CN=scaler-ca")
    server = issue(ca, folder / "server", subject="/CN=inference-autoscaler", names=["IP:127.0.0.1"])
    client = issue(ca, folder / "client", subject="/CN=keda-operator", names=["DNS:keda-operator.keda.svc"])
    pod = find(docs, "Deployment", "inference-autoscaler")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    mounted = folder / "mounted"  # what the kubelet would mount: the server's Secret, one file per key
    mounted.mkdir()
    server_files = {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca.cert}
    for key, path in server_files.items():
        (mounted / key).write_bytes(path.read_bytes())
    prefix = "AUTOSCALER_KEDA__TLS__"
    env = {e["name"].removeprefix(prefix).lower(): e["value"].replace(mount["mountPath"], str(mounted))
           for e in pod["containers"][0]["env"] if e["name"].startswith("AUTOSCALER_KEDA__TLS__")}
    auth = find(docs, "TriggerAuthentication")
    [client_secret] = {r["name"] for r in auth["spec"]["secretTargetRef"]}
    cluster.apply(secret(namespace, volume["secret"]["secretName"], server_files))
    cluster.apply(secret(namespace, client_secret, {"tls.crt": client.cert, "tls.key": client.key, "ca.crt": ca.cert}))
    cluster.apply(auth)
    return ScalerTLS(**env), shipped_scaled_object(namespace, "llama", address, find(docs, "ScaledObject"))


@pytest.fixture()
def model(cluster, loop, tmp_path):
    """A namespace with a model Deployment at `first` replicas and its scaler, serving that decision; over
    mutual TLS with the keda-tls component when `tls`."""
    made = []

    def make(first: int, edit=lambda doc: None, *, tls: bool = False):
        ns = f"keda-{len(made)}-{int(time.time() * 1000) % 100000}"
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        cluster.apply(model_deployment(ns, "llama", first))
        scaler = Scaler(loop, ns, "llama")
        doc = shipped_scaled_object(ns, "llama", scaler.address)
        if tls:
            scaler.tls, doc = keda_tls(cluster, ns, scaler.address, tmp_path / ns)
        scaler.publish(first)
        scaler.start()
        watch = Watch(cluster, ns, "llama")
        made.append((ns, scaler, watch))
        assert watch.wait(lambda s: s.get("ready") == first, 60) is not None
        edit(doc)
        cluster.apply(doc)
        assert watch.wait(lambda s: (s.get("scaling_active") or "").startswith("True"), 60) is not None, \
            watch.state.get("scaling_active")
        return scaler, watch

    yield make
    for ns, scaler, watch in made:
        watch.close()
        cluster.request("DELETE", f"/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/llama")
        time.sleep(0.5)
        scaler.stop()
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def step(scaler: Scaler, watch: Watch, replicas: int, *, expect: int | None = None, timeout_s: float) -> float | None:
    """Publish a decision; seconds until the Deployment's replicas equal `expect` (default: the decision)."""
    expect = replicas if expect is None else expect
    scaler.publish(replicas)
    return watch.wait(lambda s: s.get("replicas") == expect, timeout_s)


def test_the_shipped_scaled_object_has_no_dead_band():
    [doc] = render("keda")
    behavior = doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for direction in ("scaleUp", "scaleDown"):
        assert str(behavior[direction]["tolerance"]) == "0"
        assert behavior[direction]["stabilizationWindowSeconds"] == 0
    assert doc["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher"  # a fallback never scales down


def test_replicas_follow_every_decision_within_one_hpa_sync_including_one_replica_at_40(model):
    scaler, watch = model(1)
    hpa = watch.get("hpa")["spec"]["behavior"]
    assert hpa["scaleUp"]["tolerance"] == "0" and hpa["scaleDown"]["tolerance"] == "0"  # passed through to the HPA
    assert step(scaler, watch, 40, timeout_s=30) is not None
    assert watch.wait(lambda s: s.get("ready") == 40, 60) is not None
    took = {}
    for n in (41, 40, 39, 40, 42, 38):
        took[n] = step(scaler, watch, n, timeout_s=5 * HPA_SYNC_S)
        assert took[n] is not None, f"decision {n} not applied within {5 * HPA_SYNC_S:g} s: {watch.state}"
        assert watch.holds(lambda s, n=n: s.get("replicas") == n, HPA_SYNC_S), f"{n} did not hold"
    print("seconds from decision to Deployment replicas:", {n: round(t, 2) for n, t in took.items()})
    # Each change lands on the HPA's next sync: at most one sync period, plus the metric read (adapter ->
    # operator -> scaler) and the write of the Deployment's scale.
    assert max(took.values()) <= HPA_SYNC_S + 1.0


def test_without_the_tolerance_the_hpa_drops_a_change_of_one_at_40(model):
    """Why the shipped ScaledObject sets tolerance 0: the HPA's default 10 % band swallows 41 at 40."""

    def default_tolerance(doc):
        for direction in ("scaleUp", "scaleDown"):
            del doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][direction]["tolerance"]

    scaler, watch = model(40, default_tolerance)
    assert step(scaler, watch, 41, expect=41, timeout_s=4 * HPA_SYNC_S) is None
    assert watch.get("replicas") == 40
    assert step(scaler, watch, 46, timeout_s=5 * HPA_SYNC_S) is not None  # a larger change goes through


def test_controller_gone_holds_the_replicas_and_no_decision_falls_back_without_scaling_down(model):
    scaler, watch = model(10)
    # The controller dies: KEDA cannot reach the scaler. KEDA 2.21 does not count that towards fallback
    # (kedacore/keda#8056); the HPA keeps the running replicas, it never scales down.
    scaler.stop()
    assert watch.wait(lambda s: (s.get("scaling_active") or "").startswith("False"), 30) is not None
    assert watch.holds(lambda s: s.get("replicas") == 10, 6 * HPA_SYNC_S)
    # It comes back with a new decision: followed again.
    scaler.publish(14)
    scaler.start()
    assert watch.wait(lambda s: s.get("replicas") == 14, 30) is not None
    # Up but without a decision (GetMetrics UNAVAILABLE): after failureThreshold reads KEDA falls back, with
    # currentReplicasIfHigher: max(running, fallback.replicas) = 14, no scale-down.
    scaler.withdraw()
    assert watch.wait(lambda s: s.get("fallback") == "True", 60) is not None, watch.state
    assert watch.holds(lambda s: s.get("replicas") == 14, 3 * HPA_SYNC_S)
    scaler.publish(12)
    assert watch.wait(lambda s: s.get("fallback") == "False" and s.get("replicas") == 12, 30) is not None


def test_decision_zero_scales_to_zero_and_a_decision_wakes_it(model):
    def to_zero(doc):
        doc["spec"].update(minReplicaCount=0, pollingInterval=1, cooldownPeriod=4)

    scaler, watch = model(3, to_zero)
    scaler.publish(0)  # IsActive false
    assert watch.wait(lambda s: s.get("active") == "False", 20) is not None
    assert watch.wait(lambda s: s.get("replicas") == 0, 30) is not None  # after the cooldown
    assert watch.holds(lambda s: s.get("replicas") == 0, 3)
    scaler.publish(5)  # active again: KEDA wakes the Deployment, the HPA takes it to the decision
    assert watch.wait(lambda s: s.get("replicas") == 5, 30) is not None
    assert watch.wait(lambda s: s.get("ready") == 5, 30) is not None


def test_keda_follows_decisions_over_mutual_tls_with_the_shipped_component(model):
    """The scaler requires a client certificate from its CA: KEDA gets answers only through the component's
    TriggerAuthentication (caCert, tlsClientCert, tlsClientKey from the client Secret)."""
    scaler, watch = model(2, tls=True)
    assert scaler.tls is not None and scaler.tls.client_ca_file is not None
    assert step(scaler, watch, 5, timeout_s=30) is not None
