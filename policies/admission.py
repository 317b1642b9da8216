"""What the admission endpoint (and the simulators standing in for it) computes per request, between ticks.

The decision carries, per guarded priority, the queue depth at which that priority is rejected
(`Decision.saturation_queue_depth`), and how to carry a queue reading forward: the ready slots and the
requests per second they complete (`saturation_slots`, `saturation_drain_per_s`). The queue itself is read
by a probe every second or so; a burst can arrive within one reading, so the endpoint counts its own
admissions since the reading and `carried_queue` turns them into the queue now.
"""

from __future__ import annotations


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
