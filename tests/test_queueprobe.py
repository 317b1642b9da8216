"""The live queue probe behind the saturation guard, against real (fake vLLM) model servers."""

import asyncio

import aiohttp

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.clock import ManualClock
from autoscaler.signals.queueprobe import QueueProbe
from policies import PRIORITY_CLASSES, Decision

from servers import fake_model_server, free_port, post_json


class Static:
    def __init__(self, pods):
        self.pods = pods

    async def endpoints(self):
        return dict(self.pods)


def test_probe_sums_pods_drives_the_guard_and_never_reports_partial_sums():
    with fake_model_server() as a, fake_model_server() as b:
        post_json(f"{a}/admin/state", {"waiting": 30})
        post_json(f"{b}/admin/state", {"waiting": 25})
        pods = Static({"a": f"{a}/metrics", "b": f"{b}/metrics"})

        async def go():
            clock = ManualClock(100.0)
            board = DecisionBoard()
            # the last tick saw an empty queue; the burst arrived since
            decision = Decision(replicas=4, saturation_queue_depth={"sheddable": 40, "standard": 60})
            await board.publish(Published(decision, 4, 0.0, 0.0))
            async with aiohttp.ClientSession() as session:
                probe = QueueProbe(session, pods, "vllm:num_requests_waiting", interval_s=0.2, clock=clock)
                unknown = probe.reading()
                await probe.sample_once()
                total = probe.reading().queue
                admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="p", default_class="standard",
                                      retry_after_s=1, live_queue=probe.reading, clock=clock)
                verdicts = {c: admission.rejection(c) for c in PRIORITY_CLASSES}
                pods.pods["starting"] = f"http://127.0.0.1:{free_port()}/metrics"
                probe._endpoints_at = None
                await clock.advance(0.1)
                await probe.sample_once()  # a pod that refuses the connection serves nothing: it counts 0
                refused = probe.reading()
                post_json(f"{a}/admin/state", {"waiting": 40})
                pods.pods["broken"] = f"{b}/no-metrics-here"  # answers 404
                probe._endpoints_at = None
                await clock.advance(0.1)
                await probe.sample_once()  # one pod unreadable: no partial sum is published
                kept = probe.reading()
                await clock.advance(0.7)  # three intervals on, the last good reading is too old to use
                return unknown, total, verdicts, refused, kept, probe.reading()

        unknown, total, verdicts, refused, kept, stale = asyncio.run(go())
    assert unknown is None and total == 55
    assert verdicts["sheddable"] is not None and "saturated" in verdicts["sheddable"]
    assert verdicts["standard"] is None and verdicts["critical"] is None
    assert refused.queue == 55 and refused.at == 100.1
    assert kept is refused and stale is None  # the 404 published nothing: the reading before it stays


# one Ready replica of 8 slots, completing 4 req/s, standard rejected at a queue of 6 and sheddable at 3
ONE_REPLICA = Decision(replicas=1, saturation_queue_depth={"sheddable": 3, "standard": 6}, saturation_slots=8,
                       saturation_drain_per_s=4.0)


async def one_replica(session, server, clock, **admission):
    """The probe of `server` (waiting and running) and the endpoint guarding with it, on a board that holds
    `ONE_REPLICA` with its replica Ready."""
    board = DecisionBoard()
    await board.publish(Published(ONE_REPLICA, 1, 0.0, 0.0, ready_replicas=1))
    probe = QueueProbe(session, Static({"a": f"{server}/metrics"}), "vllm:num_requests_waiting",
                       in_flight_metric="vllm:num_requests_running", clock=clock)
    return probe, Admission(board, priorities=dict(PRIORITY_CLASSES), header="p", default_class="standard",
                            retry_after_s=1, live_queue=probe.reading, clock=clock, **admission)


def test_between_readings_the_guard_counts_its_own_admissions():
    """A burst inside one probe interval: the reading (no queue, 6 of 8 slots running) is carried forward
    with what the endpoint admitted since, less the 2 free slots and the drain (4 req/s), so the guard
    trips mid-burst instead of at the next reading; time drains it; a new reading starts afresh."""
    with fake_model_server() as server:
        post_json(f"{server}/admin/state", {"waiting": 0, "running": 6})
        async def go():
            clock = ManualClock(100.0)
            async with aiohttp.ClientSession() as session:
                probe, admission = await one_replica(session, server, clock)
                await probe.sample_once()
                reading = probe.reading()
                burst = [admission.rejection("sheddable") for _ in range(8)]
                critical = admission.rejection("critical")
                standard = admission.rejection("standard")
                await clock.advance(1.0)  # 4 served meanwhile
                after = admission.rejection("sheddable")
                post_json(f"{server}/admin/state", {"waiting": 9, "running": 8})
                await clock.advance(0.1)
                await probe.sample_once()
                fresh = admission.queue(ONE_REPLICA)
                return reading, burst, critical, standard, after, fresh

        reading, burst, critical, standard, after, fresh = asyncio.run(go())
    assert reading.queue == 0 and reading.in_flight == 6
    # 2 go to free slots, 3 queue: the sixth request sees a queue of 3 and is rejected
    assert [b is None for b in burst] == [True] * 5 + [False] * 3
    assert "saturated: queue 3" in burst[5]
    assert critical is None and standard is None  # queue 3 (then 4) is below 6
    assert after is None  # 7 admitted - 2 free - 4 served = queue 1
    assert fresh == 9  # the new reading replaces the count


class Counting(Static):
    def __init__(self, pods):
        super().__init__(pods)
        self.lists = 0

    async def endpoints(self):
        self.lists += 1
        return await super().endpoints()


def test_a_replica_the_controller_sees_ready_is_read_at_the_next_probe():
    """A wake releases held requests into a replica as soon as the controller sees it Ready; the probe's pod
    list, refreshed every 15 s, left that replica's queue out until then. A change of the Ready count the
    controller saw re-lists the pods at the next probe, once per change."""
    with fake_model_server() as a, fake_model_server() as b:
        post_json(f"{a}/admin/state", {"waiting": 3})
        post_json(f"{b}/admin/state", {"waiting": 9})
        pods = Counting({"a": f"{a}/metrics"})
        ready = {"n": 1}

        async def go():
            clock = ManualClock(100.0)
            async with aiohttp.ClientSession() as session:
                probe = QueueProbe(session, pods, "vllm:num_requests_waiting", interval_s=1.0, refresh_s=15.0,
                                   clock=clock, ready=lambda: ready["n"])
                await probe.sample_once()
                first = probe.reading().queue
                pods.pods["b"] = f"{b}/metrics"  # b turned Ready; the controller has not seen it yet
                await clock.advance(1.0)
                await probe.sample_once()
                unseen = probe.reading().queue
                ready["n"] = 2  # the controller saw it
                await clock.advance(1.0)
                await probe.sample_once()
                seen = probe.reading().queue
                for _ in range(3):
                    await clock.advance(1.0)
                    await probe.sample_once()
                return first, unseen, seen, pods.lists

        first, unseen, seen, lists = asyncio.run(go())
    assert (first, unseen, seen) == (3, 3, 12)
    assert lists == 2  # the first listing and the one for the change; none while the count stays


def test_a_reading_that_misses_requests_on_their_way_is_floored_by_the_endpoints_own_admissions():
    """A released burst: 24 requests admitted to one 8-slot replica just before a reading that shows none of
    them yet (still on their way to the server: 0 waiting, 0 running). Carried forward, the reading counts only
    the admissions after it, and the guard would see an empty queue; the endpoint's own admissions, drained at
    the slots' full rate (4 req/s), leave 24 - 8 = 16 queued, so a standard request (depth 6) is shed. Once the
    fluid drains (4 s), the next reading decides again."""
    with fake_model_server() as server:
        post_json(f"{server}/admin/state", {"waiting": 0, "running": 0})

        async def go():
            clock = ManualClock(100.0)
            async with aiohttp.ClientSession() as session:
                probe, admission = await one_replica(session, server, clock, replica_slots=8)
                burst = [admission.rejection("critical") for _ in range(24)]
                await clock.advance(0.01)
                await probe.sample_once()  # the burst is not at the server yet
                floored, standard = admission.queue(ONE_REPLICA), admission.rejection("standard")
                await clock.advance(4.0)
                await probe.sample_once()
                drained = admission.queue(ONE_REPLICA)
                return burst, floored, standard, drained

        burst, floored, standard, drained = asyncio.run(go())
    assert burst == [None] * 24  # the top class is never shed
    assert 15.9 < floored <= 16.0 and "saturated: queue 16 >= 6 for standard" in standard
    assert drained == 0
