"""The Grafana dashboard in deploy/dashboards: every panel's query, evaluated by a real Prometheus scraping a
running controller (shadow mode, real kube-apiserver, a fake vLLM server), returns series. A query naming a
metric the controller does not export, or a label it does not carry, returns nothing and fails here."""

import json
import time
import urllib.request

from autoscaler.config import Settings

from helpers import ROOT
from loadtest.kube.controlplane import model_deployment
from loopthread import LoopThread
from servers import fake_model_server, free_port, post_json, prometheus, query, wait_for_series
from test_controller import start, stop_and_wait

DASHBOARD = ROOT / "deploy" / "dashboards" / "inference-autoscaler.json"


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expression) with Grafana's variables replaced: every namespace, a one-minute window."""
    doc = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"].replace("$namespace", ".*").replace("$__rate_interval", "1m"))
            for panel in doc["panels"] for target in panel["targets"]]


def test_the_dashboard_is_grafana_json_with_a_query_per_panel():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["panels"] and all(panel["targets"] for panel in doc["panels"])
    titles = " ".join(p["title"].lower() for p in doc["panels"])
    for topic in ("decided vs ready", "warm slots", "shed", "lead time", "freshness", "errors by kind"):
        assert topic in titles


def test_every_panel_query_answers_from_a_running_controller(cluster):
    ns = f"dash-{int(time.time() * 1000) % 1000000}"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                           model_deployment(ns, "model", 2, ready_delay="1s"))[0] == 201
    http_port, admission_port = free_port(), free_port()
    with fake_model_server() as model, prometheus([model.removeprefix("http://"), f"127.0.0.1:{http_port}"]) as prom:
        post_json(f"{model}/admin/state", {"waiting": 2, "running": 8, "kv_usage": 0.5})
        settings = Settings(
            target={"namespace": ns, "name": "model"}, mode="shadow", http_port=http_port,
            prometheus={"url": prom, "selector": 'namespace="llm"'},
            policy={"tick_s": 1.0, "replica_concurrency": 4, "forecast_bucket_s": 2.0,
                    "rate_window_s": 2.0},  # the forecast learns from two seconds after the first request
            warm_pool={"enabled": False}, admission={"port": admission_port},
        )
        thread = LoopThread()
        stop, task = start(thread, settings, cluster.kubeconfig)
        try:
            wait_for_series(prom, "autoscaler_decided_replicas", timeout_s=60)
            for _ in range(10):  # traffic (a forecast needs arrivals) and admission answers, scraped apart
                post_json(f"{model}/admin/state", {"add_success": 10, "observe_inference_s": [1.0] * 10})
                request = urllib.request.Request(f"http://127.0.0.1:{admission_port}/auth_request",
                                                 headers={"x-request-priority": "critical"})
                urllib.request.urlopen(request, timeout=5).read()
                time.sleep(1.0)
            wait_for_series(prom, "autoscaler_forecast_requests_per_second", timeout_s=30)
            empty = [(title, expr) for title, expr in panel_queries() if not query(prom, expr)]
        finally:
            stop_and_wait(thread, stop, task)
            cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
    assert not empty, empty
