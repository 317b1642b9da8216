"""The one clock of a running controller, shared by the loop, the health check, the admission endpoint, the
queue probe, leader election and retries.

`now()` is in unix seconds, so it compares with the sample times Prometheus reports and the times written
to Kubernetes objects (a Lease's renewTime), but it is anchored to the monotonic clock at start: a step of
the wall clock (NTP, a VM resumed) never makes the loop stall or fire twice, nor an interval negative.
Every wait goes through the clock too (`sleep`, `wait`), so tests use `ManualClock` and advance time
instead of sleeping. Two things are not the clock's: how long our own code took (the loop-duration metric,
`time.perf_counter`: a profile of the process) and timeouts on I/O (the tick deadline, HTTP timeouts: the
event loop's, since they bound real waits on real servers).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Wait until `event` is set or `timeout_s` passed; returns whether it is set."""
        ...


class SystemClock:
    def __init__(self) -> None:
        self._wall0, self._mono0 = time.time(), time.monotonic()

    def now(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            pass
        return event.is_set()


class ManualClock:
    """Time that moves only when a test advances it; sleepers wake, in deadline order, as it passes them."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + seconds, next(self._order), future))
        await future

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        sleeper = asyncio.ensure_future(self.sleep(timeout_s))
        setter = asyncio.ensure_future(event.wait())
        await asyncio.wait({sleeper, setter}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sleeper, setter):
            task.cancel()
        return event.is_set()

    async def _settle(self) -> None:
        for _ in range(100):  # let woken tasks run up to their next wait on the clock
            await asyncio.sleep(0)

    async def asleep(self, sleepers: int = 1, timeout_s: float = 10.0) -> None:
        """Wait, in real time, until `sleepers` tasks wait on the clock: work a woken task does outside the
        event loop (a thread, e.g. the loop's `decide`) finishes in real time, not in `advance`'s settling."""
        deadline = time.monotonic() + timeout_s
        while sum(1 for _, _, f in self._sleepers if not f.done()) < sleepers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {sleepers} tasks asleep on the clock after {timeout_s} s")
            await asyncio.sleep(0.001)

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, waking each sleeper at its own deadline."""
        target = self.t + seconds
        await self._settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self.t = max(self.t, deadline)
            if not future.done():
                future.set_result(None)
            await self._settle()
        self.t = target
        await self._settle()
