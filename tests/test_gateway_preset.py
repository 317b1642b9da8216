"""The llm-d gateway preset: requests held in the endpoint picker's flow control, read as `held_requests`
through real PromQL (Debian's Prometheus scraping an exposition of `llm_d_epp_flow_control_queue_size`)."""

import asyncio
import threading
import time
from http.server import ThreadingHTTPServer

import aiohttp
import pytest

from autoscaler.config import Settings
from autoscaler.presets import queries
from autoscaler.signals.prometheus import PrometheusSource

from loadtest.realservers import exposition_handler
from servers import prometheus, wait_for_series

# The endpoint picker's gauge, one series per flow-control queue (fairness id x priority) of each pool.
EXPOSITION = """\
# HELP llm_d_epp_flow_control_queue_size Requests held in flow control.
# TYPE llm_d_epp_flow_control_queue_size gauge
llm_d_epp_flow_control_queue_size{{fairness_id="tenant-a",inference_pool="llama",model_name="llama",priority="0",target_model_name="llama"}} {a}
llm_d_epp_flow_control_queue_size{{fairness_id="tenant-b",inference_pool="llama",model_name="llama",priority="-1",target_model_name="llama"}} {b}
llm_d_epp_flow_control_queue_size{{fairness_id="tenant-a",inference_pool="qwen",model_name="qwen",priority="0",target_model_name="qwen"}} 9
# HELP inference_extension_flow_control_queue_size Deprecated name of the same gauge.
# TYPE inference_extension_flow_control_queue_size gauge
inference_extension_flow_control_queue_size{{fairness_id="tenant-a",inference_pool="llama",priority="0"}} {a}
"""


@pytest.fixture(scope="module")
def epp():
    """An HTTP /metrics with the exposition; `held` sets the llama pool's two queues."""
    held = {"a": 3, "b": 2}

    server = ThreadingHTTPServer(("127.0.0.1", 0), exposition_handler(lambda: EXPOSITION.format(**held)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with prometheus([f"127.0.0.1:{server.server_port}"]) as prom:
            yield prom, held
    finally:
        server.shutdown()
        server.server_close()


def collect(url, qs):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await PrometheusSource(session, url, qs, timeout_s=3.0).collect(time.time())

    return asyncio.run(go())


def test_held_requests_sums_the_pools_flow_control_queues(epp):
    prom, held = epp
    qs = queries("vllm", 'namespace="llm"', gateway="llm-d", gateway_selector='inference_pool="llama"')
    assert qs["held_requests"] == 'sum(llm_d_epp_flow_control_queue_size{inference_pool="llama"})'
    wait_for_series(prom, qs["held_requests"], lambda v: v == 5)
    result = collect(prom, {"held_requests": qs["held_requests"]})
    assert not result.errors and result.samples["held_requests"].value == 5  # 3 + 2; not qwen's 9
    held.update(a=0, b=0)  # the pool has a replica again: flow control released them
    wait_for_series(prom, qs["held_requests"], lambda v: v == 0)
    assert collect(prom, {"held_requests": qs["held_requests"]}).samples["held_requests"].value == 0


def test_a_pool_the_gateway_never_reported_is_missing_not_zero(epp):
    prom, _ = epp
    qs = queries("vllm", "", gateway="llm-d", gateway_selector='inference_pool="nope"')
    result = collect(prom, {"held_requests": qs["held_requests"]})
    assert result.samples == {} and result.errors == {}


def test_the_config_adds_the_gateway_query_and_refuses_an_unknown_gateway():
    base = {"target": {"namespace": "llm", "name": "model"}}
    settings = Settings(**base, prometheus={"url": "http://prom:9090", "gateway": "llm-d",
                                            "gateway_selector": 'inference_pool="llama"'})
    assert settings.queries["held_requests"] == 'sum(llm_d_epp_flow_control_queue_size{inference_pool="llama"})'
    assert "held_requests" not in Settings(**base, prometheus={"url": "http://prom:9090"}).queries
    with pytest.raises(ValueError, match="gateway"):
        Settings(**base, prometheus={"url": "http://prom:9090", "gateway": "envoy"})
    with pytest.raises(ValueError, match="unknown gateway preset 'envoy'"):
        queries("vllm", "", gateway="envoy")
