"""Open-loop replay: the decision at every tick for the recorded signals, as a table.

This is a fold of `policies.decide` over the recording: the same code path as the live controller, so
what it prints is what the controller would have decided (it cannot say what would have happened next,
since the recorded signals do not react to decisions; the simulated mode does that)."""

from __future__ import annotations

import math
from typing import Callable

from autoscaler.replay.recording import Recording
from policies import PolicySpec, decide, initial_state


def _value(sample) -> float | str:
    return round(sample.value, 4) if sample is not None and math.isfinite(sample.value) else ""


def open_loop(
    recording: Recording, spec: PolicySpec, *, tick_s: float | None = None, progress: Callable[[int], None] | None = None
) -> list[dict]:
    tick = tick_s or spec.tick_s
    state = initial_state()
    rows = []
    count = int(math.floor((recording.end_s - recording.start_s) / tick)) + 1
    for i in range(count):
        now = recording.start_s + i * tick
        signals = recording.signals_at(now)
        decision, state = decide(spec, state, signals, now)
        cluster = signals.cluster
        rows.append(
            {
                "t_s": round(now, 3),
                "arrival_rate_per_s": _value(signals.arrival_rate_per_s),
                "forecast_upper_per_s": (
                    round(decision.forecast_upper_rate_per_s, 3) if decision.forecast_upper_rate_per_s is not None else ""
                ),
                "recorded_replicas": cluster.spec_replicas if cluster else "",
                "replicas": decision.replicas,
                "ready": cluster.ready_replicas if cluster else "",
                "warm_slots": decision.warm_slots,
                "queue": _value(signals.queue_depth),
                "p99_wait_s": _value(signals.p99_latency_s),
                **{f"shed_{name}": level for name, level in sorted(decision.shed.items())},
                "lead_time_s": round(decision.lead_time_s, 1) if decision.lead_time_s is not None else "",
                "valid": decision.valid,
                "reasons": " | ".join(decision.reasons),
            }
        )
        if progress is not None:
            progress(1)
    return rows
