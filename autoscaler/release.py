"""Releasing held requests as Ready capacity allows: the order, the room, and what is still being served.

At the end of a cold start the first Ready replica used to get every held request at once: about 1300 for
8 slots in the closed loop (`python -m loadtest.e2e --scenario scale-to-zero`), a queue that outgrew the
gateway's read timeout (504s) and made the controller order its maximum. Held requests now leave only as
far as the Ready replicas take them within the SLO:

- room = Ready replicas x (slots + queue allowance) - requests being served or queued now, where the queue
  allowance per replica is the saturation guard's deepest depth per Ready replica (the queue at which a
  request of a guarded class would wait about the queue-wait SLO: slots x ratio x SLO / service time), read
  from the latest decision made with a Ready replica (`PerReplica`). Before any such decision the slots
  alone, with nothing known to drain.
- being served or queued now: the queue probe's reading (queue + running) carried forward with the
  endpoint's own admissions since and the Ready replicas' completions (`occupied`), and never less than the
  endpoint's own admissions as a fluid queue drained at the same rate (`Ledger`), which alone counts without
  a reading: until the probe's first reading after the controller saw a replica turn Ready (it re-lists the
  pods then), its readings leave out that replica, whose capacity already counts.
- order: the top class first, then arrival order within a class (`HeldQueue`). Requests arriving while
  others are held queue behind them, so a newcomer does not overtake the held ones.

The room and the order are pure and shared with the simulators (`policies.release`); this module adds the
waiters (asyncio events) and the endpoint's own admissions as a fluid queue. No clock (times are passed in),
no I/O.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from policies.release import PerReplica, ReleaseOrder, occupied, per_replica, room

__all__ = ["HeldQueue", "Ledger", "PerReplica", "Waiter", "occupied", "per_replica", "room"]


@dataclass
class Ledger:
    """The endpoint's own admissions as a fluid queue: +1 per admission, drained at the Ready replicas' rate."""

    value: float = 0.0
    at_s: float | None = None

    def now(self, now_s: float, drain_per_s: float) -> float:
        if self.at_s is not None:
            self.value = max(0.0, self.value - drain_per_s * max(0.0, now_s - self.at_s))
        self.at_s = now_s
        return self.value

    def add(self, now_s: float, drain_per_s: float) -> None:
        self.value = self.now(now_s, drain_per_s) + 1.0


@dataclass
class Waiter:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    left: bool = False  # expired or its client went away: skipped

    @property
    def released(self) -> bool:
        return self.event.is_set()


class HeldQueue:
    """Held requests in release order (`policies.release.ReleaseOrder`): the highest priority first, then the
    earliest arrival."""

    def __init__(self) -> None:
        self._order: ReleaseOrder[Waiter] = ReleaseOrder()
        self.waiting = 0  # held and neither released nor left
        self.releasing = 0  # released, their answer not decided yet (they take room)

    def push(self, priority: int) -> Waiter:
        waiter = Waiter()
        self._order.push(priority, waiter)
        self.waiting += 1
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """A waiter gone without release (lazily dropped from the order), or its release answered."""
        if waiter.released:
            self.releasing -= 1
        elif not waiter.left:
            waiter.left = True
            self.waiting -= 1

    def release(self, room: float | None) -> int:
        """Release up to `room` waiters in order (None: all); how many were released."""
        released = 0
        while self._order and (room is None or released + 1 <= room):
            waiter = self._order.pop()
            if waiter.left:
                continue
            waiter.event.set()
            self.waiting -= 1
            self.releasing += 1
            released += 1
        return released
