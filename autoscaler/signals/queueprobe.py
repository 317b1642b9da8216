"""The live queue depth for the admission endpoint's saturation guard.

The loop reads the queue once per tick (15 s), too coarse for a burst that builds a queue in seconds. This
probe scrapes the model pods' queue gauge (and, when the server has one, the running-requests gauge, from
the same read) every `interval_s` (1 s; a /metrics read is cheap) and sums them over pods. A pod that refuses
the connection (nothing listens at its address: a server not started yet behind a Ready pod, or one gone)
serves nothing and counts 0 waiting and 0 running. If any other pod cannot be read (a timeout, an error
answer), or the last good reading is older than three intervals, the probe says it does not know (None)
rather than report a partial sum, and the admission endpoint falls back to the tick's value. The pod list
is refreshed every `refresh_s`, at once after a read that failed, and at once when the Ready replicas the
controller last saw (`ready`) change: a replica that just turned Ready is read within an interval, not up to
`refresh_s` later while the admission endpoint already counts its slots (it releases held requests into them
at a wake, and would otherwise carry its own admissions forward as a fluid drained at the full rate).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from autoscaler.clock import Clock
from autoscaler.errors import EdgeError
from autoscaler.signals.scrape import PodEndpoints, Refused, fetch_metrics


# A reading more than three intervals old (three probes missed in a row) is no longer the live queue.
STALE_INTERVALS = 3


@dataclass(frozen=True)
class QueueReading:
    queue: float  # waiting requests, all pods
    in_flight: float | None  # running requests, all pods (None: the server exports no such gauge)
    at: float  # when it was read, on the controller's clock


class QueueProbe:
    def __init__(self, session: aiohttp.ClientSession, pods: PodEndpoints, metric: str, *, interval_s: float = 1.0,
                 timeout_s: float = 0.5, refresh_s: float = 15.0, in_flight_metric: str | None = None,
                 clock: Clock, ready: Callable[[], int | None] | None = None) -> None:
        self.session, self.pods, self.metric, self.in_flight_metric = session, pods, metric, in_flight_metric
        self.interval, self.refresh = interval_s, refresh_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock = clock
        self._reading: QueueReading | None = None
        self._endpoints: dict[str, str] = {}
        self._endpoints_at: float | None = None
        self.ready = ready  # the Ready replicas the controller last saw (None: unknown)
        self._listed_for: int | None = None  # what `ready` said when the pods were last listed

    def reading(self) -> QueueReading | None:
        if self._reading is None or self.clock.now() - self._reading.at > STALE_INTERVALS * self.interval:
            return None
        return self._reading

    async def sample_once(self) -> None:
        now = self.clock.now()
        expected = self.ready() if self.ready is not None else None
        if (self._endpoints_at is None or now - self._endpoints_at >= self.refresh
                or (expected is not None and expected != self._listed_for)):
            try:
                self._endpoints = await self.pods.endpoints()
                self._endpoints_at, self._listed_for = now, expected
            except EdgeError:
                pass  # keep the last list; the reads below tell whether it still works
        if not self._endpoints:
            return
        urls = list(self._endpoints.values())
        readings = await asyncio.gather(*(fetch_metrics(self.session, u, self.timeout) for u in urls),
                                        return_exceptions=True)
        total = 0.0
        running: float | None = 0.0 if self.in_flight_metric else None
        for reading in readings:
            if isinstance(reading, asyncio.CancelledError):
                raise reading
            if isinstance(reading, Refused):  # nothing listens there: it serves nothing, adds 0 to both sums
                self._endpoints_at = None  # and the list is re-read next time (it may be gone)
                continue
            if isinstance(reading, BaseException) or self.metric not in reading:
                self._endpoints_at = None  # re-list next time: a pod may have gone
                return  # unknown: no partial sums
            total += reading[self.metric]
            if running is not None:
                value = reading.get(self.in_flight_metric)
                running = running + value if value is not None else None  # a pod without it: unknown
        self._reading = QueueReading(total, running, self.clock.now())

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_once()
            await self.clock.wait(stop, self.interval)
