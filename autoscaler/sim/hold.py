"""Requests held at the gateway while a model has no ready replica (scale to zero), and what the hold cost.

While a model is at 0 ready replicas, an arriving request is held (the admission endpoint, or llm-d's
flow control, keeps it) until a replica is Ready. The request-level simulator releases held requests as the
endpoint does (`policies.release`: as far as the Ready replicas take them, the highest class first, then
arrival order); the rate-level one releases a tick's held arrivals at the first Ready. Its hold is its wait
until that release; the wait counts against the SLO like any queue wait (the simulators' waits include it).
A request held longer than `max_hold_s` is dropped: the gateway answers 503 with Retry-After. It is counted
here and as an SLO miss; the request-level simulator never serves it, as the live gateway does not; the
rate-level one still serves it (a client's retry, which the trace does not have).

Figures, weighted by requests (the rate-level simulator holds fractions of a tick's arrivals):
`held_requests`, `hold_p50_s`, `hold_p99_s`, `dropped_held`, `max_hold_s`, and `by_start`: the same count
and hold quantiles by where the wake they waited for landed its first replica ("slot": a free warm or idle
slot, a pod start-up; "node": a new node first), read from the cluster when the wake's first request is held.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from policies.types import ClusterState

MARGIN_S = 60.0  # beyond the slowest cold start the simulated cluster can draw
# Where a wake from zero lands its first replica: a free warm or idle slot (a pod start-up), or a new node.
WAKE_STARTS = ("slot", "node")


def default_max_hold_s(worst_cold_start_s: float) -> float:
    """The longest hold before a 503: the slowest cold start (new node and pod start-up) plus a margin."""
    return worst_cold_start_s + MARGIN_S


@dataclass
class Holds:
    max_hold_s: float
    _holds_s: list[float] = field(default_factory=list)
    _weights: list[float] = field(default_factory=list)
    _dropped: float = 0.0
    _starts: list[str | None] = field(default_factory=list)

    def add(self, hold_s: float, requests: float = 1.0, *, dropped: bool | None = None,
            start: str | None = None) -> None:
        """`requests` held for `hold_s`; `dropped` (default: held longer than `max_hold_s`): answered 503.
        `start`: where the wake they waited for landed its first replica, "slot" or "node" (`WAKE_STARTS`)."""
        if requests > 0:
            self._holds_s.append(hold_s)
            self._weights.append(requests)
            self._starts.append(start)
            if hold_s > self.max_hold_s if dropped is None else dropped:
                self._dropped += requests

    def figures(self) -> dict:
        holds, weights = np.array(self._holds_s), np.array(self._weights)
        total = float(weights.sum())
        by_start = {}
        for start in WAKE_STARTS:
            mine = np.array([s == start for s in self._starts], dtype=bool)
            if mine.any():
                by_start[start] = {"held_requests": round(float(weights[mine].sum()), 1),
                                   "hold_p50_s": _quantile(holds[mine], weights[mine], 0.5),
                                   "hold_p99_s": _quantile(holds[mine], weights[mine], 0.99)}
        return {
            "held_requests": round(total, 1),
            "hold_p50_s": _quantile(holds, weights, 0.5),
            "hold_p99_s": _quantile(holds, weights, 0.99),
            "dropped_held": round(self._dropped, 1),
            "max_hold_s": round(self.max_hold_s, 1),
            **({"by_start": by_start} if by_start else {}),
        }


def wake_start(state: ClusterState) -> str:
    """Where a wake from zero lands its first replica: a free warm or idle slot, else a new node."""
    return "slot" if state.warm_slots_ready + state.idle_slots > 0 else "node"


def _quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """The weighted q-quantile (the smallest value with at least q of the weight at or below it)."""
    if not len(values) or weights.sum() <= 0:
        return None
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return round(float(values[order][np.searchsorted(cum, q * cum[-1])]), 1)
