"""Held requests leave as the Ready replicas take them, the top class first, then in arrival order.

At the board and clock seams (a manual clock for the drain, the board's `set_ready` for replicas turning
Ready), without HTTP: a request here is `Admission.hold` then `Admission.rejection`, as the endpoint's
handlers do. Before this, every held request was released at the first Ready replica: in the closed loop
(`python -m loadtest.e2e --scenario scale-to-zero`) about 1300 went to one 8-slot replica, whose queue
outgrew the gateway's read timeout (69 to 427 answered 504). The HTTP path through the real nginx is
tests/test_hold.py.
"""

from __future__ import annotations

import asyncio

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.clock import ManualClock
from autoscaler.release import HeldQueue, Ledger, occupied, per_replica
from autoscaler.signals.queueprobe import QueueReading
from policies import PRIORITY_CLASSES, Decision

SLOTS = 8
# One Ready replica as the policy described it before the silence: 8 slots, 0.8 req/s (10 s per request),
# the deepest saturation guard 2 queued requests: a Ready replica takes 8 + 2 at once.
SERVING = Decision(replicas=1, saturation_slots=SLOTS, saturation_drain_per_s=0.8,
                   saturation_queue_depth={"sheddable": 1, "standard": 2})
WAKING = Decision(replicas=3)  # ordered at the wake, made with no Ready replica


def endpoint(board: DecisionBoard, reading=None) -> Admission:
    return Admission(board, priorities=dict(PRIORITY_CLASSES), header="h", default_class="standard",
                     retry_after_s=5, max_hold_s=600.0, clock=board.clock, replica_slots=SLOTS,
                     live_queue=(lambda: reading[0]) if reading is not None else None)


async def request(admission: Admission, cls: str, order: list[str], tag: str) -> str | None:
    """One request through the endpoint: held, then the ordinary answer (the guard, shed levels)."""
    dropped = await admission.hold(cls)
    reason = dropped or admission.rejection(cls)
    order.append(tag)
    return reason


async def settle() -> None:
    await asyncio.sleep(0.3)  # the release re-checks every RELEASE_STEP_S (0.05 s): room for a loaded machine


async def waking(*, at_s: float = 0.0, reading=None, stale_after_s: float | None = None):
    """A model that served (the endpoint learns what a replica takes), went to zero, and is waking: its
    manual clock, board and admission endpoint."""
    clock = ManualClock(at_s)
    board = DecisionBoard(clock=clock, stale_after_s=stale_after_s)
    admission = endpoint(board, reading)
    await board.publish(Published(SERVING, 1, 0.0, clock.now(), ready_replicas=1))
    await board.publish(Published(WAKING, 0, None, clock.now(), ready_replicas=0))
    return clock, board, admission


def test_a_ready_replica_takes_its_slots_and_queue_allowance_then_more_as_requests_finish():
    async def run():
        clock, board, admission = await waking(at_s=100.0)
        order: list[str] = []
        # 16 held: standard and sheddable first, the critical ones arriving last
        classes = ["standard", "sheddable"] * 6 + ["critical"] * 4
        tasks = []
        for i, cls in enumerate(classes):
            tasks.append(asyncio.ensure_future(request(admission, cls, order, f"{cls}-{i}")))
            await asyncio.sleep(0)
        await settle()
        assert order == [] and board.held_requests == 16
        await board.publish(Published(SERVING, 0, None, clock.now(), ready_replicas=1))  # a tick: 1 Ready
        await settle()
        # 10 = 8 slots + 2 queued: the higher class first, then arrival order
        assert order == ["critical-12", "critical-13", "critical-14", "critical-15",
                         "standard-0", "standard-2", "standard-4", "standard-6", "standard-8", "standard-10"]
        await clock.advance(5.0)  # 0.8 req/s finished for 5 s: room for 4 more
        await settle()
        assert order[10:] == ["sheddable-1", "sheddable-3", "sheddable-5", "sheddable-7"]
        await board.set_ready(2)  # another replica Ready: the last two go
        await settle()
        assert len(order) == 16 and board.held_requests == 0
        assert [t.result() for t in tasks] == [None] * 16
        # nothing held: a new request is answered at once, whatever the queue (the saturation guard's part)
        assert await asyncio.wait_for(admission.hold("standard"), 0.1) is None

    asyncio.run(run())


def test_a_request_arriving_while_others_are_held_queues_behind_them():
    async def run():
        clock, board, admission = await waking()
        order: list[str] = []
        first = [asyncio.ensure_future(request(admission, "standard", order, f"held-{i}")) for i in range(12)]
        await settle()
        await board.set_ready(1)
        await settle()
        assert len(order) == 10
        late = asyncio.ensure_future(request(admission, "standard", order, "late"))
        await settle()
        assert not late.done() and admission.holding() is False  # Ready, but two are still held before it
        await clock.advance(4.0)  # 3.2 finished: the two held ones, then the late one
        await settle()
        assert order[10:] == ["held-10", "held-11", "late"]
        await asyncio.gather(*first, late)

    asyncio.run(run())


def test_the_probe_reading_counts_what_the_replicas_are_serving():
    """A fresh reading of the pods' queue and running requests bounds the release, carried forward with the
    endpoint's own admissions since and the replicas' completions."""
    async def run():
        reading = [None]
        clock, board, admission = await waking(reading=reading)
        order: list[str] = []
        tasks = [asyncio.ensure_future(request(admission, "standard", order, str(i))) for i in range(12)]
        await settle()
        reading[0] = QueueReading(queue=1.0, in_flight=8.0, at=clock.now())  # full: requests admitted earlier
        await board.set_ready(1)
        await settle()
        assert order == ["0"]  # 10 - 9 being served
        await clock.advance(2.5)  # two finished since the reading
        await settle()
        assert order == ["0", "1", "2"]
        await clock.advance(0.1)  # a reading taken after those admissions (at the same instant it counts them)
        reading[0] = QueueReading(queue=0.0, in_flight=3.0, at=clock.now())  # the pods say: 3 running
        await settle()
        assert len(order) == 10  # 7 more
        reading[0] = None  # the probe stopped knowing: the endpoint's own count (its ledger) rules
        await board.set_ready(2)
        await settle()
        assert len(order) == 12
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_a_reading_that_misses_a_new_replica_does_not_release_again_what_the_endpoint_just_sent():
    """The probe re-lists the pods every few seconds: fresh readings of the pods it knows (none busy) while
    the replica that just turned Ready has the 10 requests released to it. The endpoint's own count bounds
    the release until they finish (before, each reading released another 10)."""
    async def run():
        reading = [None]
        clock, board, admission = await waking(reading=reading)
        order: list[str] = []
        tasks = [asyncio.ensure_future(request(admission, "standard", order, str(i))) for i in range(30)]
        await settle()
        reading[0] = QueueReading(queue=0.0, in_flight=0.0, at=clock.now())
        await board.set_ready(1)
        await settle()
        assert len(order) == 10
        for _ in range(3):
            await clock.advance(0.5)
            reading[0] = QueueReading(queue=0.0, in_flight=0.0, at=clock.now())  # the new pod not listed
            await settle()
        assert len(order) == 11  # 1.5 s of 0.8 req/s finished: one more, not 30
        await board.publish(Published(WAKING, 0, None, clock.now(), ready_replicas=0))
        await clock.advance(31.0)
        await asyncio.sleep(1.2)  # the rest expire (max_hold_s 600 s: not yet), so release them to end
        await board.set_ready(10)
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_held_requests_still_expire_and_a_stale_decision_still_releases_them_all():
    async def run():
        reading = [None]
        clock, board, admission = await waking(reading=reading, stale_after_s=1000.0)
        admission.max_hold_s = 30.0
        order: list[str] = []
        tasks = [asyncio.ensure_future(request(admission, "critical", order, str(i))) for i in range(12)]
        await settle()
        await board.set_ready(1)
        reading[0] = QueueReading(queue=2.0, in_flight=8.0, at=clock.now())  # the replica full
        await settle()
        assert order == []
        await clock.advance(31.0)  # past max_hold_s, the replica still full
        reading[0] = QueueReading(queue=2.0, in_flight=8.0, at=clock.now())
        await asyncio.sleep(1.2)  # a held request re-checks its deadline every HOLD_RECHECK_S
        assert [t.result() for t in tasks] == ["no replica Ready after 30 s"] * 12  # 503: critical too, at max
        await board.publish(Published(WAKING, 0, None, clock.now(), ready_replicas=0))
        rest = [asyncio.ensure_future(request(admission, "standard", order, f"r{i}")) for i in range(40)]
        await settle()
        assert board.held_requests == 40
        await clock.advance(1001.0)  # no tick since: the decision is stale, fail open, every held one goes
        await asyncio.sleep(1.2)
        assert all(t.done() and t.result() is None for t in rest) and board.held_requests == 0

    asyncio.run(run())


def test_the_pieces():
    assert per_replica(Decision(replicas=0), SLOTS) is None
    per = per_replica(Decision(replicas=4, saturation_slots=16, saturation_drain_per_s=1.6,
                               saturation_queue_depth={"sheddable": 2, "standard": 4}), SLOTS)
    assert (per.slots, per.allowance, per.drain_per_s) == (8, 2.0, 0.8)
    assert occupied(queue=3, in_flight=8, admitted=5, drain_per_s=8, elapsed_s=0.5) == 12
    assert occupied(queue=0, in_flight=1, admitted=0, drain_per_s=8, elapsed_s=10) == 0
    ledger = Ledger()
    ledger.add(0.0, 1.0)
    ledger.add(0.0, 1.0)
    assert ledger.now(1.5, 1.0) == 0.5 and ledger.now(10.0, 1.0) == 0.0

    async def order():
        queue = HeldQueue()
        waiters = [queue.push(p) for p in (0, -1, 1, 0, 1)]
        queue.leave(waiters[2])  # the first critical left (its client went away)
        assert queue.release(2.5) == 2
        return waiters, queue

    waiters, queue = asyncio.run(order())
    assert [w.released for w in waiters] == [True, False, False, False, True]
    assert queue.waiting == 2 and queue.releasing == 2
