"""Open-loop replay: the decision at every tick for the recorded signals, as a table.

This is a fold of `policies.decide` over the recording: the same code path as the live controller, so
what it prints is what the controller would have decided (it cannot say what would have happened next,
since the recorded signals do not react to decisions; the simulated mode does that)."""

from __future__ import annotations

import math
from typing import Callable

from autoscaler.replay.recording import Recording
from autoscaler.timeline import timeline_row
from policies import PolicySpec, decide, initial_state


def open_loop(recording: Recording, spec: PolicySpec, *, progress: Callable[[int], None] | None = None) -> list[dict]:
    state = initial_state()
    rows = []
    count = int(math.floor((recording.end_s - recording.start_s) / spec.tick_s)) + 1
    for i in range(count):
        now = recording.start_s + i * spec.tick_s
        signals = recording.signals_at(now)
        decision, state = decide(spec, state, signals, now)
        cluster = signals.cluster
        rows.append(timeline_row(
            now, signals, decision, replicas=decision.replicas, warm_slots=decision.warm_slots,
            shed=decision.shed, classes=spec.classes, recorded_replicas=cluster.spec_replicas if cluster else "",
        ))
        if progress is not None:
            progress(1)
    return rows
