"""The gateway fails safe on the way to a model it cannot reach: through the real nginx with the shipped
deploy/gateway/nginx.conf.

While the model wakes from zero, a request whose ordinary admission subrequest times out (250 ms, under
load) fails open to the model; with no Ready pod behind the model's Service the connection is refused, and
nginx used to answer 502 at once (the closed loop's quick 502s, `python -m loadtest.e2e --scenario
scale-to-zero`). A refused connection sent nothing, so the gateway now holds the request instead
(`X-Model-Unreachable` on the hold subrequest) and sends it once a replica is Ready. A request nginx did
send (the model closed the connection before answering) is never sent twice: that 502 stands.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard
from policies import PRIORITY_CLASSES

from loadtest.gateway import gateway as nginx_gateway
from loopthread import LoopThread
from servers import free_port
from test_admission import COMPLETION, get, serving
from test_hold import at_zero, wait_for

SLOW_S = 0.5  # beyond the ordinary subrequest's 250-ms read timeout


def endpoint_app(admission: Admission) -> web.Application:
    """The admission endpoint with its ordinary answer too slow for the gateway (an event loop under load);
    the hold subrequest as is."""
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(SLOW_S)
        return await admission.auth_request(request)

    app = web.Application()
    app.router.add_route("*", "/auth_request", slow)
    app.router.add_route("*", "/auth_request/hold", admission.auth_request_hold)
    return app


def model_app(hits: list[str], *, close_early: bool = False) -> web.Application:
    """A model that answers 200, or (`close_early`) reads the request and closes the connection unanswered."""
    async def handle(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        if close_early:
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(1.0)
        return web.json_response({"choices": [{"text": "ok"}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def upstream_file(tmp: str, port: int) -> Path:
    upstreams = Path(tmp) / "upstreams.conf"
    upstreams.write_text(f"server 127.0.0.1:{port} max_fails=0;\n")
    return upstreams


def test_a_request_failed_open_to_a_model_at_zero_is_held_not_answered_502():
    thread = LoopThread()
    board = DecisionBoard()
    holds: list[tuple[str, float]] = []
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7, max_hold_s=30.0,
                          on_hold=lambda outcome, waited_s: holds.append((outcome, waited_s)))
    model_port, hits = free_port(), []
    try:
        with serving(thread, endpoint_app(admission)) as endpoint, tempfile.TemporaryDirectory() as tmp, \
             nginx_gateway(admission=endpoint, upstreams=upstream_file(tmp, model_port),
                           trusted_priority_header="x-request-priority") as (url, _), \
             ThreadPoolExecutor(1) as pool:
            at_zero(board, thread)  # waking: no replica Ready, nothing listens on the model's port
            started = time.monotonic()
            answer = pool.submit(get, f"{url}/v1/completions", "standard", COMPLETION)
            wait_for(lambda: board.held_requests == 1)  # failed open, refused, then held
            time.sleep(0.3)
            assert not answer.done(), "answered while no replica is Ready"
            # a replica turns Ready: the model listens, then the controller sees it Ready
            with serving(thread, model_app(hits), model_port):
                thread.run(board.set_ready(1))
                status, headers = answer.result(5)
    finally:
        thread.close()
    assert status == 200 and hits == ["/v1/completions"]
    assert time.monotonic() - started >= SLOW_S and [o for o, _ in holds] == ["admitted"]
    assert float(headers["X-Held-Seconds"]) >= 0.3  # held in @model_unreachable, at least the 0.3 s above


def test_a_request_the_model_received_is_not_sent_again():
    """The model read the request and closed the connection: nginx's 502 reaches the client, sent once."""
    thread = LoopThread()
    board = DecisionBoard()
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7, max_hold_s=30.0)
    model_port, hits = free_port(), []
    try:
        with serving(thread, admission.app()) as endpoint, tempfile.TemporaryDirectory() as tmp, \
             serving(thread, model_app(hits, close_early=True), model_port), \
             nginx_gateway(admission=endpoint, upstreams=upstream_file(tmp, model_port)) as (url, _):
            status, _ = get(f"{url}/v1/completions", None, COMPLETION)
    finally:
        thread.close()
    assert status == 502 and hits == ["/v1/completions"] and board.held_requests == 0
