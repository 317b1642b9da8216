"""The overrun rule: while the top class alone arrives faster than the Ready slots complete requests, every
guarded class is rejected while a request waits.

At the board and clock seams (a manual clock, a probe reading set by the test), without HTTP: a request here
is `Admission.rejection`, as the endpoint's handlers call it. The HTTP path through the real nginx is
tests/test_admission.py; the simulators' side is tests/test_simulator.py.
"""

from __future__ import annotations

import asyncio

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.clock import ManualClock
from autoscaler.signals.queueprobe import QueueReading
from policies import PRIORITY_CLASSES, Decision
from policies.admission import overrun_rejects, top_outruns

from helpers import endpoint_serving

# 4 Ready replicas of 8 slots completing 3 req/s between them; standard rejected from 20 queued, sheddable from 10
SERVING = Decision(replicas=4, saturation_slots=32, saturation_drain_per_s=3.0,
                   saturation_queue_depth={"sheddable": 10, "standard": 20})


def endpoint(reading: list) -> tuple[ManualClock, Admission]:
    return endpoint_serving(SERVING, reading)


def test_the_rule():
    assert top_outruns(top_arrivals=4, window_s=1.0, drain_per_s=3.0)
    assert not top_outruns(top_arrivals=3, window_s=1.0, drain_per_s=3.0)  # exactly the drain: kept up with
    assert not top_outruns(top_arrivals=500, window_s=1.0, drain_per_s=0.0)  # no drain known: never
    assert overrun_rejects(queue=0.5) and not overrun_rejects(queue=0.0) and not overrun_rejects(queue=None)


def test_critical_outrunning_the_drain_rejects_the_guarded_classes_while_a_request_waits():
    reading = [QueueReading(queue=5.0, in_flight=32.0, at=100.0)]  # 5 waiting, below both depths
    clock, admission = endpoint(reading)
    assert admission.rejection("standard") is None and admission.rejection("sheddable") is None
    for _ in range(4):  # 4 critical within the second against 3 completed a second
        assert admission.rejection("critical") is None
        clock.t += 0.1
    reason = admission.rejection("standard")
    assert reason is not None and reason.startswith("top class outruns the drain")
    assert admission.rejection("sheddable") is not None
    assert admission.rejection("critical") is None  # the top class is always admitted


def test_with_free_slots_or_once_the_second_has_passed_nothing_more_is_rejected():
    reading = [QueueReading(queue=0.0, in_flight=20.0, at=100.0)]  # 12 slots free
    clock, admission = endpoint(reading)
    for _ in range(6):
        admission.rejection("critical")
    assert admission.rejection("standard") is None  # no queue: it takes a free slot
    reading[0] = QueueReading(queue=5.0, in_flight=32.0, at=clock.now())
    assert admission.rejection("standard") is not None  # the same second, now with a queue
    clock.t += 1.0  # the six critical requests are a second old: the window holds none
    assert admission.rejection("standard") is None


def test_no_probe_reading_and_no_drain_keep_the_guard_as_it_was():
    reading = [None]  # the probe knows nothing and no tick value either: the guard cannot act
    clock, admission = endpoint(reading)
    for _ in range(10):
        admission.rejection("critical")
    assert admission.rejection("standard") is None
    reading[0] = QueueReading(queue=5.0, in_flight=32.0, at=clock.now())
    without_drain = Decision(replicas=4, saturation_slots=32, saturation_queue_depth={"standard": 20})
    asyncio.run(admission.board.publish(Published(without_drain, 4, 0.0, clock.now(), ready_replicas=4)))
    assert admission.rejection("standard") is None  # a decision that gives no drain: nothing to compare with


def test_requests_released_from_a_hold_neither_count_nor_meet_the_rule():
    """A wake: 4 critical and 2 standard requests held while no replica is Ready (1 replica of 8 slots
    completing 0.8 req/s, standard guarded from 2 queued). The replica turns Ready and the release lets all six
    go, with half a request queued by the probe's reading: the 4 critical are more than 0.8 a second, but the
    release paced them, so the released standard requests are admitted (the guard's depth is not reached);
    a new standard request after 4 new critical ones in the same second is rejected."""
    from aiohttp.test_utils import make_mocked_request

    serving = Decision(replicas=1, saturation_slots=8, saturation_drain_per_s=0.8,
                       saturation_queue_depth={"sheddable": 1, "standard": 2})

    async def scenario() -> tuple[list[int], int]:
        clock = ManualClock(100.0)
        board = DecisionBoard(clock=clock)
        reading = [QueueReading(queue=0.5, in_flight=0.0, at=100.0)]
        admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="h", default_class="standard",
                              retry_after_s=5, clock=clock, max_hold_s=600.0, replica_slots=8,
                              live_queue=lambda: reading[0])
        await board.publish(Published(serving, 1, 0.0, clock.now(), ready_replicas=1))
        await board.publish(Published(Decision(replicas=1), 0, None, clock.now(), ready_replicas=0))

        def call(cls: str):
            return admission.ext_authz(make_mocked_request("GET", "/ext_authz/x", headers={"h": cls}))

        held = [asyncio.ensure_future(call(c)) for c in ["critical"] * 4 + ["standard"] * 2]
        await asyncio.sleep(0.1)
        assert not any(task.done() for task in held)  # no replica Ready: all six wait
        await board.publish(Published(serving, 1, 0.0, clock.now(), ready_replicas=1))
        statuses = [(await asyncio.wait_for(task, 5)).status for task in held]
        for _ in range(4):
            await call("critical")
        return statuses, (await call("standard")).status

    released, fresh = asyncio.run(scenario())
    assert released == [200] * 6
    assert fresh == 429
