"""Where a wake from zero landed its first replica (the decision's `wake_start`), kept by the board past the wake
and counted with each hold (`autoscaler_admission_wake_hold_seconds{start}`)."""

import asyncio

from prometheus_client import generate_latest

from autoscaler.board import DecisionBoard, Published
from autoscaler.metrics import ControllerMetrics
from policies import Decision


def test_the_board_keeps_the_latest_wakes_start_and_the_hold_is_counted_by_it():
    board, metrics = DecisionBoard(), ControllerMetrics()

    async def publish(decision: Decision, ready: int) -> None:
        await board.publish(Published(decision, decision.replicas, 0.0, 0.0, ready_replicas=ready))

    metrics.observe_hold("admitted", 3.0, board.last_wake_start)  # a hold before any wake
    asyncio.run(publish(Decision(replicas=1, wake_start="node"), 0))
    asyncio.run(publish(Decision(replicas=1), 1))  # the wake is over; its held requests leave after it
    assert board.last_wake_start == "node"
    metrics.observe_hold("admitted", 420.0, board.last_wake_start)
    metrics.observe_hold("expired", 600.0, board.last_wake_start)
    asyncio.run(publish(Decision(replicas=1, wake_start="slot"), 0))
    metrics.observe_hold("admitted", 130.0, board.last_wake_start)
    text = generate_latest(metrics.registry).decode()
    assert 'autoscaler_admission_wake_hold_seconds_count{start="node"} 2.0' in text
    assert 'autoscaler_admission_wake_hold_seconds_sum{start="node"} 1020.0' in text
    assert 'autoscaler_admission_wake_hold_seconds_count{start="slot"} 1.0' in text
    assert 'autoscaler_admission_wake_hold_seconds_count{start="unknown"} 1.0' in text
    assert 'autoscaler_admission_hold_seconds_count{outcome="admitted"} 3.0' in text
