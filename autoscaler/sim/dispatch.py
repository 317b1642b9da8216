"""Per-replica queues behind a least-connections gateway (the simulator's `least-conn` dispatch).

nginx's `least_conn` commits each request, when it arrives, to the Ready server with the fewest requests
in it (in its slots or queued), ties by a fixed order (the earliest Ready first), and each vLLM server
queues what it was given and serves only its own queue: first come first served, or by class with
`--scheduling-policy priority`. A request queued on one server waits for one of that server's slots while
another server may have a free one; one shared queue (the `shared` dispatch) does not, so at the same load
per-server queues wait more. With one replica both are the same M/M/c queue.

Invariants: the Ready servers are the first `ready` in Ready order, and the replicas the simulator removes
are the latest Ready (the ReplicaSet's choice with one replica per node; with several per node it removes
one on the least-used node, whose queue is statistically the same); a removed server takes no arrival and
keeps serving what it holds until it is empty (the drain: in-flight requests complete, queued ones are
served, as a terminating vLLM pod finishes its requests); no request moves between servers. The GPU bill is
the cluster's (`cluster.py`): a draining replica is not billed past its removal, as in the shared dispatch,
where the requests in its slots run to completion after the slots are gone.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Literal

DISPATCHES = ("shared", "least-conn")
Dispatch = Literal["shared", "least-conn"]


class Server:
    """One replica's slots in use, its own queue, and its place among the Ready servers (-1: removed)."""

    __slots__ = ("at", "busy", "queue", "removed_s")

    def __init__(self, queue, at: int) -> None:
        self.at = at
        self.busy = 0
        self.queue = queue
        self.removed_s = math.inf


class LeastConn:
    """The servers, their queues and the completions of the requests in their slots.

    `waits` and `service_s` are the simulator's arrays: `start` writes a request's queue wait and schedules
    its completion."""

    def __init__(self, *, slots: int, new_queue: Callable[[], object], arrival_s: list[float],
                 service_s: list[float], waits) -> None:
        self.k = slots
        self._new_queue = new_queue
        self._arr, self._svc, self._wait = arrival_s, service_s, waits
        self.ready: list[Server] = []  # take arrivals, in Ready order
        self._inside: list[int] = []  # requests in each Ready server (slots + queue): the balancer's view
        self.leaving: list[Server] = []  # removed, serving what they still hold
        self._heap: list[tuple[float, int, Server, int]] = []
        self._seq = itertools.count()  # completions at the same time: in start order
        self.pending: deque[int] = deque()  # arrived while no server was Ready: join the first that is
        self.busy = 0
        self._queued = 0
        # The drain: requests queued on a replica when it was removed, and the slot-seconds removed replicas
        # served after their removal (work no GPU bill counts: the cluster bills a replica until its removal)
        self.drained_requests = 0
        self.drain_slot_s = 0.0

    # -- the queue the simulator sees: all servers' queues ----------------------------------------------------
    def __len__(self) -> int:
        return self._queued + len(self.pending)

    def __iter__(self) -> Iterator[int]:
        yield from self.pending
        for server in self.ready + self.leaving:
            yield from server.queue

    def clear(self) -> None:
        for server in self.ready + self.leaving:
            server.queue.clear()
        self.pending.clear()
        self._queued = 0

    # -- events --------------------------------------------------------------------------------------------
    def resize(self, ready: int, t: float) -> None:
        """At `t`, `ready` servers take arrivals: new ones join empty (and take the requests that found no
        server, in arrival order), removed ones (the latest Ready) drain."""
        while len(self.ready) < ready:
            self.ready.append(Server(self._new_queue(), len(self.ready)))
            self._inside.append(0)
        while len(self.ready) > ready:
            server = self.ready.pop()
            server.at, server.removed_s = -1, t
            if self._inside.pop():
                self.leaving.append(server)
                self.drained_requests += len(server.queue)
        while self.ready and self.pending:
            self.join(self.pending.popleft(), t)

    def join(self, j: int, t: float) -> None:
        """Request `j` arrives at `t` (admitted): the Ready server with the fewest requests takes it; with
        none Ready it waits at the gateway for the first (as the shared queue waits for capacity)."""
        if not self.ready:
            self.pending.append(j)
            return
        inside = self._inside
        at = inside.index(min(inside))  # the first of the fewest: a fixed order
        inside[at] += 1
        server = self.ready[at]
        if server.busy < self.k:
            self._start(server, j, t)
        else:
            server.queue.append(j)
            self._queued += 1

    def drain(self) -> dict:
        """What removed replicas served after their removal: the requests queued on them then, and the
        slot-seconds (in replica-hours: the GPU time a replica draining its own queue holds unbilled)."""
        return {"queued_at_removal": self.drained_requests,
                "replica_hours_after_removal": round(self.drain_slot_s / self.k / 3600.0, 3)}

    def next_completion_s(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def complete(self) -> float:
        """The next completion: its slot takes the oldest (or highest-class) request of its server's queue."""
        t, _, server, j = heapq.heappop(self._heap)
        if t > server.removed_s:
            self.drain_slot_s += t - max(server.removed_s, t - self._svc[j])
        server.busy -= 1
        self.busy -= 1
        if server.at >= 0:
            self._inside[server.at] -= 1
        if server.queue:
            self._queued -= 1
            self._start(server, server.queue.popleft(), t)
        elif not server.busy and server in self.leaving:
            self.leaving.remove(server)  # drained: gone
        return t

    def _start(self, server: Server, j: int, t: float) -> None:
        self._wait[j] = t - self._arr[j]
        heapq.heappush(self._heap, (t + self._svc[j], next(self._seq), server, j))
        server.busy += 1
        self.busy += 1
