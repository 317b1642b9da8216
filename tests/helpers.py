"""Small builders of signals for the tests."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import yaml

from autoscaler.kube.client import Kube
from policies import ClusterState, Sample, Signals

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_TRACE = ROOT / "loadtest" / "traces" / "azure-llm-2023-code" / "AzureLLMInferenceTrace_code.csv"


def signals(
    now: float,
    *,
    rate: float | None = 10.0,
    queue: float | None = 0.0,
    in_flight: float | None = None,
    p99: float | None = None,
    headroom: float | None = None,
    service: float | None = 1.0,
    spec_replicas: int = 4,
    ready: int | None = None,
    warm: int = 0,
    startups: tuple[float, ...] = (),
    node_waits: tuple[tuple[str, float], ...] = (),
    by_priority: dict | None = None,
    age: float = 0.0,
) -> Signals:
    at = now - age

    def s(v):
        return None if v is None else Sample(v, at)

    return Signals(
        cluster=ClusterState(
            spec_replicas=spec_replicas,
            ready_replicas=spec_replicas if ready is None else ready,
            starting_replicas=spec_replicas - (spec_replicas if ready is None else ready),
            warm_slots_ready=warm,
            startup_durations_s=startups,
            node_waits_s=node_waits,
            at_s=now,
        ),
        queue_depth=s(queue),
        in_flight=s(in_flight if in_flight is not None else (rate * service if rate and service else 0.0)),
        p99_latency_s=s(p99),
        gpu_memory_headroom_ratio=s(headroom),
        arrival_rate_per_s=s(rate),
        service_time_s=s(service),
        arrival_rate_by_priority=by_priority or {},
    )




def render(overlay) -> list[dict]:
    """An overlay of deploy/ by name, or any kustomization directory by path, rendered with kustomize."""
    from loadtest.kube.controlplane import binaries

    out = subprocess.run([str(binaries() / "kustomize"), "build", str(ROOT / "deploy" / overlay)],
                         check=True, capture_output=True, text=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def with_kube(cp, fn):
    """Run `fn(kube)` with a client of the control plane `cp` (its admin kubeconfig), and close it."""
    async def go():
        kube = await Kube.connect(cp.kubeconfig)
        try:
            return await fn(kube)
        finally:
            await kube.close()

    return asyncio.run(go())


def tell_no_capacity(cp, ns: str, pod: dict) -> None:
    """Post the Event Karpenter posts when a NodePool's limit keeps it from placing `pod` (its metadata)."""
    import time

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = {"metadata": {"name": f"{pod['name']}.karpenter", "namespace": ns},
             "involvedObject": {"kind": "Pod", "name": pod["name"], "namespace": ns, "uid": pod["uid"]},
             "reason": "FailedScheduling", "type": "Warning", "source": {"component": "karpenter"},
             "message": "Failed to schedule pod, all available instance types exceed limits for nodepool",
             "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    assert cp.request("POST", f"/api/v1/namespaces/{ns}/events", event)[0] == 201


def endpoint_serving(decision, reading: list):
    """(clock, admission): an admission endpoint at its clock seam, its board holding `decision` with 4 Ready
    replicas, its live queue whatever `reading[0]` holds when asked."""
    from autoscaler.admission import Admission
    from autoscaler.board import DecisionBoard, Published
    from autoscaler.clock import ManualClock
    from policies import PRIORITY_CLASSES

    clock = ManualClock(100.0)
    board = DecisionBoard(clock=clock)
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="h", default_class="standard",
                          retry_after_s=5, clock=clock, live_queue=lambda: reading[0])
    asyncio.run(board.publish(Published(decision, 4, 0.0, clock.now(), ready_replicas=4)))
    return clock, admission


def pod_at_localhost(cp, ns: str, attempts: int = 60) -> dict:
    """The first pod of namespace `ns` once Running (kwok), its IP set to 127.0.0.1 (where a test's fake model
    server listens), as the apiserver returns it."""
    import time

    pod = None
    for _ in range(attempts):
        pods = cp.request("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"]
        if pods and pods[0]["status"].get("phase") == "Running":
            pod = pods[0]
            break
        time.sleep(0.5)
    assert pod is not None, f"no pod Running in {ns}"
    status = cp.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status",
                        {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})[0]
    assert status == 200
    return pod
