"""The latest decision, shared by the loop (writer) and the KEDA and admission servers (readers).

Readers never wait on I/O: they read the last published value. Watchers (streaming RPCs) are woken when
it changes. Before the first decision nothing is published, and readers say so.

A decision is stale once it is older than `stale_after_s` (the tick that made it started that long ago on
the board's clock): the ticks stopped publishing (signals lost, `decide` raising, the loop stuck). Readers
ask `fresh(reader)`, which answers None for a stale decision as for no decision, and reports each stale
read to `on_stale(reader)` (a metric), so an old decision is never served for ever: KEDA gets
UNAVAILABLE (its fallback applies) and the admission endpoint admits. `stale_after_s` None never goes
stale (a board nobody ticks, in tests and benchmarks).

Scale to zero: each decision carries the Ready replicas the cluster reported (`ready_replicas`, None when
unknown), and `set_ready` updates them between ticks, so a request the admission endpoint holds at zero is
released as soon as a replica is Ready. The endpoint counts what it holds in `held_requests`; a change of
that count wakes the watchers (KEDA's StreamIsActive says active at once) and sets `wake`, which the
loop's sleep waits on, so the next tick starts at once instead of after `tick_s`. `last_ready` keeps the
latest Ready count that was known, for a decision that does not know it (a tick that missed the cluster), and
`last_serving` the latest decision made with Ready replicas: what one replica takes (its slots, completions,
the saturation guard's depths), which the admission endpoint releases held requests by after a cold start
(the decisions made at zero know no Ready slot). `last_wake_start` keeps where the latest wake landed its first
replica (a free slot or a new node), which outlasts the wake: its held requests are released after it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from autoscaler.clock import Clock, SystemClock
from policies import Decision


@dataclass
class Published:
    decision: Decision
    current_replicas: int
    queue_depth: float | None
    at_s: float
    ready_replicas: int | None = None  # as the cluster reported them; None: unknown

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
    held_requests: int = 0  # requests the admission endpoint holds for a Ready replica, now
    last_ready: int | None = None  # the latest Ready replicas known (a decision may not know them)
    last_serving: Decision | None = None  # the latest decision made with Ready slots
    last_wake_start: str | None = None  # where the latest wake from zero landed ("slot", "node"); None: none yet
    _changed: asyncio.Condition | None = field(default=None, repr=False)
    _wake: asyncio.Event | None = field(default=None, repr=False)
    _notifying: set = field(default_factory=set, repr=False)

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

    @property
    def wake(self) -> asyncio.Event:
        """Set when a request starts waiting for a replica: the loop ticks at once (and clears it)."""
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def _notify(self) -> None:
        async with self._condition():
            self._condition().notify_all()

    async def publish(self, value: Published) -> None:
        previous = self.latest
        self.latest = value
        if value.ready_replicas is not None:
            self.last_ready = value.ready_replicas
        if value.decision.valid and value.decision.saturation_slots > 0:
            self.last_serving = value.decision
        if value.decision.wake_start is not None:
            self.last_wake_start = value.decision.wake_start
        if (previous is None or previous.replicas != value.replicas or previous.decision.shed != value.decision.shed
                or previous.ready_replicas != value.ready_replicas):
            await self._notify()

    async def set_ready(self, ready_replicas: int) -> None:
        """The Ready replicas now, between ticks (e.g. from a watch or a probe); wakes held requests."""
        self.last_ready = ready_replicas
        if self.latest is not None and self.latest.ready_replicas != ready_replicas:
            self.latest = replace(self.latest, ready_replicas=ready_replicas)
            await self._notify()

    def set_held(self, held_requests: int) -> None:
        """The requests held now: more than before wakes the loop; any change wakes the watchers. Not a
        coroutine: a held request's handler calls it on its way out, also when cancelled (the client left)."""
        previous, self.held_requests = self.held_requests, held_requests
        if held_requests > previous:
            self.wake.set()
        if held_requests != previous:
            task = asyncio.ensure_future(self._notify())
            self._notifying.add(task)  # a reference until done (the event loop keeps only weak ones)
            task.add_done_callback(self._notifying.discard)

    async def wait_change(self, timeout_s: float | None = None) -> None:
        async with self._condition():
            try:
                await asyncio.wait_for(self._condition().wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
