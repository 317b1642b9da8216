"""Nothing lost on the way down to zero, through the real nginx with the shipped deploy/gateway/nginx.conf.

The last replica is the fake model server as a process of its own: SIGTERM is the pod's deletion (its
listener closes, the requests it has are finished: vLLM's --shutdown-timeout). Once the decision of 0 is
published (with the Ready count known: the last replica is going), a new request is held at the admission
endpoint, not sent to the draining server (which refuses connections: nginx would answer 502), and the request
in flight when the drain began still gets its answer. The next start (a new server on the same address, the
decision above 0 with a Ready replica) releases the held request.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.metrics import ControllerMetrics
from policies import PRIORITY_CLASSES, Decision

from loadtest.gateway import gateway as nginx_gateway
from loadtest.realservers import stop, wait_http
from loopthread import LoopThread
from servers import free_port
from test_admission import get, serving
from test_hold import wait_for

# One request of 100 tokens at the fake server's 20 ms per token: in flight for 2 s.
LONG = b'{"model": "fake-model", "prompt": [0, 0, 0, 0], "max_tokens": 100}'
SHORT = b'{"model": "fake-model", "prompt": [0, 0, 0, 0], "max_tokens": 2}'


def replica(port: int) -> subprocess.Popen:
    """The model's one replica on 127.0.0.1:port, Ready."""
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.fakeserver", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc)
    return proc


def publish(thread: LoopThread, board: DecisionBoard, *, replicas: int, ready: int) -> None:
    thread.run(board.publish(Published(Decision(replicas=replicas), 1, None, time.time(), ready_replicas=ready)))


@pytest.fixture()
def gateway():
    thread, board, holds = LoopThread(), DecisionBoard(), []
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7, max_hold_s=30.0,
                          on_hold=lambda outcome, waited_s: holds.append(outcome))
    port = free_port()
    with serving(thread, admission.app()) as endpoint, tempfile.TemporaryDirectory() as tmp:
        upstreams = Path(tmp) / "upstreams.conf"
        upstreams.write_text(f"server 127.0.0.1:{port};\n")
        with nginx_gateway(admission=endpoint, upstreams=upstreams,
                           trusted_priority_header="x-request-priority") as (url, _):
            yield dict(thread=thread, board=board, url=f"{url}/v1/completions", port=port, holds=holds)
    thread.close()


def test_requests_arriving_while_the_last_replica_drains_are_held_for_the_next_start(gateway):
    thread, board, url, port = gateway["thread"], gateway["board"], gateway["url"], gateway["port"]
    last = replica(port)
    following = None
    try:
        publish(thread, board, replicas=1, ready=1)
        with ThreadPoolExecutor(2) as pool:
            in_flight = pool.submit(get, url, "standard", LONG)
            time.sleep(0.5)  # the request has reached the replica
            publish(thread, board, replicas=0, ready=1)  # idle: the decision is 0, the last pod is deleted
            last.send_signal(signal.SIGTERM)  # its drain: the listener closes, the running request goes on
            time.sleep(0.2)
            held = pool.submit(get, url, "standard", SHORT)
            wait_for(lambda: board.held_requests == 1 or held.done())
            assert not held.done(), f"not held: answered {held.result()[0]}"  # 502 from the draining replica
            assert in_flight.result(10)[0] == 200  # drained, not cut
            assert last.wait(10) == 0
            assert not held.done()
            following = replica(port)  # the next start
            publish(thread, board, replicas=1, ready=1)
            assert held.result(10)[0] == 200
        assert gateway["holds"] == ["admitted"] and board.held_requests == 0
    finally:
        stop(last)
        if following is not None:
            stop(following)


def test_a_decision_of_zero_holds_with_replicas_ready_only_where_it_removes_them_and_a_hold_wakes_it():
    """Nothing acts on a shadow decision: the replicas stay, and requests must not wait for a wake. Without
    idle_after_s (a plain `min_replicas: 0`) the policy does not wake on a held request: not held either."""
    from autoscaler.clock import SystemClock
    from autoscaler.config import Settings
    from autoscaler.loop import PriorityCounter
    from autoscaler.runtime import Parts, build_admission

    thread, board = LoopThread(), DecisionBoard()
    try:
        publish(thread, board, replicas=0, ready=1)
        for mode, idle_after_s, held in (("shadow", 60.0, False), ("actuate", 60.0, True), ("keda", 60.0, True),
                                         ("actuate", None, False), ("keda", None, False)):
            settings = Settings(target={"namespace": "llm", "name": "m"}, mode=mode, prometheus={"url": "http://p:9090"},
                                policy={"min_replicas": 0, "idle_after_s": idle_after_s},
                                admission={"queue_probe_interval_s": None})
            admission = build_admission(settings, None, None, board=board, metrics=ControllerMetrics(),
                                        priorities=PriorityCounter(), clock=SystemClock(), parts=Parts())
            assert admission.holding() is held, (mode, idle_after_s)
        publish(thread, board, replicas=0, ready=0)  # at zero: held in every mode
        assert admission.holding()
    finally:
        thread.close()
