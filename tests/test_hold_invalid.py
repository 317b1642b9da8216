"""Scale to zero: a decision that cannot be made (valid=False) does not send held requests to no replica.

Under load a tick can miss its deadline reading the cluster, or find the pods' signals gone; the decision is
then invalid and does not know, or knows 0, Ready replicas. Releasing the held requests on it sent them to no
replica: in the closed loop (`python -m loadtest.e2e --scenario scale-to-zero`) one such tick during the
cold start answered about 640 held requests 502. A held request now waits through it (until a Ready replica,
a stale decision, or `max_hold_s`), and a new request is held while 0 Ready replicas are known, valid
decision or not. Through the endpoint's ext_authz contract, as in tests/test_hold.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from autoscaler.board import Published
from policies import Decision
from test_hold import MAX_HOLD_S, at_zero, stack, wait_for  # noqa: F401  (stack: the fixture)
from test_admission import get


def invalid(board, thread, *, ready):
    decision = Decision(replicas=1, valid=False, reasons=("hold: no usable cluster state",))
    thread.run(board.publish(Published(decision, 1, None, 0.0, ready_replicas=ready)))


def test_a_held_request_waits_through_an_invalid_decision_and_goes_when_a_replica_is_ready(stack):  # noqa: F811
    thread, board, endpoint = stack["thread"], stack["board"], stack["endpoint"]
    at_zero(board, thread)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(get, f"{endpoint}/ext_authz/v1/completions", "standard")
        wait_for(lambda: board.held_requests == 1)
        for ready in (None, 0):  # the cluster unreadable for a tick; then the signals gone
            invalid(board, thread, ready=ready)
            time.sleep(0.3)
            assert not answer.done(), f"released on an invalid decision with ready {ready}"
        thread.run(board.set_ready(1))
        assert answer.result(5)[0] == 200
    assert [outcome for outcome, _, _ in stack["holds"]] == ["admitted"]


def test_a_new_request_is_held_while_an_invalid_decision_knows_no_replica_is_ready(stack):  # noqa: F811
    thread, board, endpoint = stack["thread"], stack["board"], stack["endpoint"]
    invalid(board, thread, ready=0)
    started = time.monotonic()
    status, headers = get(f"{endpoint}/ext_authz/", "standard")
    assert status == 503 and headers["Retry-After"] == "7"  # held, then expired: deliberate, not a 502
    assert time.monotonic() - started >= MAX_HOLD_S


def test_a_decision_that_does_not_know_the_ready_replicas_holds_after_a_known_zero(stack):  # noqa: F811
    """A tick that missed reading the cluster during a cold start: the latest count known was 0, so a new
    request would reach no replica (in the closed loop such requests were answered 502 within 0.1 s). Held,
    and released once a replica is Ready. With no Ready count ever known: fail open, as before."""
    thread, board, endpoint = stack["thread"], stack["board"], stack["endpoint"]
    invalid(board, thread, ready=None)
    started = time.monotonic()
    assert get(f"{endpoint}/ext_authz/", "standard")[0] == 200 and time.monotonic() - started < 0.5
    at_zero(board, thread)
    invalid(board, thread, ready=None)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(get, f"{endpoint}/ext_authz/v1/completions", "standard")
        wait_for(lambda: board.held_requests == 1)
        time.sleep(0.3)
        assert not answer.done(), "admitted on a decision that does not know the Ready replicas after 0"
        thread.run(board.set_ready(1))
        assert answer.result(5)[0] == 200
