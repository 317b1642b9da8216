"""The live queue depth for the admission endpoint's saturation guard.

The loop reads the queue once per tick (15 s), too coarse for a burst that builds a queue in seconds. This
probe scrapes the model pods' queue gauge every `interval_s` (1 s; a /metrics read is cheap) and sums it.
If any pod cannot be read, or the last good reading is older than three intervals, the probe says it does
not know (None) rather than report a partial sum, and the admission endpoint falls back to the tick's
value. The pod list is refreshed every `refresh_s`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import aiohttp

from autoscaler.errors import EdgeError
from autoscaler.signals.scrape import PodEndpoints, fetch_metrics


class QueueProbe:
    def __init__(self, session: aiohttp.ClientSession, pods: PodEndpoints, metric: str, *, interval_s: float = 1.0,
                 timeout_s: float = 0.5, refresh_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session, self.pods, self.metric = session, pods, metric
        self.interval, self.refresh = interval_s, refresh_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock = clock
        self._value: float | None = None
        self._at: float | None = None
        self._endpoints: dict[str, str] = {}
        self._endpoints_at: float | None = None

    def current(self) -> float | None:
        if self._at is None or self.clock() - self._at > 3 * self.interval:
            return None
        return self._value

    async def sample_once(self) -> None:
        now = self.clock()
        if self._endpoints_at is None or now - self._endpoints_at >= self.refresh:
            try:
                self._endpoints = await self.pods.endpoints()
                self._endpoints_at = now
            except EdgeError:
                pass  # keep the last list; the reads below tell whether it still works
        if not self._endpoints:
            return
        urls = list(self._endpoints.values())
        readings = await asyncio.gather(*(fetch_metrics(self.session, u, self.timeout) for u in urls),
                                        return_exceptions=True)
        total = 0.0
        for reading in readings:
            if isinstance(reading, asyncio.CancelledError):
                raise reading
            if isinstance(reading, BaseException) or self.metric not in reading:
                self._endpoints_at = None  # re-list next time: a pod may have gone
                return  # unknown: no partial sums
            total += reading[self.metric]
        self._value, self._at = total, self.clock()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_once()
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
