"""A fake model server that speaks a sliver of the vLLM HTTP API and exports vLLM's metric names.

    python -m loadtest.fakeserver --port 8000 [--concurrency 16] [--time-scale 0.01]

- POST /v1/completions {"prompt_tokens": n, "max_tokens": m, "model": ...}: waits for one of
  `concurrency` slots (counted in vllm:num_requests_waiting), then holds it for prefill x n + decode x m
  seconds times `time_scale` (counted in vllm:num_requests_running), then answers.
- GET /metrics: gauges vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc;
  counters vllm:request_success_total, vllm:prompt_tokens_total, vllm:generation_tokens_total; histograms
  vllm:e2e_request_latency_seconds and vllm:request_inference_time_seconds.
- POST /admin/state {"waiting": .., "running": .., "kv_usage": .., "add_success": .., "observe_inference_s": ..}:
  set gauges and add to counters directly, for tests that need exact values.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)


class FakeModelServer:
    def __init__(self, *, concurrency: int = 16, prefill_s_per_token: float = 0.0001,
                 decode_s_per_token: float = 0.02, time_scale: float = 1.0, model: str = "fake-model") -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model = model
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", labels, registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "Requests running", labels, registry=self.registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0-1)", labels, registry=self.registry)
        self.success = Counter("vllm:request_success", "Finished requests", labels, registry=self.registry)
        self.prompt = Counter("vllm:prompt_tokens", "Prefill tokens", labels, registry=self.registry)
        self.generated = Counter("vllm:generation_tokens", "Generated tokens", labels, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end latency", labels,
                             buckets=BUCKETS, registry=self.registry)
        self.inference = Histogram("vllm:request_inference_time_seconds", "Time in a slot", labels,
                                   buckets=BUCKETS, registry=self.registry)
        for metric in (self.waiting, self.running, self.kv, self.success, self.prompt, self.generated,
                       self.e2e, self.inference):
            metric.labels(model)  # export every series from the start
        self.concurrency = concurrency
        self.slots = asyncio.Semaphore(concurrency)
        self.prefill, self.decode, self.time_scale = prefill_s_per_token, decode_s_per_token, time_scale

    def _l(self, metric):
        return metric.labels(self.model)

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt, out = int(body.get("prompt_tokens", 100)), int(body.get("max_tokens", 16))
        started = time.monotonic()
        self._l(self.waiting).inc()
        async with self.slots:
            self._l(self.waiting).dec()
            self._l(self.running).inc()
            self._l(self.kv).set(self._l(self.running)._value.get() / self.concurrency)
            slot_s = (self.prefill * prompt + self.decode * out) * self.time_scale
            await asyncio.sleep(slot_s)
            self._l(self.running).dec()
            self._l(self.kv).set(self._l(self.running)._value.get() / self.concurrency)
        self._l(self.success).inc()
        self._l(self.prompt).inc(prompt)
        self._l(self.generated).inc(out)
        self._l(self.inference).observe(slot_s)
        self._l(self.e2e).observe(time.monotonic() - started)
        return web.json_response({"object": "text_completion", "model": self.model,
                                  "usage": {"prompt_tokens": prompt, "completion_tokens": out}})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def admin(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "waiting" in body:
            self._l(self.waiting).set(body["waiting"])
        if "running" in body:
            self._l(self.running).set(body["running"])
        if "kv_usage" in body:
            self._l(self.kv).set(body["kv_usage"])
        if "add_success" in body:
            self._l(self.success).inc(body["add_success"])
        if "add_generated" in body:
            self._l(self.generated).inc(body["add_generated"])
        for value in body.get("observe_inference_s", []):
            self._l(self.inference).observe(value)
        for value in body.get("observe_e2e_s", []):
            self._l(self.e2e).observe(value)
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.post("/v1/completions", self.completions),
            web.get("/metrics", self.metrics),
            web.post("/admin/state", self.admin),
        ])
        return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.fakeserver")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0)
    args = p.parse_args(argv)

    async def make() -> web.Application:
        return FakeModelServer(concurrency=args.concurrency, time_scale=args.time_scale).app()

    web.run_app(make(), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
