"""Signal collection through real PromQL: Debian's Prometheus scraping the fake vLLM server."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import aiohttp
import pytest

from autoscaler.cli import main
from autoscaler.errors import PermanentError, TransientError
from autoscaler.presets import queries
from autoscaler.replay.openloop import open_loop
from autoscaler.replay.recording import read_recording
from autoscaler.signals.prometheus import PrometheusSource
from policies import PolicySpec

from servers import fake_model_server, free_port, post_json, prometheus, query, wait_for_series


@pytest.fixture(scope="module")
def stack():
    with fake_model_server() as model:
        host = model.removeprefix("http://")
        with prometheus([host]) as prom:
            yield model, prom


def collect(url, qs, timeout_s=3.0):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await PrometheusSource(session, url, qs, timeout_s=timeout_s).collect(time.time())

    return asyncio.run(go())


def test_vllm_preset_through_real_promql(stack):
    model, prom = stack
    post_json(f"{model}/admin/state", {"waiting": 7, "running": 12, "kv_usage": 0.4})
    wait_for_series(prom, 'sum(vllm:num_requests_waiting{namespace="llm"})', lambda v: v == 7)
    # counters and histograms need two scrapes with different values for rate()
    for _ in range(6):
        post_json(f"{model}/admin/state", {"add_success": 30, "add_generated": 600,
                                           "observe_inference_s": [0.5] * 30, "observe_e2e_s": [0.8] * 30})
        time.sleep(1.0)
    qs = queries("vllm", 'namespace="llm"')
    wait_for_series(prom, qs["service_time_s"], lambda v: v > 0)
    result = collect(prom, qs)
    assert not result.errors, result.errors
    s = result.samples
    assert s["queue_depth"].value == 7 and s["in_flight"].value == 12
    assert s["gpu_memory_headroom_ratio"].value == pytest.approx(0.6)
    # 30 requests a second for ~6 s: rate()[1m] over a partly filled window reads lower, never more
    assert 1.0 < s["arrival_rate_per_s"].value <= 31.0
    assert s["service_time_s"].value == pytest.approx(0.5)
    assert 0.5 <= s["p99_latency_s"].value <= 1.0
    assert abs(s["queue_depth"].at_s - time.time()) < 10


def test_absent_series_is_missing_not_zero(stack):
    _, prom = stack
    result = collect(prom, {"queue_depth": "sum(no_such_metric)"})
    assert result.samples == {} and result.errors == {}


def test_bad_promql_is_a_permanent_error(stack):
    _, prom = stack
    result = collect(prom, {"queue_depth": "sum(("})
    assert isinstance(result.errors["queue_depth"], PermanentError)


def test_prometheus_down_is_transient():
    result = collect(f"http://127.0.0.1:{free_port()}", {"queue_depth": "up"})
    assert isinstance(result.errors["queue_depth"], TransientError)
    assert result.errors["queue_depth"].kind == "prometheus_unavailable"


class _Garbage(BaseHTTPRequestHandler):
    delay_s = 0.0

    def do_GET(self):  # noqa: N802
        time.sleep(self.delay_s)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>not prometheus</html>")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("delay_s,kind", [(0.0, "bad_response"), (2.0, "prometheus_timeout")])
def test_garbage_and_slow_answers_are_reported(delay_s, kind):
    handler = type("H", (_Garbage,), {"delay_s": delay_s})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = collect(f"http://127.0.0.1:{server.server_port}", {"queue_depth": "up"}, timeout_s=0.5)
    finally:
        server.shutdown()
    assert result.errors["queue_depth"].kind == kind and not result.samples


def test_record_then_replay_round_trip(stack, tmp_path, step="1", out=None):
    model, prom = stack
    post_json(f"{model}/admin/state", {"waiting": 3, "running": 9})
    wait_for_series(prom, 'sum(vllm:num_requests_waiting{namespace="llm"})', lambda v: v == 3)
    time.sleep(2.0)
    config = tmp_path / "config.yaml"
    config.write_text(
        "target: {namespace: llm, name: model}\n"
        f"prometheus: {{url: '{prom}', selector: 'namespace=\"llm\"'}}\n"
    )
    out = out or tmp_path / "rec.json"
    assert main(["record", "--config", str(config), "--start", "now-2m", "--end", "now", "--step-s", step,
                 "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["queue_depth"]["data"]["result"]
    recording = read_recording(out)
    assert recording.latest("queue_depth", recording.end_s).value == 3
    rows = open_loop(recording, PolicySpec(tick_s=1.0, forecast_bucket_s=60.0))
    assert rows and all(r["queue"] != "" for r in rows[-3:])


def test_record_with_a_fractional_step(stack, tmp_path):
    """A time-compressed recording samples every 1.5 s: the step goes to Prometheus as seconds, not "1.5s"."""
    out = tmp_path / "rec.json"
    test_record_then_replay_round_trip(stack, tmp_path, step="1.5", out=out)
    times = json.loads(out.read_text())["queue_depth"]["data"]["result"][0]["values"]
    assert [round(b[0] - a[0], 3) for a, b in zip(times, times[1:])] == [1.5] * (len(times) - 1)


def test_record_analyze_and_run_the_recommended_config(stack, tmp_path, capsys):
    """record (from the real Prometheus) -> analyze (the preflight) -> the written policy section, pasted into
    the controller's config, is what `autoscaler run` loads."""
    from autoscaler.config import load_config

    model, prom = stack
    for _ in range(60):  # traffic until Prometheus has scraped it moving
        post_json(f"{model}/admin/state", {"waiting": 0, "running": 6, "add_success": 20,
                                           "observe_inference_s": [0.3] * 20})
        time.sleep(0.5)
        rate = query(prom, 'sum(rate(vllm:request_success_total{namespace="llm"}[1m]))')
        if rate and float(rate[0]["value"][1]) > 0:
            break
    config = tmp_path / "config.yaml"
    config.write_text("target: {namespace: llm, name: model}\n"
                      f"prometheus: {{url: '{prom}', selector: 'namespace=\"llm\"'}}\n")
    recording = tmp_path / "rec.json"
    assert main(["record", "--config", str(config), "--start", "now-2m", "--end", "now", "--step-s", "1",
                 "--out", str(recording)]) == 0
    capsys.readouterr()
    policy = tmp_path / "policy.yaml"
    policy.write_text("tick_s: 1.0\nforecast_bucket_s: 60.0\n")
    written = tmp_path / "recommended.yaml"
    assert main(["analyze", str(recording), "--policy", str(policy), "--json", "--out", str(tmp_path / "a"),
                 "--write-config", str(written)]) == 0
    answers = json.loads(capsys.readouterr().out)
    assert answers["input"]["kind"] == "recording" and answers["concurrency_floor"]["1h"]["concurrency_p10"] > 0
    assert answers["residency"]["loaded_from"].startswith("not in the data")  # no kube-state-metrics here
    config.write_text(config.read_text() + written.read_text())
    settings = load_config(config)
    assert settings.policy.min_replicas == answers["recommended"]["policy"]["min_replicas"]
    assert settings.tick_s == 1.0
