"""One model of the fleet: its `loop.Controller` and what serves it (board, metrics, admission), built from
its Settings with the single mode's builders (`autoscaler/runtime.py`), not copies of them.

A model's board, metrics and priority counter live as long as its object; a spec change builds a new
controller (and admission) from the new settings around them, keeping the learned `PolicyState` unless the
target changed (another workload: what was learned about this one does not apply). Background tasks of a
model (its admission queue probe) run until its own stop event: deleting the object stops them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import aiohttp
from prometheus_client import CollectorRegistry

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard
from autoscaler.clock import Clock
from autoscaler.config import Mode, Settings
from autoscaler.kube.client import Kube
from autoscaler.kube.events import EventRecorder
from autoscaler.kube.pooledwarm import PooledWarmPool
from autoscaler.loop import ClusterSource, Controller, PriorityCounter, SampleSource
from autoscaler.metrics import ControllerMetrics
from autoscaler.kube.readers import build_cluster_reader, build_warm_pool
from autoscaler.runtime import Parts, build_admission, build_scaler, build_sources, decision_board
from autoscaler.signals.prometheus import PrometheusSource
from policies import ClusterState, Decision, initial_state
from policies.stages.forecast import Fitter

Key = tuple[str, str]


@dataclass
class Readers:
    """Where a model's signals and cluster state come from: the fleet's shared ones, or its own (None)."""

    source: Callable[[Key], SampleSource] | None = None
    cluster: Callable[[Key, Settings], ClusterSource] | None = None
    forget: Callable[[Key], None] | None = None  # a model's object was deleted: drop what the cache keeps


@dataclass
class ModelControl:
    key: Key
    settings: Settings
    generation: int | None
    controller: Controller
    board: DecisionBoard
    metrics: ControllerMetrics
    priorities: PriorityCounter
    admission: Admission | None = None
    decision: Decision | None = None
    decided_s: float | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start_tasks(self, parts: Parts) -> None:
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(task(self._stop)) for task in parts.tasks]

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []


@dataclass(frozen=True)
class ReclaimableView:
    """A model's cluster reader in a fleet whose budget binds: its idle slots plus the replicas the last fleet
    decision would give it at once from GPUs lower tiers hold (`policies.fleet.reclaimable`). Such a GPU is
    paid for already and serves after a drain and a start-up, with no node to provision, as an idle node
    does: its lead time drops the node provisioning and an unconfirmed burst is ordered onto it."""

    inner: ClusterSource
    reclaimable: Callable[[], int]

    async def read(self, now: float) -> ClusterState:
        state = await self.inner.read(now)
        extra = self.reclaimable()
        return replace(state, idle_slots=state.idle_slots + extra) if extra > 0 else state

    async def pod_template(self) -> Any:
        return await self.inner.pod_template()


@dataclass
class ModelBuilder:
    """Builds and rebuilds the models of one process (its API client, HTTP session, identity and clock)."""

    kube: Kube
    session: aiohttp.ClientSession
    identity: str
    clock: Clock
    readers: Readers = field(default_factory=Readers)
    wake: asyncio.Event | None = None  # one wake for the fleet: a request held for any model ticks at once
    fit: Fitter | None = None  # where the models' refits run (one ProcessFitter for the fleet); None: in process
    pooled: PooledWarmPool | None = None  # the fleet's warm pool (allocation.py): each model's WarmPool view
    reclaimable: Callable[[Key], int] | None = None  # the fleet step's (allocation.py): see ReclaimableView

    def _controller(self, key: Key, settings: Settings, *, board: DecisionBoard, metrics: ControllerMetrics,
                    priorities: PriorityCounter, is_leader: Callable[[], bool]) -> Controller:
        target = settings.target
        warm_pool = (self.pooled.share(namespace=target.namespace, kind=target.kind, name=target.name)
                     if self.pooled is not None else build_warm_pool(settings, self.kube))
        sources = build_sources(settings, self.kube, self.session)
        if self.readers.source is not None:  # the fleet's PromQL replaces the model's own; a pod scrape stays
            sources = [self.readers.source(key)] + [s for s in sources if not isinstance(s, PrometheusSource)]
        cluster = (self.readers.cluster(key, settings) if self.readers.cluster is not None
                   else build_cluster_reader(settings, self.kube, warm_pool))
        if self.reclaimable is not None:
            reclaimable = self.reclaimable
            cluster = ReclaimableView(cluster, lambda: reclaimable(key))
        return Controller(
            settings=settings, sources=sources, cluster=cluster, board=board, metrics=metrics, priorities=priorities,
            scaler=build_scaler(settings, self.kube, self.session, metrics=metrics) if settings.mode == Mode.actuate
            else None,
            warm_pool=warm_pool,
            events=EventRecorder(self.kube, namespace=target.namespace, kind=target.kind, name=target.name,
                                 instance=self.identity),
            is_leader=is_leader, clock=self.clock, reports_held=settings.admission.enabled, fit=self.fit,
        )

    def _admission(self, model: ModelControl) -> None:
        parts = Parts()
        if model.settings.admission.enabled:
            model.admission = build_admission(model.settings, self.kube, self.session, board=model.board,
                                              metrics=model.metrics, priorities=model.priorities, clock=self.clock,
                                              parts=parts)
        else:
            model.admission = None
        model.start_tasks(parts)

    def build(self, key: Key, settings: Settings, *, generation: int | None,
              is_leader: Callable[[], bool]) -> ModelControl:
        metrics = ControllerMetrics(CollectorRegistry())
        board = decision_board(settings, metrics=metrics, clock=self.clock, wake=self.wake)
        priorities = PriorityCounter()
        controller = self._controller(key, settings, board=board, metrics=metrics, priorities=priorities,
                                      is_leader=is_leader)
        model = ModelControl(key, settings, generation, controller, board, metrics, priorities)
        self._admission(model)
        return model

    async def update(self, model: ModelControl, settings: Settings, *, generation: int | None) -> None:
        """New settings from the next tick on; the learned state kept unless the target changed."""
        old = model.controller
        new = self._controller(model.key, settings, board=model.board, metrics=model.metrics,
                               priorities=model.priorities, is_leader=old.is_leader)
        new.state = old.state if settings.target == model.settings.target else initial_state()
        new.last_tick_s = old.last_tick_s
        model.controller, model.settings, model.generation = new, settings, generation
        await model.stop()
        self._admission(model)
