"""Direct /metrics scraping of model pods: real fake vLLM servers, pods discovered on a real apiserver."""

import asyncio
import time

import aiohttp

from autoscaler.kube.client import Kube
from autoscaler.presets import SCRAPE
from autoscaler.signals.scrape import KubePodEndpoints, ScrapeSource
from policies import PolicySpec, Signals
from policies.stages.sanitize import sanitize

from loadtest.kube.controlplane import model_deployment
from helpers import pod_at_localhost
from servers import fake_model_server, free_port, post_json


class Static:
    def __init__(self, pods):
        self.pods = pods

    async def endpoints(self):
        return dict(self.pods)


def collect_ticks(source_factory, steps):
    """steps: list of callables run before each collect; returns the QueryResults."""

    async def go():
        async with aiohttp.ClientSession() as session:
            source = source_factory(session)
            out = []
            for step in steps:
                step(source)
                out.append(await source.collect(time.time()))
            return out

    return asyncio.run(go())


def test_two_pods_are_combined_and_counters_follow_churn_and_restarts():
    with fake_model_server() as a, fake_model_server() as b:
        post_json(f"{a}/admin/state", {"waiting": 3, "running": 10, "kv_usage": 0.2, "add_success": 100})
        post_json(f"{b}/admin/state", {"waiting": 5, "running": 6, "kv_usage": 0.6, "add_success": 500})
        endpoints = Static({"a": f"{a}/metrics"})

        def first(source):
            pass

        def add_b_and_traffic(source):
            endpoints.pods["b"] = f"{b}/metrics"
            post_json(f"{a}/admin/state", {"add_success": 10, "observe_inference_s": [2.0] * 10})

        def more_traffic(source):
            post_json(f"{a}/admin/state", {"add_success": 20, "observe_inference_s": [1.0] * 20})
            post_json(f"{b}/admin/state", {"add_success": 30, "observe_inference_s": [1.0] * 30})

        results = collect_ticks(lambda s: ScrapeSource(s, endpoints, SCRAPE["vllm"], timeout_s=2.0),
                                [first, add_b_and_traffic, more_traffic])
    one, two, three = (r.samples for r in results)
    assert one["queue_depth"].value == 3 and one["in_flight"].value == 10 and one["arrivals_total"].value == 0
    assert two["queue_depth"].value == 8 and two["in_flight"].value == 16
    assert two["gpu_memory_headroom_ratio"].value == 1 - (0.2 + 0.6) / 2
    assert two["arrivals_total"].value == 10  # b's 500 earlier requests are not demand now
    assert three["arrivals_total"].value == 60
    assert three["service_time_s"].value == 1.0  # only the new observations: (20 + 30) x 1 s / 50


def test_a_failed_pod_withholds_the_sums_and_a_restart_is_a_reset():
    spec = PolicySpec()
    with fake_model_server() as a:
        dead = f"http://127.0.0.1:{free_port()}/metrics"
        endpoints = Static({"a": f"{a}/metrics"})
        post_json(f"{a}/admin/state", {"waiting": 4, "add_success": 100})

        def grow(source):
            post_json(f"{a}/admin/state", {"add_success": 50})

        def lose_one(source):
            endpoints.pods["dead"] = dead

        results = collect_ticks(lambda s: ScrapeSource(s, endpoints, SCRAPE["vllm"], timeout_s=1.0),
                                [lambda s: None, grow, lose_one])
    assert results[1].samples["arrivals_total"].value == 50
    assert results[2].samples == {} and results[2].errors["pod dead"].kind == "scrape_failed"

    # a restarted pod (a new process behind the same name) counts from zero: reported as a reset
    with fake_model_server() as first_life:
        endpoints = Static({"a": f"{first_life}/metrics"})
        post_json(f"{first_life}/admin/state", {"add_success": 100})

        async def go():
            async with aiohttp.ClientSession() as session:
                source = ScrapeSource(session, endpoints, SCRAPE["vllm"], timeout_s=1.0)
                r1 = await source.collect(0.0)
                post_json(f"{first_life}/admin/state", {"add_success": 40})
                r2 = await source.collect(15.0)
                with fake_model_server() as second_life:
                    endpoints.pods["a"] = f"{second_life}/metrics"
                    post_json(f"{second_life}/admin/state", {"add_success": 5})
                    r3 = await source.collect(30.0)
                return r1, r2, r3

        r1, r2, r3 = asyncio.run(go())
    counter = None
    outcomes = []
    for now, r in ((0.0, r1), (15.0, r2), (30.0, r3)):
        clean, counter = sanitize(spec, Signals(arrivals_total=r.samples["arrivals_total"]), counter, now)
        outcomes.append((clean.arrival_rate_per_s, clean.dropped))
    assert outcomes[1][0] == 40 / 15
    assert outcomes[2][0] is None and "counter reset" in outcomes[2][1][0]


def test_pods_are_found_on_the_apiserver_and_scraped(cluster):
    ns = f"scrape-{int(time.time() * 1000) % 1000000}"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                           model_deployment(ns, "model", 1))[0] == 201
    try:
        pod_at_localhost(cluster, ns, attempts=40)
        with fake_model_server() as server:
            port = int(server.rsplit(":", 1)[1])
            post_json(f"{server}/admin/state", {"waiting": 9})

            async def go():
                kube = await Kube.connect(cluster.kubeconfig)
                try:
                    pods = KubePodEndpoints(kube, namespace=ns, kind="Deployment", name="model", port=port,
                                            path="/metrics")
                    found = await pods.endpoints()
                    async with aiohttp.ClientSession() as session:
                        result = await ScrapeSource(session, pods, SCRAPE["vllm"], timeout_s=2.0).collect(time.time())
                    return found, result
                finally:
                    await kube.close()

            found, result = asyncio.run(go())
        assert list(found.values()) == [f"http://127.0.0.1:{port}/metrics"]
        assert result.samples["queue_depth"].value == 9
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
