"""One row of a replay timeline (CSV and plot): what was measured at a tick and what was decided or run.

Open-loop replay writes what the policy decided; the simulators write what the simulated cluster ran
after applying the decision (replicas, warm slots, the shed levels in force). Same columns either way."""

from __future__ import annotations

import math
from typing import Mapping

from policies import Decision, Signals


def _value(sample) -> float | str:
    return round(sample.value, 4) if sample is not None and math.isfinite(sample.value) else ""


def _rounded(value: float | None, digits: int) -> float | str:
    return round(value, digits) if value is not None else ""


def timeline_row(
    now: float,
    signals: Signals,
    decision: Decision,
    *,
    replicas: int,
    warm_slots: int,
    shed: Mapping[str, float],
    classes: tuple[str, ...],
    recorded_replicas: int | str | None = None,
) -> dict:
    """`replicas`, `warm_slots` and `shed` are what ran (or, open loop, what was decided); `classes` name
    the shed columns, one per priority class; `recorded_replicas` adds what actually ran (recordings)."""
    cluster = signals.cluster
    row: dict = {
        "t_s": round(now, 3),
        "arrival_rate_per_s": _value(signals.arrival_rate_per_s),
        "forecast_upper_per_s": _rounded(decision.forecast_upper_rate_per_s, 3),
    }
    if recorded_replicas is not None:
        row["recorded_replicas"] = recorded_replicas
    row.update({
        "replicas": replicas,
        "ready": cluster.ready_replicas if cluster else "",
        "warm_slots": warm_slots,
        "queue": _value(signals.queue_depth),
        "p99_wait_s": _value(signals.p99_latency_s),
        **{f"shed_{name}": shed.get(name, 0.0) for name in classes},
        "lead_time_s": _rounded(decision.lead_time_s, 1),
        "valid": decision.valid,
        "reasons": " | ".join(decision.reasons),
    })
    return row
