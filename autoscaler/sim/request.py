"""Request-level simulation: every request of the trace, first-come first-served (or by class).

The gateway's queue feeds any free slot of any ready replica, one FCFS queue for all (how a least-loaded
balancer in front of vLLM behaves; vLLM itself serves FCFS by default). Priority acts only at admission:
a request of class c is shed when its fixed U(0,1) draw is below the shed level for c at that moment. So
with exponential service times and a fixed replica count this is exactly M/M/c, which the tests check
against Erlang C.

With `server_priority` the queue is served by (class, arrival), highest class first (vLLM's
`--scheduling-policy priority` with the class's priority in each request), non-preemptive: a request in a
slot keeps it. The admission signals still see one queue: its total depth.

The saturation guard sees the queue as the admission endpoint does: read every `probe_s` (1 s) with the
busy slots, and carried forward between readings with the requests admitted since (`carried_queue`).

Scale to zero (`max_hold_s` set): a request that arrives while no replica is ready is held (`hold.py`):
it waits in the same FCFS queue for the first Ready replica, its wait counts against the SLO, and it is
reported apart; the signals then carry `held_requests`, the requests queued while no replica is ready.

Signals at each tick are what the controller would read: arrivals per priority over the last tick (the
increase of the gateway's request counter), tokens, p99 queue wait and mean service time over the last
minute, queue and in-flight gauges.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from autoscaler.sim.cluster import Cluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.hold import Holds
from autoscaler.sim.workload import RequestWorkload
from policies.admission import carried_queue
from policies.types import Sample, Signals

RATE_WINDOW_S = 60.0
INF = math.inf


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
                 probe_s: float = 1.0, max_hold_s: float | None = None, server_priority: bool = False) -> None:
        self.w = workload
        self.tick_s = tick_s
        # The admission endpoint's view of the queue is a probe of the model servers every `probe_s`
        # (autoscaler.signals.queueprobe), not the instantaneous queue.
        self.probe_s = probe_s
        self._probed = (0, 0, 0.0)  # queue, busy slots, when
        self._since = 0  # admitted since that reading
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
        self._queue: deque[int] | ClassQueue = (
            ClassQueue(self._prio, len(self.classes)) if server_priority else deque())
        self._heap: list[float] = []
        onehot = np.zeros((len(self.classes), n + 1))
        for c in range(len(self.classes)):
            onehot[c, 1:] = np.cumsum(workload.priority == c)
        self._cum_class = onehot
        self._cum_tokens = np.concatenate([[0.0], np.cumsum(workload.output_tokens)])
        self.max_hold_s = max_hold_s
        self.held = np.zeros(n, dtype=bool)  # arrived while no replica was ready (only with max_hold_s)

    # -- what the controller sees ---------------------------------------------------------------------------
    def signals(self, now: float, cluster: Cluster) -> Signals:
        if now <= 0:
            return Signals(cluster=cluster.state())  # nothing scraped yet
        arr = self.w.arrival_s
        lo, tick_lo, hi = np.searchsorted(arr, [now - RATE_WINDOW_S, now - self.tick_s, now], side="left")
        window = min(RATE_WINDOW_S, max(now, 1e-9))
        tick = min(self.tick_s, max(now, 1e-9))
        cum = self._cum_class
        by_class = {c: float(cum[i, hi] - cum[i, tick_lo]) / tick for i, c in enumerate(self.classes)}
        waits = self.wait[lo:hi]
        pending = np.isnan(waits) & ~self.shed[lo:hi]
        waits = np.where(pending, now - arr[lo:hi], waits)
        waits = waits[~self.shed[lo:hi]]
        p99 = float(np.percentile(waits, 99)) if len(waits) else 0.0
        started = ~np.isnan(self.wait[lo:hi]) & ~self.shed[lo:hi]
        service = float(self.w.service_s[lo:hi][started].mean()) if started.any() else 0.0
        state = cluster.state()
        capacity = state.ready_replicas * self.k
        headroom = 1.0 - min(1.0, self._busy / capacity) if capacity else 0.0
        held = None
        if self.max_hold_s is not None:
            held = Sample(0.0 if state.ready_replicas else float(len(self._queue)), now)
        return Signals(
            cluster=state,
            queue_depth=Sample(float(len(self._queue)), now),
            in_flight=Sample(float(self._busy), now),
            p99_latency_s=Sample(p99, now),
            gpu_memory_headroom_ratio=Sample(headroom, now),
            token_rate_per_s=Sample(float(self._cum_tokens[hi] - self._cum_tokens[lo]) / window, now),
            arrival_rate_per_s=Sample(float(hi - tick_lo) / tick, now),
            service_time_s=Sample(service, now),
            arrival_rate_by_priority=by_class,
            held_requests=held,
        )

    # -- serving ---------------------------------------------------------------------------------------------
    def serve(
        self, start: float, end: float, cluster: Cluster, shed: dict[str, float], guard: Guard | None = None
    ) -> None:
        """Serve [start, end). `guard`: per class, while the queue the admission endpoint sees is at least
        that deep, arrivals of the class are rejected (the saturation guard)."""
        arr, svc, prio, u = self._arr, self._svc, self._prio, self._u
        wait, shed_out = self.wait, self.shed
        heap, queue = self._heap, self._queue
        levels = [float(shed.get(c, 0.0)) for c in self.classes]
        any_shed = any(levels)
        guard = guard or Guard()
        depth = guard.depths(self.classes)
        k = self.k
        cap = cluster.ready(start) * k
        ready_events = deque(sorted(cluster.ready_times_between(start, end)))
        busy, i, n = self._busy, self._i, self.n
        holding = self.max_hold_s is not None
        while queue and busy < cap:  # capacity that landed since the previous interval
            j = queue.popleft()
            wait[j] = start - arr[j]
            heapq.heappush(heap, start + svc[j])
            busy += 1
        while True:
            ta = arr[i] if i < n else INF
            tc = heap[0] if heap else INF
            tr = ready_events[0] if ready_events else INF
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
                ready_events.popleft()
                cap += k
            else:
                t = ta
                if t >= end:
                    break
                j = i
                i += 1
                if t >= self._next_probe:
                    self._probed, self._since = (len(queue), busy, t), 0
                    self._next_probe = (t // self.probe_s + 1) * self.probe_s
                if any_shed and u[j] < levels[prio[j]]:
                    shed_out[j] = True
                    continue
                if depth[prio[j]] < INF:
                    seen = carried_queue(queue=self._probed[0], in_flight=self._probed[1], admitted=self._since,
                                         slots=guard.slots, drain_per_s=guard.drain_per_s,
                                         elapsed_s=t - self._probed[2])
                    if seen >= depth[prio[j]]:
                        shed_out[j] = True
                        continue
                self._since += 1
                if holding and cap == 0:
                    self.held[j] = True
                if busy < cap and not queue:
                    wait[j] = 0.0
                    heapq.heappush(heap, t + svc[j])
                    busy += 1
                else:
                    queue.append(j)
                continue
            while queue and busy < cap:
                j = queue.popleft()
                wait[j] = t - arr[j]
                heapq.heappush(heap, t + svc[j])
                busy += 1
        self._busy, self._i = busy, i

    def finish(self, end: float) -> None:
        """Requests still queued at the end waited at least until then."""
        for j in self._queue:
            self.wait[j] = end - self.w.arrival_s[j]
        self._queue.clear()

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
        }

    def _holds(self) -> dict:
        """{"hold": figures} with scale to zero modelled, else nothing (the outcome is as without it)."""
        if self.max_hold_s is None:
            return {}
        holds = Holds(self.max_hold_s)
        for wait in self.wait[self.held & ~self.shed]:
            holds.add(float(wait))
        return {"hold": holds.figures()}
