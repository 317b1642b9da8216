"""A fake GPU model server that behaves like vLLM where the autoscaler can tell: slots, a queue (first come
first served, or by priority), time per token, vLLM's metric names, and a graceful drain. The one thing the
closed-loop tests fake.

    python -m loadtest.fakeserver --port 8000 [--concurrency 16] [--time-scale 0.1] [--scheduling-policy priority]

- `POST /v1/completions` (OpenAI-compatible): `prompt` as text (one token per word) or as a list of token
  ids, `max_tokens` tokens generated (as with vLLM's `ignore_eos`). The request waits in one queue for
  one of `concurrency` slots (vLLM's `--max-num-seqs`), then holds it for
  prefill_s_per_token x prompt + decode_s_per_token x output seconds, times `time_scale` (a time-compressed
  test runs every duration faster by the same factor): the simulator's capacity model, request by request.
  The answer is a `text_completion` with `usage`; header `x-queue-seconds` says how long it waited for a
  slot (a test-harness addition; vLLM reports the same time only in `vllm:request_queue_time_seconds`).
- Scheduling policy (vLLM's `--scheduling-policy`): `fcfs` (the default) serves the queue in arrival order;
  `priority` serves it by (the request's integer `priority` field, arrival): lower values first, default 0,
  as vLLM does. As vLLM, an `fcfs` server rejects (400) a request whose `priority` is not 0. A request that
  holds a slot keeps it (vLLM's priority preemption acts on KV-cache pressure, which this server has not).
- `GET /metrics`: vLLM's names: gauges `vllm:num_requests_waiting`, `vllm:num_requests_running`,
  `vllm:kv_cache_usage_perc` (the share of slots in use); counters `vllm:request_success_total`,
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`; histograms
  `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds`,
  `vllm:request_inference_time_seconds`, `vllm:time_to_first_token_seconds`.
- Drain (`POST /admin/drain`, or SIGTERM for the command): the listener closes, so new connections are
  refused (a gateway tries another server), and the requests it has, waiting or running, are finished.
- `POST /admin/state` sets gauges and adds to counters directly, for tests that need exact values.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import signal
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Latency buckets, in seconds at factor 1 (divided by the time compression, like every duration).
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0)


def prompt_tokens(prompt: object) -> int:
    """Tokens of an OpenAI `prompt`: a list of token ids, a text (a token per word), or a list of texts."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    if isinstance(prompt, list) and all(isinstance(t, str) for t in prompt):
        return sum(max(1, len(t.split())) for t in prompt)
    raise ValueError("prompt must be a string, a list of strings or a list of token ids")


SCHEDULING_POLICIES = ("fcfs", "priority")


def request_priority(body: dict, policy: str) -> int:
    """The request's `priority` as vLLM reads it: an integer, 0 when absent, non-zero only under `priority`."""
    value = body.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("priority must be an integer")
    if value != 0 and policy != "priority":
        raise ValueError(f"Got priority {value} but Priority scheduling is not enabled.")
    return value


class Slots:
    """`count` slots handed to waiters in (key, arrival) order: a FIFO semaphore when every key is equal.

    Invariant: a slot is free only while nobody waits for it; a released slot goes straight to the first
    waiter, so a later arrival cannot overtake a waiter with an equal or lower key."""

    def __init__(self, count: int) -> None:
        self.free = count
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._arrival = itertools.count()

    async def acquire(self, key: int = 0) -> None:
        if self.free and not self._waiters:
            self.free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (key, next(self._arrival), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # the slot was handed over as we were cancelled
                self.release()
            raise

    def release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():  # a cancelled waiter is skipped
                future.set_result(None)
                return
        self.free += 1


class FakeModelServer:
    def __init__(self, *, concurrency: int = 16, prefill_s_per_token: float = 0.0001,
                 decode_s_per_token: float = 0.02, time_scale: float = 1.0, model: str = "fake-model",
                 scheduling_policy: str = "fcfs") -> None:
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {scheduling_policy!r}")
        self.scheduling_policy = scheduling_policy
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model = model
        buckets = tuple(b * time_scale for b in BUCKETS)
        r = self.registry
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", labels, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests running", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0-1)", labels, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", labels, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prefill tokens", labels, registry=r)
        self.generated = Counter("vllm:generation_tokens", "Generated tokens", labels, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end latency", labels, buckets=buckets,
                             registry=r)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Time waiting for a slot", labels,
                                    buckets=buckets, registry=r)
        self.inference = Histogram("vllm:request_inference_time_seconds", "Time in a slot", labels,
                                   buckets=buckets, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to the first token", labels,
                              buckets=buckets, registry=r)
        for metric in (self.waiting, self.running, self.kv, self.success, self.prompt, self.generated,
                       self.e2e, self.queue_time, self.inference, self.ttft):
            metric.labels(model)  # export every series from the start
        self.concurrency = concurrency
        self.slots = Slots(concurrency)  # waiters are served by (priority, arrival); all 0 under fcfs
        self.prefill, self.decode, self.time_scale = prefill_s_per_token, decode_s_per_token, time_scale
        self.in_flight = 0  # waiting + running
        self.idle = asyncio.Event()
        self.idle.set()

    def _l(self, metric):
        return metric.labels(self.model)

    def _set_usage(self) -> None:
        self._l(self.kv).set(self._l(self.running)._value.get() / self.concurrency)

    async def completions(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            prompt = prompt_tokens(body.get("prompt", ""))
            out = int(body.get("max_tokens", 16))
            if out < 0:
                raise ValueError("max_tokens must be >= 0")
            priority = request_priority(body, self.scheduling_policy)
        except (ValueError, TypeError, AttributeError) as exc:
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400)
        started = time.monotonic()
        self.in_flight += 1
        self.idle.clear()
        self._l(self.waiting).inc()
        try:
            try:
                await self.slots.acquire(priority)
            except asyncio.CancelledError:
                self._l(self.waiting).dec()
                raise
            queued = time.monotonic() - started
            self._l(self.waiting).dec()
            self._l(self.running).inc()
            self._set_usage()
            prefill_s = self.prefill * prompt * self.time_scale
            slot_s = prefill_s + self.decode * out * self.time_scale
            try:
                await asyncio.sleep(slot_s)
            finally:
                self._l(self.running).dec()
                self._set_usage()
                self.slots.release()
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()
        self._l(self.success).inc()
        self._l(self.prompt).inc(prompt)
        self._l(self.generated).inc(out)
        self._l(self.queue_time).observe(queued)
        self._l(self.inference).observe(slot_s)
        self._l(self.ttft).observe(queued + prefill_s)
        self._l(self.e2e).observe(time.monotonic() - started)
        return web.json_response(
            {"id": f"cmpl-{id(request):x}", "object": "text_completion", "created": int(time.time()),
             "model": self.model, "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
             "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}},
            headers={"x-queue-seconds": f"{queued:.6f}"},
        )

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


class RunningServer:
    """One fake server listening on host:port, which can be drained and stopped."""

    def __init__(self, server: FakeModelServer, host: str, port: int) -> None:
        self.server, self.host, self.port = server, host, port
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.draining = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = self.server.app()
        app.router.add_post("/admin/drain", self._drain_request)
        # cleanup waits this long for the requests in progress (the longest a request could take at factor 1
        # is a few minutes): that wait is the drain
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=600.0 * self.server.time_scale)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
        await self.site.start()

    async def _drain_request(self, request: web.Request) -> web.Response:
        asyncio.get_running_loop().create_task(self.drain())
        return web.json_response({"draining": True, "in_flight": self.server.in_flight})

    async def drain(self) -> None:
        """Refuse new connections, finish every request taken, then stop."""
        if self.draining:
            return
        self.draining = True
        if self.site is not None:
            await self.site.stop()  # the listener closes: new connections are refused
        await self.server.idle.wait()
        if self.runner is not None:
            await self.runner.cleanup()  # waits for every handler to finish writing its response


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.fakeserver")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="as vLLM's: fcfs, or priority by the request's `priority` field (default: %(default)s)")
    args = p.parse_args(argv)

    async def serve() -> None:
        server = RunningServer(FakeModelServer(concurrency=args.concurrency, time_scale=args.time_scale,
                                               scheduling_policy=args.scheduling_policy),
                               args.host, args.port)
        await server.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.drain()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
