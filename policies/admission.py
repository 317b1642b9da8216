"""What the admission endpoint (and the simulators standing in for it) computes per request, between ticks.

The decision carries, per guarded priority, the queue depth at which that priority is rejected
(`Decision.saturation_queue_depth`), and how to carry a queue reading forward: the ready slots and the
requests per second they complete (`saturation_slots`, `saturation_drain_per_s`). The queue itself is read
by a probe every second or so; a burst can arrive within one reading, so the endpoint counts its own
admissions since the reading and `carried_queue` turns them into the queue now. `classify` turns the
priority header the gateway set into a class.

A burst can also outrun the guard: its depths leave the top class the queue from their depth to the SLO's,
which the top class fills within a second once its own arrivals come faster than the ready slots complete
requests. While they do (`top_outruns`), every request of a guarded class that would queue is one the top
class waits behind, so the endpoint rejects every guarded class while any request waits (`overrun_rejects`).

Behind per-replica gateway queues the decision may also keep slots free for the top class
(`Decision.saturation_reserve`, sized in `policies/reserve.py`): a guarded class is rejected while the requests
in the servers, served or queued, number at least the Ready slots less the reserve (`reserve_rejects`).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Mapping


def carried_queue(
    *, queue: float, in_flight: float | None, admitted: float, slots: int, drain_per_s: float, elapsed_s: float
) -> float:
    """The queue `elapsed_s` after a reading of `queue` waiting and `in_flight` running, given the
    `admitted` requests since: those that fit in the slots free at the reading, or that the slots served
    meanwhile (`drain_per_s`), did not queue; the rest did. Unknown in-flight counts no free slot.
    E.g. a reading of 10 queued with 60 of 64 slots busy, 30 admitted since and 20 req/s drained over 0.5 s:
    10 + max(0, 30 - 4 - 10) = 26."""
    free = max(0.0, slots - in_flight) if in_flight is not None else 0.0
    return queue + max(0.0, admitted - free - drain_per_s * max(0.0, elapsed_s))


# How long a window of the top class's arrivals `top_outruns` compares with the drain: the queue probe's interval,
# so the rule reads the same second the queue reading does.
OVERRUN_WINDOW_S = 1.0


def top_outruns(*, top_arrivals: float, window_s: float, drain_per_s: float) -> bool:
    """Whether the top class alone arrived faster than the ready slots complete requests: more than
    `drain_per_s` x `window_s` of its requests in the last `window_s`. No drain known (0: no Ready replica,
    or a decision that does not say) is never an overrun: the rule only tightens a guard that has a drain to
    compare with. E.g. 60 critical requests in the last second against 53.3 req/s completed: an overrun."""
    return drain_per_s > 0 and window_s > 0 and top_arrivals > drain_per_s * window_s


class TopArrivals:
    """When the top class's requests came, over the last `window_s`: what `top_outruns` counts, kept the same
    way by the endpoint (on its clock) and the request simulator (on the trace's). `maxlen` bounds the memory
    should arrivals outrun it (the count is then at most `maxlen`)."""

    def __init__(self, window_s: float = OVERRUN_WINDOW_S, *, maxlen: int | None = None) -> None:
        self.window_s = window_s
        self._at: deque[float] = deque(maxlen=maxlen)

    def add(self, t: float) -> None:
        self._at.append(t)
        self._trim(t)

    def outruns(self, t: float, drain_per_s: float) -> bool:
        """`top_outruns` over the requests of the window that ends at `t`."""
        self._trim(t)
        return top_outruns(top_arrivals=len(self._at), window_s=self.window_s, drain_per_s=drain_per_s)

    def _trim(self, t: float) -> None:
        while self._at and self._at[0] <= t - self.window_s:
            self._at.popleft()


def overrun_rejects(*, queue: float | None) -> bool:
    """While the top class outruns the drain, a guarded class is rejected while any request waits (the queue
    the endpoint sees above 0): admitted, it would queue ahead of the top class's next requests. With free
    slots (no queue) it is admitted as before; an unknown queue rejects nothing (fail open)."""
    return queue is not None and queue > 0


def reserve_rejects(*, busy: float | None, slots: int, reserve: int) -> bool:
    """Whether a guarded class is rejected to keep `reserve` of the Ready `slots` free for the top class: the
    requests in the servers (`busy`: a probe reading of queue + running carried forward, `release.occupied`)
    number at least `slots` - `reserve`. No reserve, or nothing known of the requests running (a reading
    without in-flight): nothing (fail open). E.g. 31 busy of 32 slots with 1 kept: rejected."""
    return reserve > 0 and busy is not None and busy >= slots - reserve


# Gateway API priorities are 32-bit integers (InferenceObjective.priority): anything wider is not a priority,
# and a bounded pattern keeps a 4,000-digit header from costing a big-integer parse.
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INTEGER = re.compile(r"[+-]?[0-9]{1,10}")


def classify(raw: str | None, priorities: Mapping[str, int], *, default: str, unknown: str) -> tuple[str, bool]:
    """The class of a priority header's value, and whether the value named one. A class name matches in any
    case (`Sheddable` is sheddable); a 32-bit integer maps to the class with the largest priority not above
    it (below them all: the lowest class), e.g. with critical 1, standard 0, sheddable -1: 5 is critical,
    -3 sheddable. No value (or a blank one) is `default`; anything else (a misspelt name, 1e3, an integer
    beyond 32 bits) is `unknown`, and not recognised."""
    if raw is None or not raw.strip():
        return default, True
    value = raw.strip()
    by_name = {name.casefold(): name for name in priorities}
    if value.casefold() in by_name:
        return by_name[value.casefold()], True
    if not _INTEGER.fullmatch(value) or not _INT32_MIN <= int(value) <= _INT32_MAX:
        return unknown, False
    ordered = sorted(priorities, key=priorities.__getitem__)
    at_or_below = [name for name in ordered if priorities[name] <= int(value)]
    return (at_or_below[-1] if at_or_below else ordered[0]), True
