"""The admission endpoint gateways ask per request: shed low priorities while capacity is on its way.

Two HTTP contracts on one server:
- Envoy ext_authz (HTTP service): any path under `/ext_authz/`; 2xx allows; a denial is 429 with
  Retry-After, which Envoy returns to the client.
- nginx `auth_request`: `/auth_request`; 2xx allows, 403 denies (nginx turns any other status into a 500),
  with Retry-After and X-Shed-Reason for an `error_page 403` that answers 429 (see deploy/ and the tests).

Priority comes from a request header the gateway sets from a trusted source (never the client's own; see
deploy/gateway/): a class name in any case, or a 32-bit integer (Gateway API convention: below 0 is sheddable;
it maps to the class with the largest priority not above it). A missing header is the default class; a value
naming no class (a misspelt name, an integer beyond 32 bits) goes to the `unknown_class` (default: the default
class) and is counted (`on_unknown`), so a gateway sending garbage shows in the metrics instead of passing
silently as standard. The highest class is always admitted. Shed fractions are applied exactly, by error
diffusion per class (a fraction of 0.25 rejects every fourth request), so the admitted share does not depend
on chance. The saturation guard rejects a class while the queue is at least its depth; the queue comes from
`live_queue` (in `autoscaler run`: the pods' queue and running gauges scraped every second, falling back to
the latest tick's value when the probe does not know).

A burst can arrive within one probe interval, so between readings the endpoint carries the probed queue
forward with what it admitted itself: queue + max(0, admitted since the reading - free slots at the
reading - drain x time since), the drain being the ready slots' completions per second (from the
decision). Requests that fit in free slots or are served meanwhile do not count; the rest are queued.
Each endpoint counts only what it admitted: with several controller replicas behind one gateway the
carried part is low by their number (and never worse than the reading alone).

While the top class's own arrivals in the last second (`TopArrivals`) outnumber what the Ready slots
complete in it (`top_outruns`), every guarded class is rejected while the queue the endpoint sees is above 0
(counted, reason "top class outruns the drain"): the guard's depths leave the top class the rest of the SLO's
queue, which it fills by itself within a second then. With free slots nothing more is rejected. A request
released from a hold neither counts in the window nor meets the rule: the release already paced it to the
room the Ready replicas have.

Behind per-replica gateway queues the decision may keep slots free for the top class
(`saturation_reserve`, `policies/reserve.py`): a guarded class is also rejected while the requests in the
servers (the probe's queue and running requests, carried forward with this endpoint's admissions and the
Ready slots' completions) number at least the Ready slots less the reserve (reason "keeping R of C slots for
the top class"). A reading without in-flight requests rejects nothing by this rule (fail open), nor does a
request released from a hold (the release paced it to the room the Ready replicas have).

Scale to zero: while the latest fresh decision comes with 0 Ready replicas (the model at zero, or waking:
replicas ordered, none Ready yet; valid or not, since an admitted request would reach no replica), or is a
valid 0 with the Ready count known (going to zero: the last replica drains its in-flight requests and must get
no new one), a request is HELD: its handler awaits its release, then it is answered as any other (the
saturation guard and the shed levels apply). Held requests are released as far as the Ready replicas take
them within the SLO, the top class first, then in arrival order, and more as replicas turn Ready or requests
finish (autoscaler/release.py: the room, the order, and what is still being served); while any is held, a new
request queues behind them. A request already held also waits through a decision that does not know the
Ready replicas (a tick that could not read the cluster), and so does a new one when the latest Ready count
known was 0 (`DecisionBoard.last_ready`). While any is held the board's `held_requests` is above
zero: the loop wakes at once and feeds it to the policy as the `held_requests` signal, and KEDA's
StreamIsActive says active. Each request counts once as an arrival of its class (`on_arrival`, the per-class
rates the policy reads) when the endpoint first sees it: a held one when its hold starts, so a wake sees the
demand that is waiting, not only what the Ready replicas take as they release it. A request held longer than
`max_hold_s` gets 503 with Retry-After (counted, result `hold_expired`). With more than `max_held_requests`
held, a new request below the top class gets that 503 at once; the top class (critical) is always held, and is
never dropped while a start is in progress short of `max_hold_s`. `max_hold_s` None: the decision's lead time
(the learned cold start) plus `HOLD_MARGIN_S`, at most `MAX_HOLD_S` (the shipped gateway's hold timeout is above
it). Envoy's ext_authz call is held directly.
nginx's `auth_request` keeps its short timeout (fail open) for the ordinary answer: at zero `/auth_request`
answers 401 at once, which the shipped gateway sends to a second subrequest,
`/auth_request/hold`, with a timeout above `MAX_HOLD_S` (docs/gateway.md): a hold there admits (200) or
expires (403 with `X-Hold-Expired`, answered 503). The gateway also sends there a request whose model
refused the connection (nothing of it was sent: `X-Model-Unreachable`), e.g. after the ordinary subrequest
timed out and failed open at zero: it is held as a request already held would be.

Before the first decision, while the latest is stale (the board's `stale_after_s`: the ticks stopped;
counted by the board), and whenever no decision is valid, everything is admitted: a controller that
cannot decide must not block traffic. Except at zero: an invalid decision that knows 0 Ready replicas holds
(admitted, the request would reach no replica), and a held request also waits through an invalid one that
does not know them (a tick that missed reading the cluster), up to `max_hold_s`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from aiohttp import web

from autoscaler.board import DecisionBoard, Published
from autoscaler.clock import Clock, SystemClock
from autoscaler.release import HeldQueue, Ledger, PerReplica, occupied, per_replica, room
from autoscaler.signals.queueprobe import QueueReading
from policies import Decision
from policies.admission import TopArrivals, carried_queue, classify, overrun_rejects, reserve_rejects

# A held request re-checks the board at least this often (its deadline, a decision gone stale).
HOLD_RECHECK_S = 1.0
# While requests are held, the release re-checks the room this often (requests finish between board changes).
RELEASE_STEP_S = 0.05
# max_hold_s unset: the learned cold start plus this margin, at most MAX_HOLD_S.
HOLD_MARGIN_S = 60.0
MAX_HOLD_S = 600.0

# Admissions remembered since the latest queue reading, at most: a bound should the probe stop reading.
MAX_TRACKED_ADMISSIONS = 100_000


class Admission:
    def __init__(self, board: DecisionBoard, *, priorities: dict[str, int], header: str, default_class: str,
                 retry_after_s: int, unknown_class: str | None = None,
                 live_queue: Callable[[], QueueReading | float | None] | None = None,
                 on_result: Callable[[str, str], None] | None = None, on_unknown: Callable[[], None] | None = None,
                 clock: Clock | None = None, max_hold_s: float | None = None, max_held_requests: int = 10_000,
                 on_hold: Callable[[str, float], None] | None = None, hold_going_to_zero: bool = True,
                 replica_slots: int | None = None, on_arrival: Callable[[str], None] | None = None) -> None:
        """`on_arrival(cls)`: a request of class `cls` arrived, counted once when the endpoint first sees it:
        answered at once, or held (then when its hold starts, not again when it is answered), the demand the
        policy reads. `on_result(cls, result)`: each answer. `on_hold(outcome, waited_s)`: a hold ended,
        `admitted` or `expired`. `hold_going_to_zero` False:
        a decision of 0 holds nothing while replicas are Ready (shadow mode, where nothing acts on it, and a
        policy without `idle_after_s`, whose decisions do not wake on a held request). `replica_slots`: the
        requests one replica serves at once (the policy's `replica_concurrency`); None releases every held
        request at the first Ready replica."""
        self.board = board
        self.priorities = dict(priorities)
        self.top = max(priorities.values())
        self.header = header
        self.default = default_class
        self.unknown = unknown_class or default_class
        self.retry_after = str(retry_after_s)
        self.live_queue = live_queue or (lambda: board.latest.queue_depth if board.latest else None)
        self.on_result = on_result or (lambda cls, result: None)
        self.on_arrival = on_arrival or (lambda cls: None)
        self.on_unknown = on_unknown or (lambda: None)
        self.clock = clock or SystemClock()
        self.max_hold_s = max_hold_s
        self.max_held = max_held_requests
        self.on_hold = on_hold or (lambda outcome, waited_s: None)
        self.hold_going_to_zero = hold_going_to_zero
        self.replica_slots = replica_slots
        self._held = 0
        self._queue = HeldQueue()
        self._ledger = Ledger()
        self._dispatcher: asyncio.Future | None = None
        self._debt: dict[str, float] = {name: 0.0 for name in priorities}
        # when requests were admitted since the latest reading
        self._admitted_at: deque[float] = deque(maxlen=MAX_TRACKED_ADMISSIONS)
        # when requests of the top class were answered, within the overrun rule's window
        self._top = TopArrivals(maxlen=MAX_TRACKED_ADMISSIONS)

    def classify(self, raw: str | None) -> str:
        cls, known = classify(raw, self.priorities, default=self.default, unknown=self.unknown)
        if not known:
            self.on_unknown()
        return cls

    def _admitted_since(self, reading: QueueReading) -> int:
        """This endpoint's admissions since `reading` was taken (older ones are in the reading already)."""
        while self._admitted_at and self._admitted_at[0] < reading.at:
            self._admitted_at.popleft()
        return len(self._admitted_at)

    def queue(self, decision: Decision) -> float | None:
        """The queue now: the latest reading carried forward with this endpoint's own admissions, never less
        than what its own admissions leave queued beyond the Ready slots as `occupied` counts them (a fluid
        drained at the slots' full rate). A reading taken while admitted requests are still on their way to a
        server misses them, and the carrying forward counts only the admissions after it: a released burst
        (hundreds of held requests at a wake) would read as an empty queue, and the guard would admit the
        lower classes into the queues the top class is about to need."""
        reading = self.live_queue()
        if not isinstance(reading, QueueReading):
            return reading  # a tick's value (or nothing): no carrying forward
        carried = carried_queue(queue=reading.queue, in_flight=reading.in_flight,
                                admitted=self._admitted_since(reading), slots=decision.saturation_slots,
                                drain_per_s=decision.saturation_drain_per_s, elapsed_s=self.clock.now() - reading.at)
        latest = self.board.latest
        drain = self._drain_per_s(latest) if latest is not None else 0.0
        if drain <= 0:  # no drain known: the fluid would only grow
            return carried
        return max(carried, self._ledger.now(self.clock.now(), drain) - decision.saturation_slots)

    def busy(self, decision: Decision) -> float | None:
        """The requests in the servers now, served or queued: the latest reading carried forward with this
        endpoint's admissions and the Ready slots' completions; None without an in-flight reading."""
        reading = self.live_queue()
        if not isinstance(reading, QueueReading) or reading.in_flight is None:
            return None
        return occupied(queue=reading.queue, in_flight=reading.in_flight, admitted=self._admitted_since(reading),
                        drain_per_s=decision.saturation_drain_per_s, elapsed_s=self.clock.now() - reading.at)

    def rejection(self, cls: str, *, released: bool = False) -> str | None:
        """Why a request of class `cls` is rejected now, or None to admit it (and count it admitted).
        `released`: it was held and the release let it go (the overrun rule leaves it alone)."""
        if self.priorities[cls] >= self.top and not released:
            self._top.add(self.clock.now())
        reason = self._rejection(cls, released)
        if reason is None:
            self._admitted_at.append(self.clock.now())
            latest = self.board.latest
            self._ledger.add(self.clock.now(), self._drain_per_s(latest) if latest is not None else 0.0)
        return reason

    def _rejection(self, cls: str, released: bool) -> str | None:
        latest = self.board.fresh("admission")
        if latest is None or not latest.decision.valid or self.priorities[cls] >= self.top:
            return None
        depth = latest.decision.saturation_queue_depth.get(cls)
        queue = self.queue(latest.decision) if depth is not None else None
        if depth is not None and queue is not None and queue >= depth:
            return f"saturated: queue {queue:.0f} >= {depth} for {cls}"
        reserve, slots = latest.decision.saturation_reserve, latest.decision.saturation_slots
        if depth is not None and reserve > 0 and not released:  # a release is paced to the room already
            busy = self.busy(latest.decision)
            if reserve_rejects(busy=busy, slots=slots, reserve=reserve):
                return f"keeping {reserve} of {slots} slots for the top class: {busy:.0f} busy, {cls}"
        if (depth is not None and not released and overrun_rejects(queue=queue)
                and self._top.outruns(self.clock.now(), latest.decision.saturation_drain_per_s)):
            return f"top class outruns the drain: queue {queue:.1f} for {cls}"
        fraction = float(latest.decision.shed.get(cls, 0.0))
        if fraction <= 0.0:
            self._debt[cls] = 0.0
            return None
        self._debt[cls] += fraction
        if self._debt[cls] >= 1.0:
            self._debt[cls] -= 1.0
            return f"shedding {fraction:.0%} of {cls}"
        return None

    def holding(self, *, held: bool = False) -> bool:
        """A request must wait: the fresh decision comes with 0 Ready replicas (at zero, or waking), valid or not
        (admitted, it would reach no replica); or it is a valid 0 with a known Ready count (going to zero: the
        last replicas are draining and must not get new requests; the hold wakes the loop, whose next decision
        orders a replica again). A request already `held` also waits through an invalid decision that does not
        know the Ready replicas (a tick that could not read the cluster), and so does a new one when the latest
        Ready count known was 0. A stale decision releases."""
        latest = self.board.fresh("admission")
        if latest is None:
            return False
        unknown = latest.ready_replicas is None and not latest.decision.valid
        if latest.ready_replicas == 0 or (unknown and (held or self.board.last_ready == 0)):
            return True
        return (self.hold_going_to_zero and latest.decision.valid and latest.ready_replicas is not None
                and latest.decision.replicas == 0)

    def hold_limit_s(self) -> float:
        """How long a request is held at most: the configured `max_hold_s`, else the learned cold start plus
        a margin (at most MAX_HOLD_S; MAX_HOLD_S when no lead time is known)."""
        if self.max_hold_s is not None:
            return self.max_hold_s
        latest = self.board.latest
        lead = latest.decision.lead_time_s if latest is not None else 0.0
        return min(MAX_HOLD_S, lead + HOLD_MARGIN_S) if lead and lead > 0 else MAX_HOLD_S

    def _per_replica(self) -> PerReplica | None:
        """What one Ready replica takes, from the latest decision made with Ready replicas (None: none yet)."""
        serving = self.board.last_serving
        if self.replica_slots is None or serving is None:
            return None
        return per_replica(serving, self.replica_slots)

    def _drain_per_s(self, latest: Published) -> float:
        per = self._per_replica()
        return (latest.ready_replicas or 0) * per.drain_per_s if per is not None else 0.0

    def occupied(self, latest: Published) -> float:
        """Requests queued or running at the Ready replicas now: the probe's reading carried forward, and
        never less than this endpoint's own admissions as a fluid queue (a replica that just turned Ready counts
        in the capacity before the probe's next reading, after its re-listing, includes its load)."""
        now, drain = self.clock.now(), self._drain_per_s(latest)
        own = self._ledger.now(now, drain)
        reading = self.live_queue()
        if isinstance(reading, QueueReading) and reading.in_flight is not None:
            return max(own, occupied(queue=reading.queue, in_flight=reading.in_flight,
                                     admitted=self._admitted_since(reading), drain_per_s=drain,
                                     elapsed_s=now - reading.at))
        return own

    def room(self, latest: Published) -> float | None:
        """How many more held requests the Ready replicas take now; None: no bound (release them all)."""
        if self.replica_slots is None or latest.ready_replicas is None:
            return None
        return room(ready=latest.ready_replicas, slots=self.replica_slots, per=self._per_replica(),
                    occupied=self.occupied(latest), releasing=self._queue.releasing)

    def release(self) -> int:
        """Release held requests as far as there is room (all of them when the decision is stale or gone:
        fail open); how many went."""
        latest = self.board.fresh("admission")
        if latest is not None and self.holding(held=True):
            return 0
        return self._queue.release(None if latest is None else self.room(latest))

    async def _dispatch(self) -> None:
        """While requests are held: release them as the board changes and as requests finish."""
        while self._queue.waiting:
            self.release()
            await self.board.wait_change(timeout_s=RELEASE_STEP_S)

    def must_hold(self, *, unreachable: bool = False) -> bool:
        """A request arriving now is held: the decision holds, or others are held already (it queues behind)."""
        return self.holding(held=unreachable) or bool(self._queue.waiting)

    async def hold(self, cls: str, *, unreachable: bool = False) -> str | None:
        """Wait for room at a Ready replica; None once released (or the controller cannot say: fail open),
        else why the request is dropped. `unreachable`: the model refused the request's connection, so it is
        held as one already held (through a decision that does not know the Ready replicas)."""
        if not self.must_hold(unreachable=unreachable):
            return None
        if self._held >= self.max_held and self.priorities[cls] < self.top:
            return f"{self._held} requests held for a replica: no room"
        arrived = self.clock.now()
        limit_s = self.hold_limit_s()
        waiter = self._queue.push(self.priorities[cls])
        self._held += 1
        self.board.set_held(self._held)
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.ensure_future(self._dispatch())
        try:
            while not waiter.released:
                self.release()  # also here: a dispatcher that stopped must not strand anyone
                remaining_s = arrived + limit_s - self.clock.now()
                if waiter.released:
                    break
                if remaining_s <= 0:
                    self.on_hold("expired", self.clock.now() - arrived)
                    return f"no replica Ready after {limit_s:.0f} s"
                try:
                    await asyncio.wait_for(waiter.event.wait(), min(remaining_s, HOLD_RECHECK_S))
                except asyncio.TimeoutError:
                    pass
            self.on_hold("admitted", self.clock.now() - arrived)
            return None
        finally:
            self._queue.leave(waiter)
            self._held -= 1
            self.board.set_held(self._held)

    async def _held_answer(self, cls: str, deny_status: int, expired_status: int, expired_headers: dict[str, str], *,
                           unreachable: bool = False) -> web.Response:
        """Held while it must be, then answered as any request (a hold that expired: `expired_status`)."""
        held = self.must_hold(unreachable=unreachable)
        dropped = await self.hold(cls, unreachable=unreachable)
        if dropped is None:
            return self._answer(cls, deny_status, released=held)
        self.on_result(cls, "hold_expired")
        return web.Response(status=expired_status, text=dropped + "\n",
                            headers={"Retry-After": self.retry_after, "X-Shed-Reason": dropped, **expired_headers})

    def _answer(self, cls: str, deny_status: int, *, released: bool = False) -> web.Response:
        reason = self.rejection(cls, released=released)
        if reason is None:
            self.on_result(cls, "admitted")
            return web.Response(status=200)
        self.on_result(cls, "rejected")
        return web.Response(status=deny_status, text=reason + "\n",
                            headers={"Retry-After": self.retry_after, "X-Shed-Reason": reason})

    async def ext_authz(self, request: web.Request) -> web.Response:
        cls = self.classify(request.headers.get(self.header))
        self.on_arrival(cls)
        return await self._held_answer(cls, 429, 503, {})

    async def auth_request(self, request: web.Request) -> web.Response:
        """nginx's ordinary subrequest, under a short timeout: never held; 401 sends it to the hold, whose
        subrequest classifies the request (classified here too, an unknown class would count twice)."""
        if self.holding() or self._queue.waiting:
            self.board.wake.set()  # the loop starts deciding now; the hold subrequest follows at once
            return web.Response(status=401, text="no replica Ready: hold\n", headers={"X-Hold": "1"})
        cls = self.classify(request.headers.get(self.header))
        self.on_arrival(cls)
        return self._answer(cls, 403)

    async def auth_request_hold(self, request: web.Request) -> web.Response:
        """nginx's hold subrequest, under a timeout above the hold's: 200 once admitted, 403 when expired. Also
        for a request whose model refused its connection (`X-Model-Unreachable`, set by the gateway)."""
        cls = self.classify(request.headers.get(self.header))
        unreachable = bool(request.headers.get("X-Model-Unreachable"))
        if not unreachable:  # one the model refused was counted when the ordinary subrequest admitted it
            self.on_arrival(cls)
        return await self._held_answer(cls, 403, 403, {"X-Hold-Expired": "1"}, unreachable=unreachable)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/auth_request", self.auth_request)
        app.router.add_route("*", "/auth_request/hold", self.auth_request_hold)
        app.router.add_route("*", "/ext_authz/{tail:.*}", self.ext_authz)
        app.router.add_route("*", "/ext_authz", self.ext_authz)
        return app
