"""Knative Pod Autoscaler with its defaults (pkg/autoscaler/scaling/autoscaler.go), on concurrency.

- observed concurrency = in-flight + queued; stable window 60 s and panic window 6 s (10 %) averages;
- target per pod = container concurrency x target utilization (70 %);
- desired = ceil(average / target) for each window;
- panic when desiredPanic / ready >= 200 %: no scale-down while panicking, and panic ends only after a full
  stable window without the condition;
- max scale-up rate 1000 (x ready), max scale-down rate 2 (to ready / 2 at the least).
The KPA decides every 2 s; here it is evaluated at the benchmark's tick like every other policy, so its
6 s panic window holds the latest sample.
E.g. 10 ready pods, target 11.2, stable average 150, panic average 300: stable 14, panic 27 -> 27/10 >= 2,
panic mode, 27 replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from policies.types import Decision, Signals


class KpaSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    container_concurrency: float = Field(16.0, gt=0)
    target_utilization_ratio: float = Field(0.7, gt=0, le=1)
    stable_window_s: float = Field(60.0, gt=0)
    panic_window_percentage: float = Field(10.0, gt=0, le=100)
    panic_threshold_percentage: float = Field(200.0, gt=100)
    max_scale_up_rate: float = Field(1000.0, gt=1)
    max_scale_down_rate: float = Field(2.0, gt=1)
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(64, ge=1)

    @property
    def target_per_pod(self) -> float:
        return self.container_concurrency * self.target_utilization_ratio


@dataclass(frozen=True, slots=True)
class KpaState:
    samples: tuple[tuple[float, float], ...] = ()
    panic_since_s: float | None = None
    max_panic_pods: int = 0


def initial_state() -> KpaState:
    return KpaState()


def _average(samples: tuple[tuple[float, float], ...], now: float, window_s: float) -> float:
    inside = [v for t, v in samples if now - t < window_s]
    return sum(inside) / len(inside) if inside else 0.0


def decide(spec: KpaSpec, state: KpaState, signals: Signals, now: float) -> tuple[Decision, KpaState]:
    cluster = signals.cluster
    current = cluster.spec_replicas if cluster else 0
    if cluster is None or signals.in_flight is None:
        return Decision(replicas=current, valid=False, reasons=("kpa: no concurrency metric",)), state
    observed = signals.in_flight.value + (signals.queue_depth.value if signals.queue_depth else 0.0)
    samples = tuple(e for e in state.samples if now - e[0] < spec.stable_window_s) + ((now, observed),)
    panic_window = spec.stable_window_s * spec.panic_window_percentage / 100.0
    stable = _average(samples, now, spec.stable_window_s)
    panic = _average(samples, now, panic_window) if panic_window >= 1 else observed
    ready = max(1, cluster.ready_replicas)
    desired_stable = math.ceil(stable / spec.target_per_pod)
    desired_panic = math.ceil(panic / spec.target_per_pod)
    max_up = math.ceil(spec.max_scale_up_rate * ready)
    min_down = math.floor(ready / spec.max_scale_down_rate)
    desired_stable = min(max_up, max(min_down, desired_stable))
    desired_panic = min(max_up, max(min_down, desired_panic))
    is_over = desired_panic / ready >= spec.panic_threshold_percentage / 100.0
    panic_since, max_panic = state.panic_since_s, state.max_panic_pods
    if is_over:
        panic_since = now if panic_since is None else panic_since
    elif panic_since is not None and now - panic_since >= spec.stable_window_s:
        panic_since, max_panic = None, 0
    if panic_since is not None:
        if is_over:
            panic_since = now  # the stable window restarts while the condition holds
        desired = max(desired_panic, max_panic)
        max_panic = desired
        why = f"kpa: panic, {panic:.0f} concurrent -> {desired}"
    else:
        desired = desired_stable
        why = f"kpa: stable, {stable:.0f} concurrent -> {desired}"
    desired = min(spec.max_replicas, max(spec.min_replicas, desired))
    return Decision(replicas=desired, reasons=(why,)), KpaState(samples, panic_since, max_panic)
