"""The admission endpoint gateways ask per request: shed low priorities while capacity is on its way.

Two HTTP contracts on one server:
- Envoy ext_authz (HTTP service): any path under `/ext_authz/`; 2xx allows; a denial is 429 with
  Retry-After, which Envoy returns to the client.
- nginx `auth_request`: `/auth_request`; 2xx allows, 403 denies (nginx turns any other status into a 500),
  with Retry-After and X-Shed-Reason for an `error_page 403` that answers 429 (see deploy/ and the tests).

Priority comes from a request header the gateway sets from a trusted source (never the client's own; see
deploy/gateway/): a class name in any case, or a 32-bit integer (Gateway API convention: below 0 is
sheddable; it maps to the class with the largest priority not above it). A missing header is the default
class; a value naming no class (a misspelt name, an integer beyond 32 bits) goes to the `unknown_class`
(default: the default class) and is counted (`on_unknown`), so a gateway sending garbage shows in the
metrics instead of passing silently as standard. The highest class is always admitted. Shed fractions are applied exactly, by
error diffusion per class (a fraction of 0.25 rejects every fourth request), so the admitted share does
not depend on chance. The saturation guard rejects a class while the queue is at least its depth; the
queue comes from `live_queue` (in `autoscaler run`: the pods' queue and running gauges scraped every
second, falling back to the latest tick's value when the probe does not know).

A burst can arrive within one probe interval, so between readings the endpoint carries the probed queue
forward with what it admitted itself: queue + max(0, admitted since the reading - free slots at the
reading - drain x time since), the drain being the ready slots' completions per second (from the
decision). Requests that fit in free slots or are served meanwhile do not count; the rest are queued.
Each endpoint counts only what it admitted: with several controller replicas behind one gateway the
carried part is low by their number (and never worse than the reading alone).

Before the first decision, while the latest is stale (the board's `stale_after_s`: the ticks stopped;
counted by the board), and whenever no decision is valid, everything is admitted: a controller that
cannot decide must not block traffic.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from aiohttp import web

from autoscaler.board import DecisionBoard
from autoscaler.clock import Clock, SystemClock
from autoscaler.signals.queueprobe import QueueReading
from policies import Decision
from policies.admission import carried_queue, classify

# Admissions remembered since the latest queue reading, at most: a bound should the probe stop reading.
MAX_TRACKED_ADMISSIONS = 100_000


class Admission:
    def __init__(self, board: DecisionBoard, *, priorities: dict[str, int], header: str, default_class: str,
                 retry_after_s: int, unknown_class: str | None = None,
                 live_queue: Callable[[], QueueReading | float | None] | None = None,
                 on_result: Callable[[str, str], None] | None = None, on_unknown: Callable[[], None] | None = None,
                 clock: Clock | None = None) -> None:
        self.board = board
        self.priorities = dict(priorities)
        self.top = max(priorities.values())
        self.header = header
        self.default = default_class
        self.unknown = unknown_class or default_class
        self.retry_after = str(retry_after_s)
        self.live_queue = live_queue or (lambda: board.latest.queue_depth if board.latest else None)
        self.on_result = on_result or (lambda cls, result: None)
        self.on_unknown = on_unknown or (lambda: None)
        self.clock = clock or SystemClock()
        self._debt: dict[str, float] = {name: 0.0 for name in priorities}
        # when requests were admitted since the latest reading
        self._admitted_at: deque[float] = deque(maxlen=MAX_TRACKED_ADMISSIONS)

    def classify(self, raw: str | None) -> str:
        cls, known = classify(raw, self.priorities, default=self.default, unknown=self.unknown)
        if not known:
            self.on_unknown()
        return cls

    def queue(self, decision: Decision) -> float | None:
        """The queue now: the latest reading carried forward with this endpoint's own admissions."""
        reading = self.live_queue()
        if not isinstance(reading, QueueReading):
            return reading  # a tick's value (or nothing): no carrying forward
        while self._admitted_at and self._admitted_at[0] < reading.at:
            self._admitted_at.popleft()  # in the reading already
        return carried_queue(queue=reading.queue, in_flight=reading.in_flight, admitted=len(self._admitted_at),
                             slots=decision.saturation_slots, drain_per_s=decision.saturation_drain_per_s,
                             elapsed_s=self.clock.now() - reading.at)

    def rejection(self, cls: str) -> str | None:
        """Why a request of class `cls` is rejected now, or None to admit it (and count it admitted)."""
        reason = self._rejection(cls)
        if reason is None:
            self._admitted_at.append(self.clock.now())
        return reason

    def _rejection(self, cls: str) -> str | None:
        latest = self.board.fresh("admission")
        if latest is None or not latest.decision.valid or self.priorities[cls] >= self.top:
            return None
        depth = latest.decision.saturation_queue_depth.get(cls)
        queue = self.queue(latest.decision) if depth is not None else None
        if depth is not None and queue is not None and queue >= depth:
            return f"saturated: queue {queue:.0f} >= {depth} for {cls}"
        fraction = float(latest.decision.shed.get(cls, 0.0))
        if fraction <= 0.0:
            self._debt[cls] = 0.0
            return None
        self._debt[cls] += fraction
        if self._debt[cls] >= 1.0:
            self._debt[cls] -= 1.0
            return f"shedding {fraction:.0%} of {cls}"
        return None

    def _answer(self, request: web.Request, deny_status: int) -> web.Response:
        cls = self.classify(request.headers.get(self.header))
        reason = self.rejection(cls)
        if reason is None:
            self.on_result(cls, "admitted")
            return web.Response(status=200)
        self.on_result(cls, "rejected")
        return web.Response(status=deny_status, text=reason + "\n",
                            headers={"Retry-After": self.retry_after, "X-Shed-Reason": reason})

    async def ext_authz(self, request: web.Request) -> web.Response:
        return self._answer(request, 429)

    async def auth_request(self, request: web.Request) -> web.Response:
        return self._answer(request, 403)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/auth_request", self.auth_request)
        app.router.add_route("*", "/ext_authz/{tail:.*}", self.ext_authz)
        app.router.add_route("*", "/ext_authz", self.ext_authz)
        return app
