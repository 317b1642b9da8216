"""The latest decision, shared by the loop (writer) and the KEDA and admission servers (readers).

Readers never wait on I/O: they read the last published value. Watchers (streaming RPCs) are woken when
it changes. Before the first decision nothing is published, and readers say so.

A decision is stale once it is older than `stale_after_s` (the tick that made it started that long ago on
the board's clock): the ticks stopped publishing (signals lost, `decide` raising, the loop stuck). Readers
ask `fresh(reader)`, which answers None for a stale decision as for no decision, and reports each stale
read to `on_stale(reader)` (a metric), so an old decision is never served for ever: KEDA gets
UNAVAILABLE (its fallback applies) and the admission endpoint admits. `stale_after_s` None never goes
stale (a board nobody ticks, in tests and benchmarks).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Callable

from autoscaler.clock import Clock, SystemClock
from policies import Decision


@dataclass
class Published:
    decision: Decision
    current_replicas: int
    queue_depth: float | None
    at_s: float

    @property
    def replicas(self) -> int:
        """What to publish: the decision if valid, else hold what runs."""
        return self.decision.replicas if self.decision.valid else self.current_replicas


@dataclass
class DecisionBoard:
    latest: Published | None = None
    stale_after_s: float | None = None
    clock: Clock = field(default_factory=SystemClock, repr=False)
    on_stale: Callable[[str], None] = field(default=lambda reader: None, repr=False)
    _changed: asyncio.Condition | None = field(default=None, repr=False)

    def age_s(self) -> float:
        """Seconds since the latest decision's tick started; NaN before the first (a metric's 'no value')."""
        return math.nan if self.latest is None else max(0.0, self.clock.now() - self.latest.at_s)

    def stale(self) -> bool:
        return self.latest is not None and self.stale_after_s is not None and self.age_s() > self.stale_after_s

    def fresh(self, reader: str) -> Published | None:
        """The latest decision if there is one and it is not stale; a stale one is reported as `reader`'s."""
        if self.stale():
            self.on_stale(reader)
            return None
        return self.latest

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def publish(self, value: Published) -> None:
        previous = self.latest
        self.latest = value
        if previous is None or previous.replicas != value.replicas or previous.decision.shed != value.decision.shed:
            async with self._condition():
                self._condition().notify_all()

    async def wait_change(self, timeout_s: float | None = None) -> None:
        async with self._condition():
            try:
                await asyncio.wait_for(self._condition().wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
