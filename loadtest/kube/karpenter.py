"""A real node provisioner for the test control plane: Karpenter's kwok provider.

Karpenter watches pending pods, picks an instance type from a NodePool's allowed ones, creates a NodeClaim
and, through its kwok cloud provider, a Node (after the KWOKNodeClass's `nodeRegistrationDelay`: the node
start-up time); kwok makes the node Ready and the scheduler places the pods. Empty nodes are removed by
consolidation after `consolidateAfter`. Nothing here creates nodes by hand.

The GPU node shapes are given to the provider as an instance-types file (its built-in list has no GPUs);
the NodePool allows only them, labels their nodes `inference-autoscaler/pool: gpu` and caps their GPUs
(`limits`). `CapacityBuffer` (SIG Autoscaling, `autoscaling.x-k8s.io/v1beta1`) is enabled by its feature gate.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from loadtest.kube.controlplane import ControlPlane
from loadtest.realservers import free_port, stop

POOL_LABEL = "inference-autoscaler/pool"
POOL = "gpu"
SYSTEM_NAMESPACE = "karpenter"


@dataclass(frozen=True)
class NodeShape:
    """One instance type: what a node offers, and its price per hour."""

    name: str
    gpus: int
    cpu: int
    memory_gi: int
    price_per_hour: float

    def instance_type(self) -> dict:
        return {
            "name": self.name, "architecture": "amd64", "operatingSystems": ["linux"],
            "resources": {"cpu": str(self.cpu), "memory": f"{self.memory_gi}Gi", "ephemeral-storage": "500Gi",
                          "pods": "110", "nvidia.com/gpu": str(self.gpus)},
            "offerings": [{"Price": self.price_per_hour, "Available": True, "Requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]}],
        }


ONE_GPU = NodeShape("gpu-1x", gpus=1, cpu=8, memory_gi=64, price_per_hour=2.5)
EIGHT_GPU = NodeShape("gpu-8x", gpus=8, cpu=64, memory_gi=512, price_per_hour=20.0)


def node_pool(shape: NodeShape, *, gpu_limit: int, consolidate_after_s: float) -> dict:
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": POOL},
        "spec": {
            "template": {
                "metadata": {"labels": {POOL_LABEL: POOL, "nvidia.com/gpu.present": "true"}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": POOL},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [shape.name]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    ],
                    "expireAfter": "Never",
                },
            },
            "limits": {"nvidia.com/gpu": str(gpu_limit)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": _duration(consolidate_after_s),
                           "budgets": [{"nodes": "100%"}]},
        },
    }


def node_class(node_start_s: float) -> dict:
    return {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": POOL},
            "spec": {"nodeRegistrationDelay": _duration(node_start_s)}}


def _duration(seconds: float) -> str:
    return f"{max(0, round(seconds))}s"  # the CRDs take whole units


@dataclass
class Karpenter:
    cp: ControlPlane
    shape: NodeShape
    proc: subprocess.Popen
    log: Path

    def set_gpu_limit(self, gpus: int) -> None:
        status, body = self.cp.request("PATCH", f"/apis/karpenter.sh/v1/nodepools/{POOL}",
                                       {"spec": {"limits": {"nvidia.com/gpu": str(gpus)}}})
        if status != 200:
            raise RuntimeError(f"NodePool limit: {status} {body}")

    def nodes(self) -> list[dict]:
        status, body = self.cp.request("GET", f"/api/v1/nodes?labelSelector={POOL_LABEL}%3D{POOL}")
        return body.get("items", []) if status == 200 else []


@contextlib.contextmanager
def karpenter(cp: ControlPlane, *, shape: NodeShape = ONE_GPU, gpu_limit: int = 64, node_start_s: float = 30.0,
              consolidate_after_s: float = 60.0, feature_gates: str = "CapacityBuffer=true"):
    """Karpenter's kwok provider running against `cp` (started with pods), with the GPU NodePool."""
    crds = sorted((cp.bin_dir / "karpenter-crds").glob("*.yaml"))
    names = []
    for path in crds:
        [crd] = cp.apply_yaml(path.read_text())
        names.append(crd["metadata"]["name"])
    cp.wait_established(names)
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}})
    cp.apply(node_class(node_start_s))
    cp.apply(node_pool(shape, gpu_limit=gpu_limit, consolidate_after_s=consolidate_after_s))
    tmp = Path(cp.tmp)
    types = tmp / "instance-types.json"
    types.write_text(json.dumps([shape.instance_type()]))
    log = tmp / "logs" / "karpenter.log"
    env = {
        **os.environ, "KUBECONFIG": cp.kubeconfig, "SYSTEM_NAMESPACE": SYSTEM_NAMESPACE,
        "DISABLE_LEADER_ELECTION": "true", "FEATURE_GATES": feature_gates, "INSTANCE_TYPES_FILE_PATH": str(types),
        "METRICS_PORT": str(free_port()), "HEALTH_PROBE_PORT": str(free_port()), "LOG_LEVEL": "info",
        "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "3s",
    }
    with log.open("w") as sink:
        proc = subprocess.Popen([str(cp.bin_dir / "karpenter-kwok")], stdout=sink, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=(lambda: os.nice(cp.niceness)) if cp.niceness else None)
    try:
        yield Karpenter(cp, shape, proc, log)
    finally:
        stop(proc)
