"""Releasing requests held for a Ready replica (scale to zero): the room the Ready replicas have, and the order.

Shared by the admission endpoint (`autoscaler.release`, `autoscaler.admission`) and the simulators standing in
for it (`autoscaler.sim.request`, `autoscaler.sim.rate`), so that the twin of a closed-loop run releases as
the live endpoint does:

- room = Ready replicas x (slots + queue allowance) - requests being served or queued now - requests
  released and not yet answered (`room`). The queue allowance per replica is the saturation guard's
  deepest depth per Ready replica (the queue at which a request of a guarded class would wait about the
  queue-wait SLO), from the latest decision made with a Ready replica (`per_replica`); before any such
  decision the slots alone.
- being served or queued now, as the endpoint knows it: a probe reading of queue + running carried forward
  with the admissions since and the Ready replicas' completions (`occupied`).
- order: the highest priority first, then arrival order within a priority (`ReleaseOrder`). A request
  arriving while others are held queues behind them, so a newcomer never overtakes the held ones.

Pure: no clock (times are passed in), no I/O.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Generic, Iterator, Mapping, TypeVar

from policies.types import Decision

T = TypeVar("T")


@dataclass(frozen=True)
class PerReplica:
    slots: int
    allowance: float  # queued requests per Ready replica within the deepest saturation guard
    drain_per_s: float  # requests per second one busy replica completes


def per_replica(decision: Decision, replica_slots: int) -> PerReplica | None:
    """What one Ready replica takes, from a decision made with Ready replicas (None: made with none)."""
    return per_replica_of(slots=decision.saturation_slots, depths=decision.saturation_queue_depth,
                          drain_per_s=decision.saturation_drain_per_s, replica_slots=replica_slots)


def per_replica_of(*, slots: int, depths: Mapping[str, int], drain_per_s: float,
                   replica_slots: int) -> PerReplica | None:
    """The same from a decision's saturation figures: its Ready `slots`, the guard's `depths` per class and the
    slots' completions per second. E.g. 16 slots of 8-slot replicas, depths {standard: 10, sheddable: 4},
    4 req/s: 2 replicas, each with an allowance of 5 and 2 req/s."""
    if slots <= 0 or replica_slots <= 0:
        return None
    ready = slots / replica_slots
    return PerReplica(replica_slots, max(depths.values(), default=0) / ready, drain_per_s / ready)


def occupied(*, queue: float, in_flight: float, admitted: int, drain_per_s: float, elapsed_s: float) -> float:
    """Requests queued or running now: a reading of `queue` + `in_flight`, `admitted` since, less what the
    Ready replicas completed in `elapsed_s` (never below zero). E.g. 3 queued, 8 running, 5 admitted since,
    8 req/s over 0.5 s: 3 + 8 + 5 - 4 = 12."""
    return max(0.0, queue + in_flight + admitted - drain_per_s * max(0.0, elapsed_s))


def room(*, ready: int, slots: int, per: PerReplica | None, occupied: float, releasing: float = 0.0) -> float:
    """How many more held requests `ready` replicas of `slots` take now: their slots and queue allowance less
    what they serve or queue (`occupied`) and what was released and not answered yet (`releasing`).
    E.g. 2 Ready of 8 slots, an allowance of 2 each, 15 busy or queued: 2 x (8 + 2) - 15 = 5."""
    allowance = per.allowance if per is not None else 0.0
    return ready * (slots + allowance) - occupied - releasing


class ReleaseOrder(Generic[T]):
    """Held items in release order: the highest priority first, then the earliest pushed."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def push(self, priority: int, item: T) -> None:
        heapq.heappush(self._heap, (-priority, next(self._seq), item))

    def pop(self) -> T:
        return heapq.heappop(self._heap)[2]

    def peek(self) -> T:
        return self._heap[0][2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[T]:
        return (item for _, _, item in sorted(self._heap))
