"""Scale to zero on the request path: the admission endpoint holds a request while no replica is Ready.

Through the real nginx with the shipped deploy/gateway/nginx.conf in front of the fake model server: at
zero a request is held (its own subrequest, with the long timeout), released with a 200 when a Ready
replica is published, or answered 503 with Retry-After after `max_hold_s`. Through the endpoint alone
(Envoy's ext_authz contract): first come first served, the held count and the loop's wake, the top class
held beyond the bound that drops the others, and fail open when the decision goes stale or the endpoint
dies during a hold.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from policies import PRIORITY_CLASSES, Decision

from loadtest.gateway import gateway as nginx_gateway
from loadtest.realservers import wait_tcp
from loopthread import LoopThread
from servers import free_port
from test_admission import COMPLETION, get, model_upstreams, serving
from test_gateway_failopen import ADMISSION_PROCESS

MAX_HOLD_S = 1.5


def at_zero(board: DecisionBoard, thread: LoopThread, *, replicas: int = 1, ready: int = 0, at_s: float = 0.0):
    """A decision ordering `replicas` with `ready` Ready (the model waking from zero)."""
    thread.run(board.publish(Published(Decision(replicas=replicas), 0, None, at_s, ready_replicas=ready)))


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextmanager
def behind_nginx(thread: LoopThread, admission: Admission):
    """The endpoint served, behind the real nginx with the shipped config: (the endpoint's URL, the gateway's)."""
    with serving(thread, admission.app()) as endpoint, model_upstreams() as upstreams, \
         nginx_gateway(admission=endpoint, upstreams=upstreams,
                       trusted_priority_header="x-request-priority") as (url, _):
        yield endpoint, url


@contextmanager
def at_zero_behind_nginx(board: DecisionBoard, admission: Admission):
    """`admission` behind the real nginx, its board at zero (one replica ordered, none Ready): (its loop
    thread, the endpoint's URL, the gateway's)."""
    thread = LoopThread()
    try:
        with behind_nginx(thread, admission) as (endpoint, url):
            at_zero(board, thread)
            yield thread, endpoint, url
    finally:
        thread.close()


@pytest.fixture()
def stack():
    thread = LoopThread()
    board = DecisionBoard()
    results: list[tuple[str, str]] = []
    holds: list[tuple[str, float, float]] = []  # (outcome, waited, when the hold ended: time.monotonic())
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7, max_hold_s=MAX_HOLD_S, max_held_requests=2,
                          on_result=lambda cls, result: results.append((cls, result)),
                          on_hold=lambda outcome, waited_s: holds.append((outcome, waited_s, time.monotonic())))
    with behind_nginx(thread, admission) as (endpoint, url):
        yield dict(thread=thread, board=board, url=url, endpoint=endpoint, results=results, holds=holds)
    thread.close()


def test_nginx_holds_the_request_until_a_replica_is_ready(stack):
    thread, board, url = stack["thread"], stack["board"], stack["url"]
    at_zero(board, thread)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        answer = pool.submit(get, f"{url}/v1/completions", "standard", COMPLETION)
        wait_for(lambda: board.held_requests == 1)
        time.sleep(0.5)  # longer than the ordinary subrequest's 250 ms timeout: still held, not failed open
        assert not answer.done() and board.wake.is_set()
        thread.run(board.set_ready(1))
        status, headers = answer.result(5)
    assert status == 200 and time.monotonic() - started >= 0.5
    assert board.held_requests == 0
    assert [outcome for outcome, _, _ in stack["holds"]] == ["admitted"]
    # the answer says how long the gateway held it: the hold's subrequest, at least the 0.5 s waited above
    assert 0.5 <= float(headers["X-Held-Seconds"]) < 5.0
    # Ready: the ordinary path, answered at once, and not named held
    status, headers = get(f"{url}/v1/completions", "standard", COMPLETION)
    assert status == 200 and "X-Held-Seconds" not in headers


def test_nginx_answers_503_with_retry_after_when_nothing_becomes_ready(stack):
    thread, board, url = stack["thread"], stack["board"], stack["url"]
    at_zero(board, thread, replicas=0)
    started = time.monotonic()
    status, headers = get(f"{url}/v1/completions", "critical", COMPLETION)
    waited_s = time.monotonic() - started
    assert status == 503 and headers["Retry-After"] == "7"
    assert headers["X-Shed-Reason"].startswith("no replica Ready after")
    assert MAX_HOLD_S <= waited_s < MAX_HOLD_S + 2.0
    assert ("critical", "hold_expired") in stack["results"] and board.held_requests == 0


def test_ext_authz_releases_held_requests_first_come_first_served(stack):
    thread, board, endpoint = stack["thread"], stack["board"], stack["endpoint"]
    at_zero(board, thread)
    classes = ["critical", "critical", "critical"]  # all held: the top class passes the bound of 2
    with ThreadPoolExecutor(3) as pool:
        answers = []
        for i, cls in enumerate(classes):
            answers.append(pool.submit(get, f"{endpoint}/ext_authz/v1/completions", cls))
            wait_for(lambda n=i + 1: board.held_requests == n)
        # beyond the bound, a lower class is answered 503 at once
        status, headers = get(f"{endpoint}/ext_authz/v1/completions", "sheddable")
        assert status == 503 and headers["Retry-After"] == "7" and "no room" in headers["X-Shed-Reason"]
        stack["results"].clear()
        thread.run(board.set_ready(1))
        assert [a.result(5)[0] for a in answers] == [200, 200, 200]
    assert stack["results"] == [("critical", "admitted")] * 3
    # released in arrival order: the holds end (in this order) from the earliest held to the latest. Not the
    # waits in decreasing order: the three arrive a few ms apart and resume a few ms apart on a loaded machine
    arrived = [ended - waited for _, waited, ended in stack["holds"]]
    assert arrived == sorted(arrived), "released in arrival order"


def test_a_stale_decision_releases_held_requests(stack):
    """The controller stopped deciding: fail open, as for any answer of the endpoint."""
    thread, board, endpoint = stack["thread"], stack["board"], stack["endpoint"]
    board.stale_after_s = 0.5
    now = board.clock.now()
    at_zero(board, thread, at_s=now)
    started = time.monotonic()
    status, _ = get(f"{endpoint}/ext_authz/", "standard")
    assert status == 200 and time.monotonic() - started < MAX_HOLD_S


def test_ready_replicas_or_an_unknown_count_never_hold(stack):
    thread, board, endpoint = stack["thread"], stack["board"], stack["endpoint"]
    for ready in (1, None):
        at_zero(board, thread, ready=ready)
        started = time.monotonic()
        assert get(f"{endpoint}/ext_authz/", "standard")[0] == 200
        assert time.monotonic() - started < 0.5 and board.held_requests == 0


def test_the_learned_cold_start_bounds_the_hold():
    board = DecisionBoard()
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="h", default_class="standard",
                          retry_after_s=5)
    assert admission.hold_limit_s() == 600.0  # nothing learned: the default
    asyncio.run(board.publish(Published(Decision(replicas=1, lead_time_s=130.0), 0, None, 0.0, ready_replicas=0)))
    assert admission.hold_limit_s() == 190.0
    asyncio.run(board.publish(Published(Decision(replicas=1, lead_time_s=900.0), 0, None, 0.0, ready_replicas=0)))
    assert admission.hold_limit_s() == 600.0  # capped: the shipped gateway's hold timeout is above it


def test_a_held_request_fails_open_when_the_endpoint_dies_during_the_hold():
    """The hold's long timeout does not fail closed: the endpoint killed mid-hold admits the request."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ADMISSION_PROCESS), str(port), "{}", "zero"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_tcp("127.0.0.1", port, proc=proc)
        with model_upstreams() as upstreams, \
             nginx_gateway(admission=f"http://127.0.0.1:{port}", upstreams=upstreams) as (url, _), \
             ThreadPoolExecutor(1) as pool:
            answer = pool.submit(get, f"{url}/v1/completions", None, COMPLETION)
            time.sleep(1.0)
            assert not answer.done()  # held past the ordinary subrequest's 250 ms
            proc.send_signal(signal.SIGKILL)
            assert answer.result(5)[0] == 200  # failed open to the model
    finally:
        proc.kill()
        proc.wait()


def test_a_held_request_of_an_unknown_class_is_counted_once():
    """nginx asks twice on the hold path (the ordinary subrequest, then the hold's): one request, one count."""
    board = DecisionBoard()
    unknown: list[int] = []
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7, max_hold_s=MAX_HOLD_S,
                          on_unknown=lambda: unknown.append(1))
    with at_zero_behind_nginx(board, admission) as (thread, _, url), ThreadPoolExecutor(1) as pool:
        answer = pool.submit(get, f"{url}/v1/completions", "no-such-class", COMPLETION)
        wait_for(lambda: board.held_requests == 1)
        thread.run(board.set_ready(1))
        status, _ = answer.result(5)
    assert status == 200 and len(unknown) == 1


def test_a_held_request_counts_as_an_arrival_when_its_hold_starts():
    """The endpoint `autoscaler run` builds, behind the real nginx: a request held at zero counts in the
    per-class arrivals the loop reads (`PriorityCounter`) while it is held, not only once a replica takes it,
    and not again when it is answered; the same through ext_authz. Before, it counted when answered: nothing
    while held, so a wake saw only what the Ready replicas already took."""
    from autoscaler.clock import SystemClock
    from autoscaler.config import Settings
    from autoscaler.loop import PriorityCounter
    from autoscaler.metrics import ControllerMetrics
    from autoscaler.runtime import Parts, build_admission

    settings = Settings(target={"namespace": "llm", "name": "m"}, mode="actuate", prometheus={"url": "http://p:9090"},
                        policy={"min_replicas": 0, "idle_after_s": 60.0},
                        admission={"queue_probe_interval_s": None, "max_hold_s": 5.0,
                                   "priority_header": "x-request-priority"})
    board, counted = DecisionBoard(), PriorityCounter()
    admission = build_admission(settings, None, None, board=board, metrics=ControllerMetrics(),
                                priorities=counted, clock=SystemClock(), parts=Parts())
    with at_zero_behind_nginx(board, admission) as (thread, endpoint, url):
        with ThreadPoolExecutor(2) as pool:
            through_nginx = pool.submit(get, f"{url}/v1/completions", "critical", COMPLETION)
            wait_for(lambda: board.held_requests == 1)
            through_envoy = pool.submit(get, f"{endpoint}/ext_authz/v1/completions", "sheddable")
            wait_for(lambda: board.held_requests == 2)
            assert counted.counts == {"critical": 1, "sheddable": 1}, "counted while held"
            thread.run(board.set_ready(1))
            assert through_nginx.result(5)[0] == 200 and through_envoy.result(5)[0] == 200
        assert counted.counts == {"critical": 1, "sheddable": 1}, "not counted again when answered"
        assert get(f"{url}/v1/completions", "standard", COMPLETION)[0] == 200  # Ready: the ordinary path
        assert counted.counts == {"critical": 1, "sheddable": 1, "standard": 1}

