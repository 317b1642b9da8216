"""A real Kubernetes control plane for the integration tests (see tests/kube/build.sh).

etcd and kube-apiserver (RBAC, token auth, self-signed serving certificate) always; kube-controller-manager,
kube-scheduler and kwok (which plays the kubelet for fake GPU nodes) when pods have to be created,
scheduled and become Ready. Everything listens on 127.0.0.1 with free ports and is stopped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from servers import free_port, stop

ROOT = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "admin-token-for-tests"

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
      {{ YAML .capacity 1 }}
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
  next:
    statusTemplate: |
      {{ $now := Now }}
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
      - lastTransitionTime: {{ $now | Quote }}
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
    out = subprocess.run([str(ROOT / "tests" / "kube" / "build.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class ControlPlane:
    url: str
    ca_file: str
    token: str
    kubeconfig: str
    tmp: str

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


def _kubeconfig(url: str, ca_file: str, token: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority": ca_file}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    })


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
def control_plane(*, with_pods: bool = False):
    bin_dir = binaries()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="kubeenv-") as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()

        def start(name: str, args: list[str]) -> subprocess.Popen:
            log = open(logs / f"{name}.log", "w")
            proc = subprocess.Popen([str(bin_dir / name), *args], stdout=log, stderr=subprocess.STDOUT)
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
            Path(tmp, "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
            certs = Path(tmp) / "certs"
            start("kube-apiserver", [
                f"--etcd-servers=http://127.0.0.1:{client}", "--bind-address=127.0.0.1",
                f"--secure-port={secure}", f"--cert-dir={certs}", f"--token-auth-file={tmp}/tokens.csv",
                "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={tmp}/sa.key", f"--service-account-signing-key-file={tmp}/sa.key",
                "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition", "--advertise-address=127.0.0.1",
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
                    "--controllers=deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller",
                    "--concurrent-deployment-syncs=5", "--concurrent-replicaset-syncs=5",
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
                    f"--server-address=127.0.0.1:{free_port()}",
                ])
            yield ControlPlane(url=url, ca_file=ca_file, token=ADMIN_TOKEN, kubeconfig=str(admin), tmp=tmp)
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
