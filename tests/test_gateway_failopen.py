"""The request path fails open: the shipped deploy/gateway/nginx.conf, run by the real nginx in front of the
fake model server, keeps serving while the admission endpoint (a process of its own) is killed, restarted,
stopped (SIGSTOP: it accepts connections and never answers) and resumed under load. No client may see a
5xx the model did not cause, and every request is answered. The fail-closed switch answers 503 instead,
and a model's own 5xx passes through once, never retried through the fail-open path.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loadtest.gateway import gateway
from loadtest.realservers import fake_model_server, free_port, stop, wait_tcp

from loopthread import LoopThread

ADMISSION_PROCESS = Path(__file__).resolve().parent / "admission_process.py"
SHED = {"sheddable": 0.5}
COMPLETION = {"model": "fake-model", "prompt": [0] * 8, "max_tokens": 4}
CLIENTS = 16
PHASE_S = 1.5
# The shipped subrequest timeouts (connect 100 ms, answer 250 ms) bound what a stalled endpoint adds; the
# rest is room for a loaded test machine.
MAX_LATENCY_S = 3.0


class AdmissionProcess:
    def __init__(self, port: int) -> None:
        self.port, self.proc = port, None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ADMISSION_PROCESS), str(self.port), json.dumps(SHED)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_tcp("127.0.0.1", self.port, proc=self.proc)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


@contextmanager
def stack(**settings):
    """The fake model server, the admission process and nginx with the shipped file (the load generator's
    priority header trusted as an authenticating proxy's, so some requests are shed while it answers)."""
    admission = AdmissionProcess(free_port())
    admission.start()
    try:
        with fake_model_server(concurrency=64, time_scale=0.001) as model, tempfile.TemporaryDirectory() as tmp:
            upstreams = Path(tmp) / "upstreams.conf"
            upstreams.write_text(f"server {model.removeprefix('http://')};\n")
            with gateway(admission=f"http://127.0.0.1:{admission.port}", upstreams=upstreams,
                         trusted_priority_header="x-request-priority", **settings) as (url, _):
                yield url, admission
    finally:
        if admission.proc.poll() is None:
            admission.signal(signal.SIGCONT)
            stop(admission.proc)


async def _client(session: aiohttp.ClientSession, url: str, i: int, phase: list[str], records: list[dict]) -> None:
    n = 0
    while phase[0] != "done":
        cls = ("sheddable", "standard", "critical")[(i + n) % 3]
        n += 1
        started, record = time.monotonic(), {"phase": phase[0], "status": 0, "error": None}
        try:
            async with session.post(f"{url}/v1/completions", json=COMPLETION,
                                    headers={"x-request-priority": cls}) as response:
                await response.read()
                record["status"] = response.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
        record["latency_s"] = time.monotonic() - started
        records.append(record)


async def _faults(admission: AdmissionProcess, phase: list[str]) -> None:
    """up -> killed (connections refused) -> restarted -> stopped (connections accepted, never answered)
    -> resumed."""
    steps = [("killed", admission.kill), ("restarted", admission.start),
             ("stopped", lambda: admission.signal(signal.SIGSTOP)),
             ("resumed", lambda: admission.signal(signal.SIGCONT))]
    for name, action in steps:
        await asyncio.sleep(PHASE_S)
        await asyncio.to_thread(action)
        phase[0] = name
    await asyncio.sleep(PHASE_S)
    phase[0] = "done"


async def _load(url: str, admission: AdmissionProcess) -> list[dict]:
    phase, records = ["up"], []
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=CLIENTS)) as session:
        await asyncio.gather(_faults(admission, phase),
                             *(_client(session, url, i, phase, records) for i in range(CLIENTS)))
    return records


def _counts(records: list[dict]) -> dict[str, dict]:
    by_phase: dict[str, dict] = {}
    for r in records:
        c = by_phase.setdefault(r["phase"], Counter())
        c["requests"] += 1
        c["non-2xx"] += not 200 <= r["status"] < 300
        c["429"] += r["status"] == 429
        c["5xx"] += r["status"] >= 500
        c["no answer"] += r["error"] is not None
        c["max_latency_ms"] = max(c["max_latency_ms"], round(1000 * r["latency_s"]))
    return {phase: dict(c) for phase, c in by_phase.items()}


def test_the_gateway_admits_while_the_admission_endpoint_is_killed_stopped_and_restarted():
    with stack() as (url, admission):
        records = asyncio.run(_load(url, admission))
    counts = _counts(records)
    total = {k: sum(c[k] for c in counts.values()) for k in ("requests", "non-2xx", "429", "5xx", "no answer")}
    print("gateway under load, admission endpoint killed, restarted, stopped, resumed:", json.dumps(total))
    for phase, c in counts.items():
        print(f"  {phase:>9}: {json.dumps(c)}")
    assert set(counts) == {"up", "killed", "restarted", "stopped", "resumed"}
    assert all(c["requests"] >= CLIENTS for c in counts.values()), counts  # load in every phase
    assert total["5xx"] == 0 and total["no answer"] == 0, counts
    assert total["non-2xx"] == total["429"]  # the only refusals are the endpoint's own sheds...
    for phase in ("up", "restarted", "resumed"):
        assert counts[phase]["429"] > 0, counts  # ...while it answers (shedding works before and after)
    assert max(c["max_latency_ms"] for c in counts.values()) <= 1000 * MAX_LATENCY_S, counts


def _requests(url: str, n: int) -> list[tuple[int, str | None]]:
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            answers = []
            for _ in range(n):
                async with session.post(f"{url}/v1/completions", json=COMPLETION,
                                        headers={"x-request-priority": "critical"}) as response:
                    answers.append((response.status, response.headers.get("Retry-After")))
            return answers
    return asyncio.run(go())


def test_the_fail_closed_switch_rejects_with_503_while_the_endpoint_cannot_answer():
    with stack(on_admission_error="reject") as (url, admission):
        assert {s for s, _ in _requests(url, 5)} == {200}
        admission.kill()
        assert _requests(url, 5) == [(503, "5")] * 5  # refused
        admission.start()
        assert {s for s, _ in _requests(url, 5)} == {200}
        admission.signal(signal.SIGSTOP)
        started = time.monotonic()
        assert _requests(url, 3) == [(503, "5")] * 3  # timed out
        print(f"fail closed: 3 requests to a stopped endpoint answered 503 in {time.monotonic() - started:.2f} s")


@pytest.fixture()
def failing_model():
    """A model server answering 500 to everything, counting what it receives."""
    thread, hits, port = LoopThread(), [], free_port()

    async def boom(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=500, text="the model failed\n")

    async def serve():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", boom)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = thread.run(serve())
    yield f"127.0.0.1:{port}", hits
    thread.run(runner.cleanup())
    thread.close()


@pytest.mark.parametrize("admission_up", [True, False])
def test_a_model_5xx_reaches_the_client_once_and_is_not_retried(failing_model, admission_up):
    model, hits = failing_model
    admission = AdmissionProcess(free_port())
    if admission_up:
        admission.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            upstreams = Path(tmp) / "upstreams.conf"
            upstreams.write_text(f"server {model};\n")
            with gateway(admission=f"http://127.0.0.1:{admission.port}", upstreams=upstreams) as (url, _):
                answers = _requests(url, 1)
                upstreams.write_text("server 127.0.0.1:9;\n")  # nothing listens: nginx's own 502
            with gateway(admission=f"http://127.0.0.1:{admission.port}", upstreams=upstreams) as (url, _):
                unreachable = _requests(url, 1)
    finally:
        if admission.proc is not None:
            stop(admission.proc)
    assert answers == [(500, None)] and hits == ["/v1/completions"]  # the model's answer, sent once
    assert unreachable[0][0] == 502


def test_the_endpoint_answers_well_within_the_gateways_timeout():
    """What the shipped 250 ms answer timeout leaves room for: the endpoint's own time per answer."""
    admission = AdmissionProcess(free_port())
    admission.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", admission.port, timeout=5)
        took_s = []
        for _ in range(2000):
            started = time.perf_counter()
            connection.request("GET", "/auth_request", headers={"x-request-priority": "sheddable"})
            connection.getresponse().read()
            took_s.append(time.perf_counter() - started)
        connection.close()
    finally:
        stop(admission.proc)
    took_s.sort()
    p50, p99 = took_s[len(took_s) // 2], took_s[int(0.99 * len(took_s))]
    print(f"admission endpoint, 2000 answers on one connection: median {1000 * p50:.2f} ms, "
          f"p99 {1000 * p99:.2f} ms, max {1000 * took_s[-1]:.2f} ms")
    assert p99 < 0.25 / 5  # a fifth of the gateway's timeout, on a loaded test machine
