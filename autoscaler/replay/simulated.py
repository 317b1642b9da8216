"""Simulated replay: demand reconstructed from a recording, the policy driving the simulated cluster, versus
what actually ran.

Demand is the recorded arrival rate (or the rate of the recorded request counter), one value per tick,
served with the recorded mean service time (median of `service_time_s`, else the policy's initial guess).
Its split into priority classes follows the data: the recorded per-priority arrival rates
(`arrival_rate_<class>`, what the admission endpoint counted) tick by tick; a tick without them, or a
recording without any, counts every request in the default class, as the admission endpoint does with
requests that carry no priority header. The classes are the policy's.
Two runs on the same simulated cluster: the predictive policy, and a policy that sets the replica counts
the recording shows (what actually ran). Both are scored the same way, so the comparison is like for like.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import numpy as np

from autoscaler.errors import ConfigError, RecordingError
from autoscaler.replay.recording import Recording
from autoscaler.sim.run import PolicyRun, RunResult, run, sim_config_for
from autoscaler.sim.workload import RateWorkload
from policies import PolicySpec, decide, initial_state
from policies.types import Decision, Signals


def demand_per_tick(recording: Recording, tick_s: float) -> tuple[np.ndarray, int]:
    """Arrival rate per tick from the recording; gaps carry the last known rate. Returns (rates, gaps)."""
    count = int(math.floor((recording.end_s - recording.start_s) / tick_s)) + 1
    rates, gaps, last = np.zeros(count), 0, None
    for i in range(count):
        t = recording.start_s + i * tick_s
        sample = recording.latest("arrival_rate_per_s", t)
        rate = sample.value if sample is not None and t - sample.at_s <= 2 * tick_s else None
        if rate is None:
            now, before = recording.latest("arrivals_total", t), recording.latest("arrivals_total", t - tick_s)
            if now is not None and before is not None and now.at_s > before.at_s and now.value >= before.value:
                rate = (now.value - before.value) / (now.at_s - before.at_s)
        if rate is None or not math.isfinite(rate) or rate < 0:
            gaps += 1
            rate = last
        rates[i] = rate if rate is not None else 0.0
        last = rates[i]
    if not rates.any():
        raise RecordingError(f"{recording.source}: no arrival_rate_per_s or arrivals_total to reconstruct demand from")
    return rates, gaps


def class_mix(recording: Recording, spec: PolicySpec, tick_s: float, ticks: int, default_class: str) -> np.ndarray:
    """Per tick, each class's share of arrivals (ticks x classes, the spec's classes highest first)."""
    classes = spec.classes
    if default_class not in classes:
        raise ConfigError(f"--default-priority {default_class!r} is not one of the policy's classes {list(classes)}")
    unknown = sorted(set(recording.priorities()) - set(classes))
    if unknown:
        raise RecordingError(
            f"{recording.source}: per-priority series for {unknown}, which the policy does not have "
            f"(its classes: {list(classes)}); replay with the policy file the controller ran"
        )
    mix = np.zeros((ticks, len(classes)))
    for i in range(ticks):
        rates = recording.by_priority(recording.start_s + i * tick_s)
        total = sum(rates.values())
        if total > 0:
            mix[i] = [rates.get(name, 0.0) / total for name in classes]
        else:
            mix[i, classes.index(default_class)] = 1.0
    return mix


def follow_recording(recording: Recording):
    """A 'policy' that sets what the recording shows, to score what actually ran."""

    def decide_recorded(spec, state, signals: Signals, now: float):
        sample = recording.latest("spec_replicas", recording.start_s + now)
        if sample is None or not math.isfinite(sample.value):
            current = signals.cluster.spec_replicas if signals.cluster else 0
            return Decision(replicas=current, valid=False, reasons=("recorded: no replica count",)), state
        return Decision(replicas=int(sample.value), reasons=("recorded",)), state

    return decide_recorded


def simulate(
    recording: Recording,
    spec: PolicySpec,
    *,
    default_class: str = "standard",
    progress: Callable[[int], None] | None = None,
) -> tuple[RunResult, RunResult | None, dict]:
    tick = spec.tick_s
    rates, gaps = demand_per_tick(recording, tick)
    services = recording.series.get("service_time_s", ([], []))[1]
    services = [s for s in services if math.isfinite(s) and s > 0]
    service = statistics.median(services) if services else spec.initial_service_time_s
    n = len(rates)
    mix = class_mix(recording, spec, tick, n, default_class)
    workload = RateWorkload(
        name=recording.source,
        scale=1.0,
        window_s=tick,
        rate_per_s=rates,
        client_rate_per_s=rates[None, :],
        client_cv2=np.ones((1, n)),
        service_s=np.full(n, service),
        output_tokens=np.zeros(n),
        priority_mix=mix,
        span_s=n * tick,
        classes=spec.classes,
    )
    config = sim_config_for(spec)
    initial_sample = recording.series.get("spec_replicas")
    initial = int(initial_sample[1][0]) if initial_sample else max(spec.min_replicas, 1)
    ours = run(
        PolicyRun("predictive", spec, decide, initial_state()), workload, config,
        initial_replicas=initial, keep_timeline=True, progress=progress,
    )
    actual = None
    if initial_sample is not None:
        actual = run(
            PolicyRun("recorded", None, follow_recording(recording), None), workload, config,
            initial_replicas=initial, keep_timeline=True,
        )
    info = {"ticks": n, "demand_gaps": gaps, "service_time_s": round(service, 3),
            "priorities": recording.priorities() or f"none recorded: every request counted as {default_class!r}"}
    return ours, actual, info
