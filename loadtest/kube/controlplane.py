"""A real Kubernetes control plane for the tests and the closed-loop scenarios (binaries: build.sh here).

etcd and kube-apiserver (RBAC, token auth, self-signed serving certificate, and the aggregation layer's
request-header CA and proxy client certificate, so an extension API server such as KEDA's metrics adapter
can be registered) always; kube-controller-manager (Deployments, ReplicaSets, garbage collection,
namespaces, the HPA), kube-scheduler and kwok (which plays the kubelet for fake GPU nodes) when pods have to
be created, scheduled and become Ready. kwok gives pods IPs from a loopback /16 (127.X.0.0/16, X drawn per
control plane, see `pod_cidr`), so a fake model server can listen on a pod's own IP. Everything listens on
loopback with free ports and is stopped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from loadtest.realservers import free_port, stop

ROOT = Path(__file__).resolve().parent.parent.parent
BUILD = Path(__file__).resolve().parent / "build.sh"
ADMIN_TOKEN = "admin-token-for-tests"


def pod_cidr() -> str:
    """Loopback addresses for one control plane's pods (a pod's IP is an address a fake server can listen
    on). Drawn per control plane: kwok numbers pods from the start of its range, so two control planes on one
    machine with the same range (two closed-loop runs at once) gave their pods the same IPs, and one run's
    fake servers could not bind while the other's held the addresses (or its probe read the other's).
    127.0-42.x are left out: 127.0.0.1 serves everything else, and 127.42.0.0/16 was every control plane's
    range before."""
    return f"127.{random.SystemRandom().randrange(43, 255)}.0.0/16"

KWOK_STAGES = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      conditions:
      - lastHeartbeatTime: {{ Now | Quote }}
        lastTransitionTime: {{ Now | Quote }}
        message: kubelet is posting ready status
        reason: KubeletReady
        status: "True"
        type: Ready
      {{ with .status }}
      allocatable:
      {{ with .allocatable }}{{ YAML . 1 }}{{ else }}{{ YAML $.status.capacity 1 }}{{ end }}
      capacity:
      {{ YAML .capacity 1 }}
      {{ end }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.spec.nodeName'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'NotIn'
      values: ['Running']
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["pod-ready.stage.kwok.x-k8s.io/delay"]'
    jitterDurationFrom:
      expressionFrom: '.metadata.annotations["pod-ready.stage.kwok.x-k8s.io/jitter-delay"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $scheduled := $now }}
      {{ range .status.conditions }}{{ if eq .type "PodScheduled" }}{{ $scheduled = .lastTransitionTime }}{{ end }}{{ end }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $scheduled | Quote }}
        status: "True"
        type: PodScheduled
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Running
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  delay:
    durationMilliseconds: 100
  next:
    delete: true
"""


def binaries() -> Path:
    """The folder of the cached binaries, building what is missing (minutes, once)."""
    out = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class ControlPlane:
    url: str
    ca_file: str
    token: str
    kubeconfig: str
    tmp: str
    bin_dir: Path | None = None
    niceness: int = 0

    def kubeconfig_for(self, token: str, name: str) -> str:
        path = Path(self.tmp) / f"kubeconfig-{name}"
        path.write_text(_kubeconfig(self.url, self.ca_file, token))
        return str(path)

    def request(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
        context = ssl.create_default_context(cafile=self.ca_file)
        data = json.dumps(body).encode() if body is not None else None
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {token or self.token}", "Content-Type": content_type},
        )
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def apply(self, document: dict, *, namespace: str | None = None) -> dict:
        """Create an object (any kind the apiserver knows), or replace it if it exists; returns it."""
        path = resource_path(self, document, namespace)
        status, body = self.request("POST", path, document)
        if status == 409:
            name = document["metadata"]["name"]
            status, current = self.request("GET", f"{path}/{name}")
            document = {**document, "metadata": {**document["metadata"],
                                                  "resourceVersion": current["metadata"]["resourceVersion"]}}
            status, body = self.request("PUT", f"{path}/{name}", document)
        if status >= 300:
            raise RuntimeError(f"apply {document.get('kind')} {document['metadata'].get('name')}: {status} {body}")
        return body

    def apply_yaml(self, text: str, *, namespace: str | None = None) -> list[dict]:
        return [self.apply(d, namespace=namespace) for d in yaml.safe_load_all(text) if d]

    def wait_established(self, crd_names: list[str], timeout_s: float = 30.0) -> None:
        """Until every named CRD is served."""
        deadline = time.monotonic() + timeout_s
        for name in crd_names:
            while True:
                status, crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                # a CRD just created may show `conditions: null` until the apiserver has looked at it
                conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                if status == 200 and conditions.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not established")
                time.sleep(0.1)


_PLURALS: dict[tuple[str, str], tuple[str, bool]] = {}


def resource_path(cp: ControlPlane, document: dict, namespace: str | None) -> str:
    """The collection path of a document's kind, from API discovery (cached)."""
    api_version, kind = document["apiVersion"], document["kind"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    key = (api_version, kind)
    if key not in _PLURALS:
        status, listing = cp.request("GET", base)
        if status != 200:
            raise RuntimeError(f"discovery of {api_version}: {status} {listing}")
        for resource in listing.get("resources", []):
            if resource["kind"] == kind and "/" not in resource["name"]:
                _PLURALS[key] = (resource["name"], resource["namespaced"])
        if key not in _PLURALS:
            raise RuntimeError(f"{api_version} has no kind {kind}")
    plural, namespaced = _PLURALS[key]
    ns = namespace or document["metadata"].get("namespace")
    if namespaced:
        if not ns:
            raise ValueError(f"{kind} {document['metadata'].get('name')} needs a namespace")
        return f"{base}/namespaces/{ns}/{plural}"
    return f"{base}/{plural}"


def _kubeconfig(url: str, ca_file: str, token: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority": ca_file}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    })


def _aggregation_certs(tmp: Path) -> list[str]:
    """A request-header CA and the client certificate the apiserver presents to extension API servers."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=front-proxy-ca",
            "-keyout", f"{tmp}/front-proxy-ca.key", "-out", f"{tmp}/front-proxy-ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=front-proxy-client",
            "-keyout", f"{tmp}/front-proxy-client.key", "-out", f"{tmp}/front-proxy-client.csr")
    openssl("x509", "-req", "-in", f"{tmp}/front-proxy-client.csr", "-CA", f"{tmp}/front-proxy-ca.crt",
            "-CAkey", f"{tmp}/front-proxy-ca.key", "-CAcreateserial", "-days", "2",
            "-out", f"{tmp}/front-proxy-client.crt")
    return [
        f"--requestheader-client-ca-file={tmp}/front-proxy-ca.crt", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        f"--proxy-client-cert-file={tmp}/front-proxy-client.crt",
        f"--proxy-client-key-file={tmp}/front-proxy-client.key",
    ]


def _wait_ready(url: str, ca_file: str | None, token: str, procs: list, timeout_s: float = 90.0) -> None:
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl._create_unverified_context()
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            request = urllib.request.Request(url + "/readyz", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, context=context, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise TimeoutError(f"kube-apiserver not ready: {last}")


@contextlib.contextmanager
def control_plane(*, with_pods: bool = False, hpa_sync_s: float = 15.0, niceness: int = 0):
    """`niceness`: run the components at this lower CPU priority (a time-compressed closed loop gives the CPU
    to the data path first: gateway, model servers, controller, load generator)."""
    bin_dir = binaries()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="kubeenv-") as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()

        def start(name: str, args: list[str]) -> subprocess.Popen:
            log = open(logs / f"{name}.log", "w")
            proc = subprocess.Popen([str(bin_dir / name), *args], stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=(lambda: os.nice(niceness)) if niceness else None)
            procs.append(proc)
            return proc

        try:
            client, peer, secure = free_port(), free_port(), free_port()
            start("etcd", [
                f"--data-dir={tmp}/etcd", f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}", "--unsafe-no-fsync=true",
                "--log-level=warn",
            ])
            subprocess.run(["openssl", "genrsa", "-out", f"{tmp}/sa.key", "2048"], check=True, capture_output=True)
            aggregation = _aggregation_certs(Path(tmp))
            Path(tmp, "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
            certs = Path(tmp) / "certs"
            start("kube-apiserver", [
                f"--etcd-servers=http://127.0.0.1:{client}", "--bind-address=127.0.0.1",
                f"--secure-port={secure}", f"--cert-dir={certs}", f"--token-auth-file={tmp}/tokens.csv",
                "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={tmp}/sa.key", f"--service-account-signing-key-file={tmp}/sa.key",
                "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition", "--advertise-address=127.0.0.1",
                *aggregation,
            ])
            url = f"https://127.0.0.1:{secure}"
            _wait_ready(url, None, ADMIN_TOKEN, procs)
            ca_file = str(certs / "apiserver.crt")
            admin = Path(tmp) / "kubeconfig"
            admin.write_text(_kubeconfig(url, ca_file, ADMIN_TOKEN))
            if with_pods:
                start("kube-controller-manager", [
                    f"--kubeconfig={admin}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                    "--leader-elect=false", f"--service-account-private-key-file={tmp}/sa.key",
                    "--controllers=deployment-controller,replicaset-controller,garbage-collector-controller,"
                    "namespace-controller,horizontal-pod-autoscaler-controller",
                    "--concurrent-deployment-syncs=5", "--concurrent-replicaset-syncs=5",
                    f"--horizontal-pod-autoscaler-sync-period={hpa_sync_s:g}s",
                ])
                start("kube-scheduler", [
                    f"--kubeconfig={admin}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                    "--leader-elect=false",
                ])
                stages = Path(tmp) / "stages.yaml"
                stages.write_text(KWOK_STAGES)
                start("kwok", [
                    f"--kubeconfig={admin}", f"--config={stages}", "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    f"--server-address=127.0.0.1:{free_port()}", f"--cidr={pod_cidr()}",
                ])
            yield ControlPlane(url=url, ca_file=ca_file, token=ADMIN_TOKEN, kubeconfig=str(admin), tmp=tmp,
                               bin_dir=bin_dir, niceness=niceness)
        finally:
            for proc in reversed(procs):
                stop(proc)
            keep = os.environ.get("KUBEENV_KEEP_LOGS")
            if keep:
                import shutil

                shutil.copytree(logs, keep, dirs_exist_ok=True)


def gpu_node(name: str, gpus: int = 8) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"type": "kwok", "nvidia.com/gpu.present": "true"}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
                   "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}},
    }


def model_deployment(namespace: str, name: str, replicas: int, *, ready_delay: str = "1s") -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"pod-ready.stage.kwok.x-k8s.io/delay": ready_delay}},
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{
                        "name": "vllm", "image": "vllm/vllm-openai:latest",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                    }],
                },
            },
        },
    }
