"""The whole controller (`autoscaler run`) against real Prometheus, a fake vLLM server and a real kube-apiserver."""

import asyncio
import time
import urllib.request

import pytest

from autoscaler.config import Settings
from autoscaler.runtime import run

from loadtest.kube.controlplane import model_deployment
from loopthread import LoopThread
from servers import fake_model_server, free_port, post_json, prometheus, wait_for_series


@pytest.fixture()
def stack(cluster):
    ns = f"e2e-{int(time.time() * 1000) % 1000000}"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                           model_deployment(ns, "model", 2, ready_delay="1s"))[0] == 201
    with fake_model_server() as model, prometheus([model.removeprefix("http://")]) as prom:
        yield cluster, ns, model, prom
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def settings_for(ns, prom, mode):
    return Settings(
        target={"namespace": ns, "name": "model"},
        mode=mode,
        http_port=free_port(),
        prometheus={"url": prom, "selector": 'namespace="llm"'},
        policy={"tick_s": 1.0, "min_replicas": 1, "max_replicas": 12, "replica_concurrency": 4,
                "forecast_bucket_s": 60.0, "default_startup_s": 5.0, "node_provisioning_s": 0.0,
                "scale_down_stabilization_s": 60.0, "burst_confirm_s": 0.0},
        warm_pool={"enabled": False},
        admission={"port": free_port()},
        leader_election={"lease_duration_s": 4.0, "renew_deadline_s": 3.0, "retry_period_s": 0.5},
    )


def start(thread, settings, kubeconfig):
    async def launch():
        stop = asyncio.Event()
        task = asyncio.create_task(run(settings, kubeconfig=kubeconfig, host="127.0.0.1", stop=stop))
        return stop, task

    return thread.run(launch())


def stop_and_wait(thread, stop, task):
    async def finish():
        stop.set()
        await asyncio.wait_for(task, 20)

    thread.run(finish(), timeout_s=30)


def spec_replicas(cluster, ns):
    return cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/model")[1]["spec"]["replicas"]


def busy(model, prom):
    post_json(f"{model}/admin/state", {"waiting": 40, "running": 16, "kv_usage": 0.9})
    for _ in range(3):
        post_json(f"{model}/admin/state", {"add_success": 40, "observe_inference_s": [1.0] * 40})
        time.sleep(1.0)
    wait_for_series(prom, 'sum(vllm:num_requests_waiting{namespace="llm"})', lambda v: v == 40)


def test_actuate_mode_scales_the_target_and_explains_it(stack):
    cluster, ns, model, prom = stack
    busy(model, prom)
    settings = settings_for(ns, prom, "actuate")
    thread = LoopThread()
    stop, task = start(thread, settings, cluster.kubeconfig)
    try:
        for _ in range(60):
            if spec_replicas(cluster, ns) > 2:
                break
            time.sleep(0.5)
        scaled = spec_replicas(cluster, ns)
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.http_port}/readyz", timeout=5) as r:
            ready = r.status
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.http_port}/metrics", timeout=5) as r:
            exposition = r.read().decode()
    finally:
        stop_and_wait(thread, stop, task)
        thread.close()
    assert scaled > 2
    assert ready == 200
    assert "autoscaler_decided_replicas" in exposition and "autoscaler_is_leader 1.0" in exposition
    events = cluster.request("GET", f"/api/v1/namespaces/{ns}/events")[1]["items"]
    ours = [e for e in events if e.get("reportingComponent") == "inference-autoscaler"]
    assert ours and "reactive" in ours[0]["message"]
    lease = cluster.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/model-autoscaler")[1]
    assert lease["spec"].get("holderIdentity") in (None, "")  # released on shutdown


def test_shadow_mode_decides_but_writes_nothing(stack):
    cluster, ns, model, prom = stack
    busy(model, prom)
    settings = settings_for(ns, prom, "shadow")
    thread = LoopThread()
    stop, task = start(thread, settings, cluster.kubeconfig)
    try:
        time.sleep(4.0)
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.http_port}/metrics", timeout=5) as r:
            exposition = r.read().decode()
    finally:
        stop_and_wait(thread, stop, task)
        thread.close()
    decided = [line for line in exposition.splitlines() if line.startswith("autoscaler_decided_replicas ")]
    assert decided and float(decided[0].split()[1]) > 2
    assert spec_replicas(cluster, ns) == 2
