"""The control loop: one tick every `tick_s`, each under a deadline.

A tick reads the clock once and passes `now` down; collects the Prometheus samples and the cluster
state concurrently, each bounded by the tick deadline (a source that fails or is late is simply missing:
the policy holds, it never reads zero); runs `policies.decide`; publishes the decision (for KEDA and the
admission endpoint), the metrics and one JSON log line with the reasons; and, only in `actuate` mode and
only while this replica leads, applies it: replicas through the scale subresource, the warm pool, and an
Event for every scaling action. Errors are counted by kind and logged; nothing escapes the tick but
cancellation.

A tick is two halves, `decide` (collect, decide) and `finish` (publish, record, apply), so that the fleet
controller can decide every model, then decide the fleet together (`autoscaler/fleet/allocation.py`), then
finish each model with its share; `tick` is both halves at once.

Scale to zero: a request held at the admission endpoint sets the board's `wake`, which the loop's sleep
waits on: the next tick starts at once (KEDA's StreamIsActive has said active already; in actuate mode the
scale write follows within the tick). The held count is the `held_requests` signal (`reports_held`), and
while any request is held the loop ticks every `HELD_TICK_S`, so the Ready replica that releases them is
published within that.

Collaborators are narrow Protocols, so the loop is unit-tested with a few lines of fakes and
integration-tested with the real Prometheus and kube-apiserver.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import structlog

from autoscaler.board import DecisionBoard, Published
from autoscaler.clock import Clock, SystemClock
from autoscaler.config import Mode, Settings
from autoscaler.errors import EdgeError
from autoscaler.kube.warmpool import WarmPool
from autoscaler.metrics import ControllerMetrics
from autoscaler.signals.prometheus import QueryResult
from policies import SAMPLE_SIGNALS, ClusterState, Decision, Sample, Signals, decide, initial_state
from policies.stages.forecast import Fitter

log = structlog.get_logger("autoscaler")

# Reading the signals may take 80 % of the tick's deadline; the rest is left for deciding and acting.
COLLECT_SHARE_OF_DEADLINE = 0.8


class SampleSource(Protocol):
    async def collect(self, now: float) -> QueryResult: ...


class ClusterSource(Protocol):
    async def read(self, now: float) -> ClusterState: ...

    async def pod_template(self) -> Any: ...


class Scaler(Protocol):
    async def scale(self, replicas: int) -> tuple[int, int] | None: ...


class EventSink(Protocol):
    async def scaled(self, *, before: int, after: int, reasons: tuple[str, ...], now: float) -> None: ...

    async def capacity_unavailable(self, *, replicas: int, reasons: tuple[str, ...], now: float) -> None: ...


# While requests are held for a Ready replica, the loop ticks at least this often.
HELD_TICK_S = 1.0

# The admission endpoint's per-class rates are counted over at least this many ticks (`PriorityCounter.rates`).
RATE_MIN_TICKS = 0.5

# A CapacityUnavailable Warning is repeated at most this often while the shortfall stays the same.
CAPACITY_EVENT_EVERY_S = 300.0


@dataclass
class PriorityCounter:
    """Requests seen by the admission endpoint per priority, turned into rates between ticks."""

    counts: dict[str, int] = field(default_factory=dict)
    _snapshots: deque[tuple[float, dict[str, int]]] = field(default_factory=deque)

    def add(self, priority: str) -> None:
        self.counts[priority] = self.counts.get(priority, 0) + 1

    def rates(self, now: float, window_s: float = 0.0) -> dict[str, float]:
        """Per-class rates since the latest earlier reading at least `window_s` old (the oldest kept, over
        `window_s`, when none is). While requests are held at zero the loop ticks at once on each arrival: the
        time since the last tick then ends at the arrival that woke it, and a count over it reads several
        times the rate (one request over a tenth of a second). Over half a tick, ticks on the period read one
        tick, as before."""
        snapshot, kept = dict(self.counts), self._snapshots
        if kept and now < kept[-1][0]:  # the clock stepped back: start again
            kept.clear()
        while len(kept) > 1 and now - kept[1][0] >= window_s:
            kept.popleft()
        base = kept[0] if kept else None
        kept.append((now, snapshot))
        if base is None or now <= base[0]:
            return {}
        dt = max(now - base[0], window_s)  # just after a start no reading is that old: never a shorter count
        return {k: (v - base[1].get(k, 0)) / dt for k, v in snapshot.items()}


@dataclass(frozen=True)
class Decided:
    """A tick between deciding and finishing: its time, what was read, and the decision."""

    now: float
    signals: Signals
    decision: Decision


@dataclass
class Controller:
    settings: Settings
    sources: list[SampleSource]
    cluster: ClusterSource
    board: DecisionBoard
    metrics: ControllerMetrics
    scaler: Scaler | None = None
    warm_pool: WarmPool | None = None
    events: EventSink | None = None
    priorities: PriorityCounter | None = None
    is_leader: Callable[[], bool] = lambda: True
    clock: Clock = field(default_factory=SystemClock)
    state: Any = field(default_factory=initial_state)
    last_tick_s: float | None = None
    reports_held: bool = False  # the admission endpoint runs: its held count is the held_requests signal
    fit: Fitter | None = None  # where the refits run (autoscaler.fitchild.ProcessFitter); None: in process
    _capacity_event: tuple[int, float] | None = None  # (unplaceable replicas, when) of the last Warning

    def _error(self, exc: Exception, where: str) -> None:
        kind = getattr(exc, "kind", type(exc).__name__)
        self.metrics.errors.labels(kind).inc()
        log.warning("error", where=where, kind=kind, error=str(exc))

    async def _bounded(self, coro, where: str, deadline_s: float):
        try:
            return await asyncio.wait_for(coro, deadline_s)
        except asyncio.TimeoutError:
            self._error(EdgeError(f"{where} missed the tick deadline ({deadline_s:.1f} s)", kind="tick_deadline"),
                        where)
        except EdgeError as exc:
            self._error(exc, where)
        return None

    async def collect(self, now: float) -> Signals:
        deadline = self.settings.deadline_s * COLLECT_SHARE_OF_DEADLINE
        results = await asyncio.gather(
            *(self._bounded(s.collect(now), "signals", deadline) for s in self.sources),
            self._bounded(self.cluster.read(now), "cluster", deadline),
        )
        *queried, cluster = results
        samples: dict[str, Any] = {}
        for result in queried:
            if result is None:
                continue
            for name, error in result.errors.items():
                self._error(error, f"signal {name}")
            for name, sample in result.samples.items():
                if name in SAMPLE_SIGNALS and name not in samples:
                    samples[name] = sample
        if self.reports_held:
            gateway = samples.get("held_requests")  # an llm-d gateway's held requests, read as a query
            held = self.board.held_requests + (gateway.value if gateway is not None else 0.0)
            samples["held_requests"] = Sample(held, now)
        by_priority = ({} if self.priorities is None
                       else self.priorities.rates(now, RATE_MIN_TICKS * self.settings.tick_s))
        offered = sum(by_priority.values())
        measured = samples.get("arrival_rate_per_s")
        held = samples.get("held_requests")
        if by_priority and offered > (measured.value if measured is not None else 0.0) and (
                measured is not None or (held is not None and held.value > 0)):
            # The servers count what they completed, which leaves out what the gateway shed or holds: while
            # shedding, demand is what reached the admission endpoint (each controller replica counts the share
            # it answered, so the larger of the two is the better lower bound); while it holds requests at zero
            # no server reports at all, and what it counted (a held request when its hold starts) is the demand.
            samples["arrival_rate_per_s"] = Sample(offered, now)
        return Signals(cluster=cluster, arrival_rate_by_priority=by_priority, **samples)

    async def tick(self) -> Decision:
        started = time.perf_counter()
        return await self.finish(await self.decide(self.clock.now()), started_s=started)

    async def decide(self, now: float) -> Decided:
        """The first half of a tick: collect the signals and decide (nothing published or applied yet)."""
        signals = await self.collect(now)
        # In a worker thread: a scheduled statsmodels refit takes up to about a second on a week of history,
        # during which the admission endpoint and the probe on this event loop must keep answering.
        # With `fit` set (autoscaler run) the refit itself runs in a child process, which this thread waits for.
        decision, self.state = await asyncio.to_thread(decide, self.settings.policy, self.state, signals, now,
                                                       fit=self.fit)
        return Decided(now, signals, decision)

    async def finish(self, decided: Decided, *, started_s: float) -> Decision:
        """The second half: publish, record and (actuate mode, leader) apply `decided.decision`, which a fleet
        step may have changed since `decide`."""
        now, signals, decision = decided.now, decided.signals, decided.decision
        cluster = signals.cluster
        current = cluster.spec_replicas if cluster else None
        leader = self.is_leader()
        if not leader and current is not None:
            # A follower's decisions are not applied; the leader's are (the target's replicas). It keeps those as
            # recommendations of its own, so when it takes the Lease it holds them for a stabilization window
            # as the leader would have, instead of scaling down to what it alone would have kept.
            self.state = replace(self.state, recommendations=self.state.recommendations + ((now, current),))
        queue = signals.queue_depth.value if signals.queue_depth is not None else None
        await self.board.publish(Published(decision, current if current is not None else decision.replicas,
                                           queue, now, ready_replicas=cluster.ready_replicas if cluster else None))
        self.metrics.record(decision, current=current, ready=cluster.ready_replicas if cluster else None,
                            unschedulable=cluster.unschedulable_pods if cluster else None, cluster=cluster)
        self.metrics.leader.set(1 if leader else 0)
        log.info("decision", mode=self.settings.mode.value, leader=leader, valid=decision.valid,
                 replicas=decision.replicas, current=current, warm_slots=decision.warm_slots,
                 shed=dict(decision.shed), lead_time_s=decision.lead_time_s, reasons=list(decision.reasons))
        if self.settings.mode == Mode.actuate and leader and decision.valid:
            await self._bounded(self.act(decision, now), "actuate", self.settings.deadline_s)
        self.metrics.loop.observe(time.perf_counter() - started_s)
        self.last_tick_s = now
        return decision

    async def _warn_capacity(self, decision: Decision, now: float) -> None:
        stuck = decision.unplaceable_replicas
        last = self._capacity_event
        if stuck == 0 or self.events is None:
            self._capacity_event = None if stuck == 0 else last
            return
        if last is not None and last[0] == stuck and now - last[1] < CAPACITY_EVENT_EVERY_S:
            return
        try:
            await self.events.capacity_unavailable(replicas=stuck, reasons=decision.reasons, now=now)
            self._capacity_event = (stuck, now)
        except EdgeError as exc:
            self._error(exc, "event")

    async def act(self, decision: Decision, now: float) -> None:
        await self._warn_capacity(decision, now)
        # The Lease is checked again right before each write: a shard Lease is fenced by time and may have
        # ended while this tick decided (docs/sharding.md).
        if self.scaler is not None and self.is_leader():
            try:
                changed = await self.scaler.scale(decision.replicas)
            except EdgeError as exc:
                self._error(exc, "scale")
                changed = None
            if changed is not None:
                before, after = changed
                self.metrics.actions.labels("up" if after > before else "down").inc()
                if self.events is not None:
                    try:
                        await self.events.scaled(before=before, after=after, reasons=decision.reasons, now=now)
                    except EdgeError as exc:
                        self._error(exc, "event")
        if self.warm_pool is not None and self.settings.warm_pool.enabled and self.is_leader():
            try:
                await self.warm_pool.ensure(await self.cluster.pod_template(), decision.warm_slots)
            except EdgeError as exc:
                self._error(exc, "warm pool")

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set; ticks start on a fixed period, never overlapping."""
        period = self.settings.tick_s
        next_start = self.clock.now()
        wake = self.board.wake
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: wake.set())  # one event for the sleep: stop or a held request
        try:
            await self._ticks(stop, wake, period, next_start)
        finally:
            stopping.cancel()

    async def _ticks(self, stop: asyncio.Event, wake: asyncio.Event, period: float, next_start: float) -> None:
        while not stop.is_set():
            wake.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug must not kill the loop; it is counted and logged
                self._error(exc, "tick")
                log.exception("tick failed")
            next_start += period
            delay = next_start - self.clock.now()
            if delay < 0:  # late: start the next tick now and keep the period from there
                next_start = self.clock.now()
                delay = 0
            shortened = self.board.held_requests > 0 and delay > HELD_TICK_S
            if shortened:
                delay = HELD_TICK_S
            if await self.clock.wait(wake, delay) or shortened:
                next_start = self.clock.now()  # woken early: this tick starts now, the period from here
