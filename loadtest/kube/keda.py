"""KEDA for the test control plane: its CRDs, operator and metrics adapter as plain processes on loopback.

The binaries and CRDs come from `build.sh` (KEDA built from its Go module). The wiring a cluster does with
Services and cert-manager is done here by hand:
- one CA and key pair (openssl) in the layout KEDA reads from `--cert-dir`: the operator's gRPC metrics
  service and the adapter's client of it do mutual TLS with it, and the adapter serves the aggregated API
  with it (the aggregator verifies it against the APIService's caBundle, for `<service>.<namespace>.svc`).
  KEDA's own cert rotation is off: it writes a Secret and exits, for the kubelet to mount; no kubelet here.
- the adapter is registered as `v1beta1.external.metrics.k8s.io` through a Service of type ExternalName
  (`localhost`): Endpoints may not hold loopback addresses, but the aggregator resolves an ExternalName
  Service to that host and the APIService's port (`--enable-aggregator-routing` must stay off for that).
- the apiserver's aggregation-layer flags (request-header CA, proxy client certificate) are set by
  `controlplane.control_plane`; the HPA controller runs in its kube-controller-manager.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.certs import authority, issue
from loadtest.kube.controlplane import ControlPlane
from loadtest.realservers import free_port, stop, wait_http

NAMESPACE = "keda"
OPERATOR_SERVICE = "keda-operator"  # the names KEDA's own certificates carry
ADAPTER_SERVICE = "keda-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"


@dataclass
class Keda:
    operator: subprocess.Popen
    adapter: subprocess.Popen
    grpc_address: str
    adapter_port: int
    cert_dir: Path


def certificates(directory: Path) -> Path:
    """ca.crt, tls.crt and tls.key: one pair for serverAuth and clientAuth, valid for the in-cluster names
    and for loopback."""
    services = (OPERATOR_SERVICE, ADAPTER_SERVICE)
    names = ([f"DNS:{s}.{NAMESPACE}.svc" for s in services]
             + [f"DNS:{s}.{NAMESPACE}.svc.cluster.local" for s in services])
    names += ["DNS:localhost", "IP:127.0.0.1"]
    ca = authority(directory, subject="/O=KEDAORG/CN=KEDA")
    issue(ca, directory, subject=f"/CN={OPERATOR_SERVICE}", names=names)
    return directory


def api_service(cert_dir: Path, adapter_port: int) -> list[dict]:
    """The adapter as the external metrics API, behind an ExternalName Service."""
    service = {"name": ADAPTER_SERVICE, "namespace": NAMESPACE, "port": adapter_port}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"name": "https", "port": adapter_port}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
         "spec": {"service": service, "group": "external.metrics.k8s.io", "version": "v1beta1",
                  "caBundle": base64.b64encode((cert_dir / "ca.crt").read_bytes()).decode(),
                  "groupPriorityMinimum": 100, "versionPriority": 100}},
    ]


def _check_running(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            raise RuntimeError(f"{Path(proc.args[0]).name} exited with {proc.returncode} (see its log)")


def _wait_available(cp: ControlPlane, procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    condition = None
    while time.monotonic() < deadline:
        _check_running(procs)
        _, body = cp.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        conditions = {c["type"]: c for c in body.get("status", {}).get("conditions", [])}
        condition = conditions.get("Available")
        if condition and condition["status"] == "True":
            return
        time.sleep(0.25)
    raise TimeoutError(f"APIService {APISERVICE} not available: {condition}")


@contextlib.contextmanager
def keda(cp: ControlPlane, *, timeout_s: float = 90.0):
    """KEDA's CRDs, operator and metrics adapter, until the external metrics API is available."""
    if cp.bin_dir is None:
        raise ValueError("the control plane has no binary folder")
    logs = Path(cp.tmp) / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        crds = [doc["metadata"]["name"] for path in sorted((cp.bin_dir / "keda-crds").glob("*.yaml"))
                for doc in cp.apply_yaml(path.read_text())]
        cp.wait_established(crds)
        cert_dir = certificates(Path(cp.tmp) / "keda-certs")
        # WATCH_NAMESPACE must be set ("" = all); the cluster-object namespace is otherwise read from a pod's
        # service-account mount.
        env = {**os.environ, "KUBECONFIG": cp.kubeconfig, "WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE,
               "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE}
        probe_port, adapter_port = free_port(), free_port()
        grpc_address = f"127.0.0.1:{free_port()}"
        commands = {
            "keda-operator": [
                "--leader-elect=false", f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{probe_port}", f"--metrics-service-bind-address={grpc_address}",
                f"--cert-dir={cert_dir}", "--enable-cert-rotation=false", f"--ca-dir={cert_dir}/no-custom-ca",
                "--zap-encoder=console",
            ],
            "keda-adapter": [
                "--bind-address=127.0.0.1", f"--secure-port={adapter_port}", f"--cert-dir={cert_dir}",
                f"--tls-cert-file={cert_dir}/tls.crt", f"--tls-private-key-file={cert_dir}/tls.key",
                f"--lister-kubeconfig={cp.kubeconfig}", f"--authentication-kubeconfig={cp.kubeconfig}",
                f"--authorization-kubeconfig={cp.kubeconfig}", f"--metrics-service-address={grpc_address}",
                f"--port={free_port()}",  # its own /metrics, on every interface: never the default 8080
                "--zap-encoder=console",
            ],
        }
        for name, args in commands.items():
            with open(logs / f"{name}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [str(cp.bin_dir / name), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                    preexec_fn=(lambda: os.nice(cp.niceness)) if cp.niceness else None))
        wait_http(f"http://127.0.0.1:{probe_port}/readyz", timeout_s, proc=procs[0])
        for doc in api_service(cert_dir, adapter_port):
            cp.apply(doc)
        _wait_available(cp, procs, timeout_s)
        yield Keda(operator=procs[0], adapter=procs[1], grpc_address=grpc_address, adapter_port=adapter_port,
                   cert_dir=cert_dir)
    finally:
        for proc in reversed(procs):
            stop(proc)
