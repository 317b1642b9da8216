"""`autoscaler run` as real processes: two controllers share one Lease, SIGTERM hands over; Prometheus
dying mid-run holds the scale and is counted, and its return is picked up."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from loadtest.kube.controlplane import model_deployment
from servers import fake_model_server, free_port, post_json, prometheus, stop, wait_http


def metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def wait_until(predicate, timeout_s=30.0, step_s=0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    return predicate()


@pytest.fixture()
def target(cluster):
    ns = f"proc-{int(time.time() * 1000) % 1000000}"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                           model_deployment(ns, "model", 6))[0] == 201
    yield ns
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def start_controller(tmp_path, name, ns, prom_url, kubeconfig):
    http = free_port()
    config = {
        "target": {"namespace": ns, "name": "model"}, "mode": "actuate", "http_port": http,
        "prometheus": {"url": prom_url, "selector": 'namespace="llm"', "timeout_s": 0.5},
        "policy": {"tick_s": 1.0, "max_replicas": 12, "replica_concurrency": 4, "forecast_bucket_s": 60.0},
        "warm_pool": {"enabled": False}, "admission": {"port": free_port()},
        "leader_election": {"lease_duration_s": 4.0, "renew_deadline_s": 3.0, "retry_period_s": 0.5},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "autoscaler", "run", "--config", str(path),
                             "--kubeconfig", kubeconfig], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "POD_NAME": name})
    wait_http(f"http://127.0.0.1:{http}/healthz", proc=proc)
    return proc, http


def test_two_controllers_one_leader_and_sigterm_hands_over(cluster, target, tmp_path):
    with fake_model_server() as model, prometheus([model.removeprefix("http://")]) as prom:
        post_json(f"{model}/admin/state", {"waiting": 0, "running": 20})
        a, a_port = start_controller(tmp_path, "ctrl-a", target, prom, cluster.kubeconfig)
        b, b_port = start_controller(tmp_path, "ctrl-b", target, prom, cluster.kubeconfig)
        try:
            leaders = wait_until(lambda: (metric(a_port, "autoscaler_is_leader"),
                                          metric(b_port, "autoscaler_is_leader"))
                                 if {metric(a_port, "autoscaler_is_leader"), metric(b_port, "autoscaler_is_leader")}
                                 == {0.0, 1.0} else None)
            assert leaders and sorted(leaders) == [0.0, 1.0]
            leader, leader_port, follower_port = (a, a_port, b_port) if leaders[0] == 1.0 else (b, b_port, a_port)
            leader.send_signal(signal.SIGTERM)
            assert leader.wait(timeout=20) == 0  # graceful: finishes its tick, releases the Lease, exits 0
            assert wait_until(lambda: metric(follower_port, "autoscaler_is_leader") == 1.0, timeout_s=15)
        finally:
            for proc in (a, b):
                stop(proc)
    logs = (tmp_path / "ctrl-a.log").read_text() + (tmp_path / "ctrl-b.log").read_text()
    assert '"event": "stopped"' in logs and '"event": "decision"' in logs


def test_prometheus_dying_holds_the_scale_and_recovers(cluster, target, tmp_path):
    port = free_port()
    with fake_model_server() as model:
        post_json(f"{model}/admin/state", {"waiting": 0, "running": 1})  # little demand: wants fewer than 6
        first = prometheus([model.removeprefix("http://")], port=port)
        prom = first.__enter__()
        proc, http = start_controller(tmp_path, "ctrl", target, prom, cluster.kubeconfig)
        try:
            assert wait_until(lambda: metric(http, "autoscaler_decision_valid") == 1.0)
            first.__exit__(None, None, None)  # Prometheus dies
            errors = wait_until(lambda: (metric(http, "autoscaler_errors_total") or 0) >= 5, timeout_s=20)
            assert errors
            assert metric(http, "autoscaler_decision_valid") == 0.0
            replicas = cluster.request("GET", f"/apis/apps/v1/namespaces/{target}/deployments/model")[1]
            assert replicas["spec"]["replicas"] == 6  # held: a fresh controller never scales down blind
            assert proc.poll() is None  # no crash
            with prometheus([model.removeprefix("http://")], port=port):
                assert wait_until(lambda: metric(http, "autoscaler_decision_valid") == 1.0, timeout_s=30)
        finally:
            stop(proc)
    log = (tmp_path / "ctrl.log").read_text()
    assert re.search(r'"kind": "prometheus_unavailable"', log)
