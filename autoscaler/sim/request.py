"""Request-level simulation: every request of the trace, first-come first-served (or by class).

By default (`dispatch="shared"`) the gateway's queue feeds any free slot of any ready replica, one FCFS
queue for all (an idealised balancer: nginx's `least_conn` commits each request to one server on arrival,
the `least-conn` dispatch below). Priority acts only at admission: a request of class c is shed when its
fixed U(0,1) draw is below the shed level for c at that moment. So with exponential service times and a
fixed replica count this is exactly M/M/c, which the tests check against Erlang C.

With `server_priority` the queue is served by (class, arrival), highest class first (vLLM's
`--scheduling-policy priority` with the class's priority in each request), non-preemptive: a request in a
slot keeps it. The admission signals still see one queue: its total depth.

With `dispatch="least-conn"` each replica has its own queue instead (`dispatch.py`): an admitted arrival
joins the Ready replica with the fewest requests in it, as nginx's `least_conn` commits it, and waits for
that replica's slots; a removed replica serves what it holds. The signals' queue is the sum of the replicas'
queues. The gateway's hold (below) releases a held request to the replica with the fewest requests in it,
as the endpoint's answer lets nginx send it on, as far as the Ready replicas take it.

The saturation guard sees the queue as the admission endpoint does: read every `probe_s` (1 s) with the
busy slots, and carried forward between readings with the requests admitted since (`carried_queue`).
While the top class's own requests in the last second outnumber what the ready slots complete in it
(`top_outruns`), a guarded class is rejected while that queue is above 0, as the endpoint does (a request
released from a hold neither counts nor meets it). With slots kept for the top class (`Guard.reserve`), a
guarded class is also rejected while the requests in the servers, the same reading's queue and busy slots
carried forward (`policies.release.occupied`), number at least the ready slots less the reserve (not for a
request released from a hold either).

Scale to zero (`max_hold_s` set): a request that arrives while no replica is ready, or while others are
held, is held at the gateway (`hold.py`) and released as the admission endpoint releases it
(`policies.release`): as far as the Ready replicas take it (their slots and queue allowance less what they
serve or queue), the highest class first, then arrival order; released, it meets the shed levels and the
saturation guard as any arrival (the endpoint answers it then), and joins the replicas' queue. Its hold is
until its release, its wait (hold + queue) counts against the SLO, and it is reported apart; held longer
than `max_hold_s`, it is dropped (the gateway's 503: never served, an SLO miss). The signals carry
`held_requests`, the requests held now; the queue is the replicas' queue only; a held request counts as an
arrival of its class when its hold starts, as the live endpoint counts it (the demand is seen at once, not
as the Ready replicas take it). With `ready_seen_every_s` the release sees a replica Ready only from the
loop's next tick (it ticks that often while requests are held, and at once when one more is held, and
publishes the Ready count with its decision): the period's next tick or the next arrival, whichever comes
first; without, at once.

Signals at each tick are what the controller would read: arrivals per priority over the last tick (the
increase of the gateway's request counter), tokens, p99 queue wait and mean service time over the last
minute, queue and in-flight gauges. The mean service time is of the requests that arrived in that minute
and started, or with `service_by_completion` of those that completed in it, as vLLM's inference-time
histogram reports it (the closed loop's twin): when traffic stops, the last requests to complete are the
long ones, and the last readings are high (the policy does not learn them after a drop it takes for an
outage: policies/stages/learn.py).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np

from autoscaler.sim.cluster import Cluster
from autoscaler.sim.dispatch import DISPATCHES, Dispatch, LeastConn
from autoscaler.sim.guard import Guard
from autoscaler.sim.hold import Holds, wake_start
from policies.release import PerReplica, ReleaseOrder, occupied, room
from autoscaler.sim.workload import RequestWorkload
from policies.admission import TopArrivals, carried_queue, overrun_rejects, reserve_rejects
from policies.types import Sample, Signals

RATE_WINDOW_S = 60.0
INF = math.inf
# With the service time by completion: requests that arrived this long before the window are not looked at
# (none waits and runs that long in any trace simulated).
COMPLETION_LOOKBACK_S = 3600.0


class ClassQueue:
    """A deque's popleft / append / len over one FIFO per class: popleft takes the oldest request of the
    highest class waiting (class 0 is the highest)."""

    def __init__(self, priority: list[int], classes: int) -> None:
        self._priority = priority
        self._fifos = [deque() for _ in range(classes)]
        self._len = 0

    def append(self, j: int) -> None:
        self._fifos[self._priority[j]].append(j)
        self._len += 1

    def popleft(self) -> int:
        for fifo in self._fifos:
            if fifo:
                self._len -= 1
                return fifo.popleft()
        raise IndexError("pop from an empty queue")

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        return (j for fifo in self._fifos for j in fifo)

    def clear(self) -> None:
        for fifo in self._fifos:
            fifo.clear()
        self._len = 0


class RequestSim:
    def __init__(self, workload: RequestWorkload, *, concurrency: int, slo_s: float, tick_s: float,
                 probe_s: float = 1.0, max_hold_s: float | None = None, server_priority: bool = False,
                 service_by_completion: bool = False, ready_seen_every_s: float | None = None,
                 dispatch: Dispatch = "shared") -> None:
        if dispatch not in DISPATCHES:
            raise ValueError(f"dispatch: expected one of {', '.join(DISPATCHES)}, got {dispatch!r}")
        self.w = workload
        self.tick_s = tick_s
        # The admission endpoint's view of the queue is a probe of the model servers every `probe_s`
        # (autoscaler.signals.queueprobe), not the instantaneous queue.
        self.probe_s = probe_s
        self._probed = (0, 0, 0.0)  # queue, busy slots, when
        self._since = 0  # admitted since that reading
        self._top = TopArrivals()  # when the top class's requests were answered, the last second
        self._next_probe = 0.0
        self.k = concurrency
        self.slo_s = slo_s
        n = len(workload.arrival_s)
        self.n = n
        self._arr = workload.arrival_s.tolist()
        self._svc = workload.service_s.tolist()
        self._prio = workload.priority.tolist()
        self._u = workload.uniform.tolist()
        self.wait = np.full(n, np.nan)
        self.shed = np.zeros(n, dtype=bool)
        self._i = 0
        self._busy = 0
        self.classes = workload.classes
        self._queue: deque[int] | ClassQueue | LeastConn = (
            ClassQueue(self._prio, len(self.classes)) if server_priority else deque())
        if dispatch == "least-conn":
            self._queue = LeastConn(
                slots=concurrency, arrival_s=self._arr, service_s=self._svc, waits=self.wait,
                new_queue=(lambda: ClassQueue(self._prio, len(self.classes))) if server_priority else deque)
        self._heap: list[float] = []
        onehot = np.zeros((len(self.classes), n + 1))
        for c in range(len(self.classes)):
            onehot[c, 1:] = np.cumsum(workload.priority == c)
        self._cum_class = onehot
        self._cum_tokens = np.concatenate([[0.0], np.cumsum(workload.output_tokens)])
        self.service_by_completion = service_by_completion
        self.ready_seen_every_s = ready_seen_every_s
        self.max_hold_s = max_hold_s
        self.held = np.zeros(n, dtype=bool)  # held at the gateway (only with max_hold_s)
        self.hold_s = np.full(n, np.nan)  # arrival -> release (or drop) of a held request
        self.dropped = np.zeros(n, dtype=bool)  # held longer than max_hold_s: 503, never served
        self._holding: ReleaseOrder[int] = ReleaseOrder()  # held now, in release order
        self._per: PerReplica | None = None  # what a Ready replica takes, from the latest decision with one
        self.wake_start: list[str | None] = [None] * n  # a held request's wake: its first replica on a slot or node
        self._wake: str | None = None  # the wake in progress

    # -- what the controller sees ---------------------------------------------------------------------------
    def signals(self, now: float, cluster: Cluster) -> Signals:
        if now <= 0:
            return Signals(cluster=cluster.state())  # nothing scraped yet
        arr = self.w.arrival_s
        lo, tick_lo, hi = np.searchsorted(arr, [now - RATE_WINDOW_S, now - self.tick_s, now], side="left")
        window = min(RATE_WINDOW_S, max(now, 1e-9))
        tick = min(self.tick_s, max(now, 1e-9))
        cum = self._cum_class
        counts = [float(cum[i, hi] - cum[i, tick_lo]) for i in range(len(self.classes))]
        if self.max_hold_s is not None:
            self._expire(now)
        by_class = {c: n / tick for c, n in zip(self.classes, counts)}
        waits = self.wait[lo:hi]
        gone = self.shed[lo:hi] | self.dropped[lo:hi]  # answered 429, or 503 after a hold: no wait
        waits = np.where(np.isnan(waits) & ~gone, now - arr[lo:hi], waits)
        waits = waits[~gone]
        p99 = float(np.percentile(waits, 99)) if len(waits) else 0.0
        service: Sample | None
        if self.service_by_completion:
            service = self._completed_service(now, window)
        else:
            started = ~np.isnan(self.wait[lo:hi]) & ~self.shed[lo:hi]
            service = Sample(float(self.w.service_s[lo:hi][started].mean()) if started.any() else 0.0, now)
        state = cluster.state()
        capacity = state.ready_replicas * self.k
        headroom = 1.0 - min(1.0, self._busy / capacity) if capacity else 0.0
        held = Sample(float(len(self._holding)), now) if self.max_hold_s is not None else None
        return Signals(
            cluster=state,
            queue_depth=Sample(float(len(self._queue)), now),
            in_flight=Sample(float(self._busy), now),
            p99_latency_s=Sample(p99, now),
            gpu_memory_headroom_ratio=Sample(headroom, now),
            token_rate_per_s=Sample(float(self._cum_tokens[hi] - self._cum_tokens[lo]) / window, now),
            arrival_rate_per_s=Sample(sum(counts) / tick, now),
            service_time_s=service,
            arrival_rate_by_priority=by_class,
            held_requests=held,
        )

    # -- serving ---------------------------------------------------------------------------------------------
    def serve(
        self, start: float, end: float, cluster: Cluster, shed: dict[str, float], guard: Guard | None = None
    ) -> None:
        """Serve [start, end). `guard`: per class, while the queue the admission endpoint sees is at least
        that deep, arrivals of the class are rejected (the saturation guard)."""
        arr, svc = self._arr, self._svc
        wait = self.wait
        heap, queue = self._heap, self._queue
        levels = [float(shed.get(c, 0.0)) for c in self.classes]
        any_shed = any(levels)
        guard = guard or Guard()
        if isinstance(queue, LeastConn):
            self._serve_least_conn(start, end, cluster, admission=(levels, guard))
            return
        depth = guard.depths(self.classes)
        k = self.k
        cap = cluster.ready(start) * k
        # (when, slots it adds): a replica turning Ready, and with `ready_seen_every_s` while requests are held,
        # the loop's tick at which the release sees it (no slots: only a release)
        ready_at = cluster.ready_times_between(start, end)
        seen_at = self._seen_at(cluster, start, end)
        ready_events = deque(sorted([(r, k) for r in ready_at] + [(r, 0) for r in seen_at]))
        busy, i, n = self._busy, self._i, self.n
        holding = self.max_hold_s is not None
        if guard.slots > 0:
            self._per = guard.per_replica(k)

        def admitted(j: int, t: float, released: tuple[float, int] | None = None) -> bool:
            return self._admitted(j, t, levels=levels, any_shed=any_shed, depth=depth, guard=guard, released=released)

        def release(t: float) -> None:
            self._release(t, cluster, ready=cap // k, occupied=len(queue) + busy,
                          admitted=lambda j, at, queued: admitted(j, at, released=queued),
                          join=lambda j, _: queue.append(j))

        if self._holding and cap > 0:
            release(start)
        while queue and busy < cap:  # capacity that landed since the previous interval
            j = queue.popleft()
            wait[j] = start - arr[j]
            heapq.heappush(heap, start + svc[j])
            busy += 1
        while True:
            ta = arr[i] if i < n else INF
            tc = heap[0] if heap else INF
            tr = ready_events[0][0] if ready_events else INF
            if tc <= ta and tc <= tr:
                t = tc
                if t >= end:
                    break
                heapq.heappop(heap)
                busy -= 1
            elif tr <= ta:
                t = tr
                if t >= end:
                    break
                cap += ready_events.popleft()[1]
            else:
                t = ta
                if t >= end:
                    break
                j = i
                i += 1
                self._probe(t, queued=len(queue), busy=busy)
                if holding and (cap == 0 or self._holding):  # held: answered on its release
                    self._hold(j, cluster, at_zero=cap == 0)
                elif not admitted(j, t):
                    continue
                elif busy < cap and not queue:
                    wait[j] = 0.0
                    heapq.heappush(heap, t + svc[j])
                    busy += 1
                    continue
                else:
                    queue.append(j)
                    continue
            if self._holding and cap > 0:
                release(t)
            while queue and busy < cap:
                j = queue.popleft()
                wait[j] = t - arr[j]
                heapq.heappush(heap, t + svc[j])
                busy += 1
        self._busy, self._i = busy, i

    def _serve_least_conn(self, start: float, end: float, cluster: Cluster, *,
                          admission: tuple[list[float], Guard]) -> None:
        """Serve [start, end) with a queue per replica (`dispatch.LeastConn`): each admitted arrival joins
        the Ready replica with the fewest requests; a replica turning Ready joins empty."""
        levels, guard = admission
        depth, any_shed = guard.depths(self.classes), any(levels)
        servers, arr, n, i = self._queue, self._arr, self.n, self._i
        assert isinstance(servers, LeastConn)
        servers.resize(cluster.ready(start), start)
        ready_at = deque(sorted(cluster.ready_times_between(start, end)))
        seen_at = deque(self._seen_at(cluster, start, end))
        holding = self.max_hold_s is not None
        if guard.slots > 0:
            self._per = guard.per_replica(self.k)
        if self._holding and servers.ready:
            self._release_least_conn(start, cluster, servers, admission=(levels, any_shed, depth, guard))
        while True:
            ta = arr[i] if i < n else INF
            tc = servers.next_completion_s()
            tr = ready_at[0] if ready_at else INF
            ts = seen_at[0] if seen_at else INF
            t = min(ta, tc, tr, ts)
            if t >= end:
                break
            if tc == t:
                servers.complete()
            elif tr == t:
                turned = 0
                while ready_at and ready_at[0] == tr:  # together: requests waiting for one spread over all
                    ready_at.popleft()
                    turned += 1
                servers.resize(len(servers.ready) + turned, tr)
            elif ts == t:
                seen_at.popleft()
            else:
                self._probe(ta, queued=len(servers), busy=servers.busy)
                if holding and (not servers.ready or self._holding):  # held: answered on its release
                    self._hold(i, cluster, at_zero=not servers.ready)
                elif self._admitted(i, ta, levels=levels, any_shed=any_shed, depth=depth, guard=guard):
                    servers.join(i, ta)
                i += 1
            if self._holding and servers.ready:
                self._release_least_conn(t, cluster, servers, admission=(levels, any_shed, depth, guard))
        self._busy, self._i = servers.busy, i

    def _seen_at(self, cluster: Cluster, start: float, end: float) -> list[float]:
        """With `ready_seen_every_s` while requests may be held, the loop's ticks in [start, end) at which the
        release first sees a replica Ready (nothing else happens then): its next tick on the period, or the
        next arrival if sooner, as a request held wakes the loop at once (a request that arrives while others
        are held is held)."""
        if self.max_hold_s is None or not self.ready_seen_every_s:
            return []
        seen = {self._published_at(r) for r in cluster.ready_times_between(start - self.ready_seen_every_s, end)}
        return sorted(t for t in seen if start <= t < end)

    def _published_at(self, ready_s: float) -> float:
        """When the loop publishes a replica that turned Ready at `ready_s`: at its next tick on the period, or
        at the next arrival if sooner (a request held wakes the loop at once)."""
        every, arr = self.ready_seen_every_s, self._arr
        assert every
        tick = math.ceil(ready_s / every) * every
        following = bisect.bisect_right(arr, ready_s)
        return min(tick, arr[following]) if following < len(arr) else tick

    def _ready_seen(self, cluster: Cluster, t: float) -> int:
        """The Ready replicas the loop's latest tick by `t` published (`_published_at`)."""
        assert self.ready_seen_every_s
        tick = math.floor(t / self.ready_seen_every_s) * self.ready_seen_every_s
        return cluster.ready(tick) + sum(self._published_at(r) <= t for r in cluster.ready_times_between(tick, t))

    def _hold(self, j: int, cluster: Cluster, *, at_zero: bool) -> None:
        """Request `j` is held at the gateway until its release (the first at zero names the wake)."""
        if not self._holding and at_zero:
            self._wake = wake_start(cluster.state())
        self.held[j] = True
        self.wake_start[j] = self._wake
        self._holding.push(-self._prio[j], j)

    def _release_least_conn(self, t: float, cluster: Cluster, servers: LeastConn, *,
                            admission: tuple[list[float], bool, list[float], Guard]) -> None:
        """Held requests leave as with the shared queue (`_release`), each to the replica with the fewest
        requests in it."""
        levels, any_shed, depth, guard = admission
        self._release(t, cluster, ready=len(servers.ready), occupied=len(servers) + servers.busy,
                      admitted=lambda j, at, queued: self._admitted(j, at, levels=levels, any_shed=any_shed,
                                                                    depth=depth, guard=guard, released=queued),
                      join=servers.join)

    def _release(self, t: float, cluster: Cluster, *, ready: int, occupied: int,
                 admitted: Callable[[int, float, tuple[float, int]], bool],
                 join: Callable[[int, float], None]) -> None:
        """Held requests leave at `t`, in order, as far as the `ready` replicas take them (their slots and
        queue allowance less the `occupied`: served or queued); `admitted` answers each on its release, given
        the queue the release counts (what is occupied beyond the Ready slots) and those Ready replicas, and
        an admitted one `join`s the dispatch; one held past `max_hold_s` is dropped."""
        if self.ready_seen_every_s:  # the Ready count the endpoint got at the loop's latest tick
            ready = min(ready, self._ready_seen(cluster, t))
        left = room(ready=ready, slots=self.k, per=self._per, occupied=occupied)
        while self._holding and left >= 1:
            j = self._holding.pop()
            self.hold_s[j] = t - self._arr[j]
            if self.max_hold_s is not None and t - self._arr[j] > self.max_hold_s:
                self.hold_s[j], self.dropped[j] = self.max_hold_s, True
            elif admitted(j, t, (max(0.0, occupied - ready * self.k), ready)):
                join(j, t)
                left -= 1
                occupied += 1

    def _probe(self, t: float, *, queued: int, busy: int) -> None:
        """The admission endpoint's reading of the servers, every `probe_s`."""
        if t >= self._next_probe:
            self._probed, self._since = (queued, busy, t), 0
            self._next_probe = (t // self.probe_s + 1) * self.probe_s

    def _admitted(self, j: int, t: float, *, levels: list[float], any_shed: bool, depth: list[float],
                  guard: Guard, released: tuple[float, int] | None = None) -> bool:
        """The shed levels and the saturation guard, as the endpoint answers a request (or a held one on its
        release); an admitted request counts in the endpoint's view of the queue. `released`: a held request on
        its release, with the queue the release counted and its Ready replicas. The endpoint's guard sees the
        reading carried forward, never less than that queue (its own admissions beyond the Ready slots), against
        depths for those Ready replicas: while requests are held the loop decides again on each one that
        arrives, where the twin's decision, and its depths, are the tick's."""
        if self._prio[j] == 0 and released is None:
            self._top.add(t)
        if any_shed and self._u[j] < levels[self._prio[j]]:
            self.shed[j] = True
            return False
        if depth[self._prio[j]] < INF:
            seen = carried_queue(queue=self._probed[0], in_flight=self._probed[1], admitted=self._since,
                                 slots=guard.slots, drain_per_s=guard.drain_per_s, elapsed_s=t - self._probed[2])
            if released is not None:
                seen = self._released_queue(max(seen, released[0]), released[1], guard)
            overrun = released is None and overrun_rejects(queue=seen) and self._top.outruns(t, guard.drain_per_s)
            if seen >= depth[self._prio[j]] or overrun or (released is None and self._reserved(t, guard)):
                self.shed[j] = True
                return False
        self._since += 1
        return True

    def _released_queue(self, queued: float, ready: int, guard: Guard) -> float:
        """`queued` at a release, scaled to the Ready replicas the decision's depths are for (the decision's
        depth per Ready replica, times the `ready` replicas the release counts)."""
        decided = guard.slots / self.k
        return queued * decided / ready if decided > 0 and ready > 0 else queued

    def _reserved(self, t: float, guard: Guard) -> bool:
        """The slots kept for the top class are all that is free: the reading's queue and busy slots, carried
        forward with the admissions since and the ready slots' completions, as the endpoint counts them."""
        if guard.reserve <= 0:
            return False
        busy = occupied(queue=self._probed[0], in_flight=self._probed[1], admitted=self._since,
                        drain_per_s=guard.drain_per_s, elapsed_s=t - self._probed[2])
        return reserve_rejects(busy=busy, slots=guard.slots, reserve=guard.reserve)

    def _completed_service(self, now: float, window: float) -> Sample | None:
        """The mean service time of the requests completed in the last `window` (as vLLM's inference-time
        histogram counts them, at completion); None when none completed (the live query reads no value)."""
        arr, wait, svc = self.w.arrival_s, self.wait, self.w.service_s
        lo, hi = np.searchsorted(arr, [now - window - COMPLETION_LOOKBACK_S, now], side="left")
        done = arr[lo:hi] + wait[lo:hi] + svc[lo:hi]  # NaN while waiting: never in the window
        mask = (done > now - window) & (done <= now)
        return Sample(float(svc[lo:hi][mask].mean()), now) if mask.any() else None

    def _expire(self, now: float) -> None:
        """Drop the requests held longer than `max_hold_s` by `now` (the gateway's 503)."""
        assert self.max_hold_s is not None
        arr, limit = self._arr, self.max_hold_s
        if not any(now - arr[j] > limit for j in self._holding):
            return
        kept: ReleaseOrder[int] = ReleaseOrder()
        for j in self._holding:
            if now - arr[j] > limit:
                self.hold_s[j], self.dropped[j] = limit, True
            else:
                kept.push(-self._prio[j], j)
        self._holding = kept

    def finish(self, end: float) -> None:
        """Requests still queued or held at the end waited at least until then."""
        for j in self._queue:
            self.wait[j] = end - self.w.arrival_s[j]
        self._queue.clear()
        for j in self._holding:
            self.wait[j] = self.hold_s[j] = end - self.w.arrival_s[j]
        self._holding = ReleaseOrder()

    # -- outcome -------------------------------------------------------------------------------------------
    def outcome(self) -> dict:
        met = (self.wait <= self.slo_s) & ~self.shed
        attainment, shed_by_class = {}, {}
        for c, name in enumerate(self.classes):
            mask = self.w.priority == c
            count = int(mask.sum())
            attainment[name] = float(met[mask].sum() / count) if count else 1.0
            shed_by_class[name] = float(self.shed[mask].sum() / count) if count else 0.0
        admitted = self.wait[~self.shed]
        admitted = admitted[~np.isnan(admitted)]
        return {
            "requests": self.n,
            "slo_attainment": attainment,
            "shed_by_class": shed_by_class,
            "shed_fraction": float(self.shed.mean()) if self.n else 0.0,
            "p99_queue_wait_s": float(np.percentile(admitted, 99)) if len(admitted) else 0.0,
            "shed_time_s": {name: float(len(np.unique(self.w.arrival_s[self.shed & (self.w.priority == c)]
                                                      // self.tick_s)) * self.tick_s)
                            for c, name in enumerate(self.classes)},
            **self._holds(),
            **({"drain": self._queue.drain()} if isinstance(self._queue, LeastConn) else {}),
        }

    def _holds(self) -> dict:
        """{"hold": figures} with scale to zero modelled, else nothing (the outcome is as without it)."""
        if self.max_hold_s is None:
            return {}
        holds = Holds(self.max_hold_s)
        for j in np.flatnonzero(self.held & ~self.shed):
            holds.add(float(self.hold_s[j]), dropped=bool(self.dropped[j]), start=self.wake_start[j])
        return {"hold": holds.figures()}
