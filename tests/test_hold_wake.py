"""A held request wakes the controller at once: KEDA's StreamIsActive pushes true (through the real gRPC
server, the push latency measured), the loop's sleep ends and the policy reads `held_requests`, and in
actuate mode the scale actuator writes the policy's 0 and the wake's 1 even with `min_replicas: 1`."""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.external_scaler.server import start
from autoscaler.metrics import ControllerMetrics
from autoscaler.runtime import build_scaler
from policies import PRIORITY_CLASSES, Decision

from loopthread import LoopThread
from servers import free_port
from test_deletion_order import FakeScale, fake_kube
from test_keda import REF
from test_loop import controller, settings

# KEDA must see the wake within a second (issue 26); the push itself takes milliseconds.
MAX_PUSH_S = 1.0


def admission_for(board: DecisionBoard) -> Admission:
    return Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                     default_class="standard", retry_after_s=5, max_hold_s=30.0)


def test_stream_is_active_pushes_true_within_a_second_of_a_held_request():
    thread, board = LoopThread(), DecisionBoard()
    admission = admission_for(board)
    port = free_port()
    server = thread.run(start(board, host="127.0.0.1", port=port, namespace="llm", scaled_object="llama",
                              metric_name="desired-replicas"))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ExternalScalerStub(channel)
    latencies_s = []
    try:
        for _ in range(5):
            thread.run(board.publish(Published(Decision(replicas=0), 0, None, time.time(), ready_replicas=0)))
            stream = stub.StreamIsActive(REF)
            assert next(stream).result is False  # at zero, idle
            held_at = time.monotonic()
            hold = asyncio.run_coroutine_threadsafe(admission.hold("standard"), thread.loop)
            assert next(stream).result is True  # pushed by the hold, not by a decision
            latencies_s.append(time.monotonic() - held_at)
            # the loop's wake decision, then its replica Ready (at a decision of 0 the request stays held)
            thread.run(board.publish(Published(Decision(replicas=1), 0, None, time.time(), ready_replicas=0)))
            thread.run(board.set_ready(1))
            assert hold.result(5) is None  # admitted once Ready
            stream.cancel()
    finally:
        channel.close()
        thread.run(server.stop(None))
        thread.close()
    print(f"StreamIsActive push after a held request: median {statistics.median(latencies_s) * 1000:.1f} ms, "
          f"max {max(latencies_s) * 1000:.1f} ms over {len(latencies_s)}")
    assert max(latencies_s) < MAX_PUSH_S


def test_a_held_request_wakes_the_loop_and_is_the_held_requests_signal():
    c, cluster = controller(values={"arrival_rate_per_s": 0.0, "in_flight": 0.0, "queue_depth": 0.0,
                                    "service_time_s": 1.0}, replicas=1)
    c.settings = settings(min_replicas=1, idle_after_s=60.0)
    c.reports_held = True
    admission = admission_for(c.board)

    def count():
        return c.metrics.registry.get_sample_value("autoscaler_loop_duration_seconds_count") or 0

    async def go():
        stop = asyncio.Event()
        task = asyncio.create_task(c.run(stop))
        await c.clock.asleep()
        for _ in range(5):  # idle for 75 s: to zero
            await c.clock.advance(c.settings.tick_s)
            await c.clock.asleep()
        assert cluster.replicas == 0 and c.board.latest.ready_replicas == 0
        ticked, woken_at = count(), c.clock.now()
        hold = asyncio.create_task(admission.hold("critical"))
        for _ in range(200):  # no time passes on the clock: only the hold can start a tick
            if count() > ticked:
                break
            await asyncio.sleep(0.01)
        assert count() == ticked + 1 and c.clock.now() == woken_at
        assert cluster.replicas == 1 and any("wake: held_requests 1" in r for r in c.board.latest.decision.reasons)
        await c.board.set_ready(1)
        assert await asyncio.wait_for(hold, 2) is None
        stop.set()
        await asyncio.wait_for(task, 2)

    asyncio.run(go())


def test_the_scale_actuator_writes_zero_when_idle_after_s_is_set():
    """`min_replicas` is the floor while serving; the idle rule's 0 reaches the target (it was clamped to 1)."""
    scale = FakeScale(2, selector="")  # no pods to mark: the write alone
    idle = settings(min_replicas=1, idle_after_s=60.0)
    actuator = build_scaler(idle, fake_kube(scale), None, metrics=ControllerMetrics())
    assert asyncio.run(actuator.scale(0)) == (2, 0) and scale.replicas == 0
    assert asyncio.run(actuator.scale(1)) == (0, 1)
    serving = build_scaler(settings(min_replicas=1), fake_kube(scale), None, metrics=ControllerMetrics())
    assert asyncio.run(serving.scale(0)) is None and scale.replicas == 1  # no idle rule: the floor holds
