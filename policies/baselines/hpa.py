"""Kubernetes HPA (autoscaling/v2) with its documented defaults, on a per-pod concurrency metric.

The metric is in-flight + waiting requests per ready pod (a Pods metric served by prometheus-adapter),
target `target_per_pod`. Algorithm (pkg/controller/podautoscaler/replica_calculator.go):
- usage ratio = average over ready pods / target; within `tolerance` (0.1) of 1 -> no change;
- when scaling up, pods not yet ready count as using 0 (so a scale-up in flight is not repeated), and if
  that flips the direction, nothing changes; desired = ceil(ratio x pods counted);
- behavior defaults: scale-up stabilization 0 s, policies 100 % or 4 pods per 15 s, the larger (selectPolicy
  Max); scale-down stabilization 300 s (highest recommendation in the window), policy 100 % per 15 s.
E.g. 4 ready pods averaging 18 against a target of 12: ratio 1.5 -> ceil(1.5 x 4) = 6 replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from policies.types import Decision, Signals


class HpaSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    target_per_pod: float = Field(12.0, gt=0, description="Target in-flight + queued requests per pod.")
    tolerance_ratio: float = Field(0.1, ge=0)
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(64, ge=1)
    sync_period_s: float = Field(15.0, gt=0)
    scale_up_percent: float = Field(100.0, gt=0)
    scale_up_pods: int = Field(4, ge=1)
    scale_up_period_s: float = Field(15.0, gt=0)
    scale_down_stabilization_s: float = Field(300.0, ge=0)
    external_average_value: bool = Field(
        False, description="True: External metric with AverageValue (KEDA): ratio uses spec replicas."
    )


@dataclass(frozen=True, slots=True)
class HpaState:
    recommendations: tuple[tuple[float, int], ...] = ()
    last_sync_s: float | None = None
    # (time, replicas added) for the scale-up policy's period.
    scale_ups: tuple[tuple[float, int], ...] = ()


def initial_state() -> HpaState:
    return HpaState()


def raw_recommendation(spec: HpaSpec, *, total: float, ready: int, starting: int, current: int) -> int:
    """The replica calculator: what the metric asks for, before behavior rules."""
    if spec.external_average_value:
        # External AverageValue: usage ratio = value / (target x current replicas).
        ratio = total / (spec.target_per_pod * max(current, 1))
        if abs(ratio - 1.0) <= spec.tolerance_ratio:
            return current
        return math.ceil(total / spec.target_per_pod)
    if ready == 0:
        return current
    ratio = total / (ready * spec.target_per_pod)
    if starting > 0 and ratio > 1.0:
        # Unready pods count as 0 usage on scale-up.
        ratio = total / ((ready + starting) * spec.target_per_pod)
        if ratio <= 1.0 or abs(ratio - 1.0) <= spec.tolerance_ratio:
            return current
        return math.ceil(ratio * (ready + starting))
    if abs(ratio - 1.0) <= spec.tolerance_ratio:
        return current
    return math.ceil(ratio * ready)


def decide(spec: HpaSpec, state: HpaState, signals: Signals, now: float) -> tuple[Decision, HpaState]:
    cluster = signals.cluster
    current = cluster.spec_replicas if cluster else 0
    if cluster is None or signals.in_flight is None:
        return Decision(replicas=current, valid=False, reasons=("hpa: metrics unavailable",)), state
    if state.last_sync_s is not None and now - state.last_sync_s < spec.sync_period_s - 1e-9:
        return Decision(replicas=current, reasons=("hpa: between syncs",)), state
    total = signals.in_flight.value + (signals.queue_depth.value if signals.queue_depth else 0.0)
    rec = raw_recommendation(
        spec, total=total, ready=cluster.ready_replicas, starting=cluster.starting_replicas, current=current
    )
    rec = min(spec.max_replicas, max(spec.min_replicas, rec))
    window = tuple(e for e in state.recommendations if now - e[0] < spec.scale_down_stabilization_s)
    window += ((now, rec),)
    desired = rec
    if rec < current:
        desired = min(current, max(r for _, r in window))
    ups = tuple(e for e in state.scale_ups if now - e[0] < spec.scale_up_period_s)
    added = sum(n for _, n in ups)
    base = current - added  # replicas at the start of the policy period
    limit = max(math.ceil(base * (1 + spec.scale_up_percent / 100.0)), base + spec.scale_up_pods)
    desired = min(desired, max(limit, current))
    if desired > current:
        ups += ((now, desired - current),)
    reason = f"hpa: metric {total:.0f} over {cluster.ready_replicas} ready pods -> {rec}, desired {desired}"
    return Decision(replicas=desired, reasons=(reason,)), HpaState(window, now, ups)
