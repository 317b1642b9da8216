"""The fleet controller: one process controls every ModelAutoscaler it watches.

One fleet tick every `tick_s` (the process config's policy.tick_s):
1. reconcile the models with the watched objects (`ObjectSource.objects`): a new object gets a
   `loop.Controller`, ticking from this tick; a changed spec gets its new settings now, with the learned
   `PolicyState` kept unless the target changed (`ModelBuilder.update`); a deleted object's control stops
   (nothing is written on the way out); an object whose spec does not validate is not controlled and is
   reported in its status;
2. refresh the shared signals once (`SignalHub.refresh`, when a hub is given);
3. tick every model concurrently, each bounded by what is left of the tick's deadline: a model that fails or
   is late is counted and logged, and the others go on (a late one holds: its tick is cancelled);
4. write the status of every model this replica owns (`status.StatusWriter`, only when changed or every
   N ticks), not in shadow mode (which writes nothing).
Every replica decides every model (so any replica answers KEDA and admission); a model's decisions are
applied only where `is_leader` holds: `gate.owns(key)` with a ShardGate (its fenced shard Lease), else the
process's leader election.

The collaborators are Protocols (below), implemented structurally elsewhere: `SignalHub` (one PromQL query per
signal for the fleet), `ClusterCache` (watches instead of lists per model), `ShardGate` (shard Leases). Each
defaults to today's per-model readers (`autoscaler/runtime.py`'s builders) when not given.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Protocol

import structlog

from autoscaler.config import Mode, Settings
from autoscaler.errors import EdgeError
from autoscaler.fleet.allocation import FleetStep
from autoscaler.fleet.metrics import FleetMetrics
from autoscaler.fleet.model import Key, ModelBuilder, ModelControl
from autoscaler.fleet.status import StatusWriter, status_of
from autoscaler.fleet.watch import ModelObject
from autoscaler.loop import HELD_TICK_S, ClusterSource, Decided, SampleSource

log = structlog.get_logger("autoscaler")


class SignalHub(Protocol):
    async def refresh(self, now: float, models: Mapping[tuple[str, str], Settings]) -> None: ...

    def source(self, key: tuple[str, str]) -> SampleSource: ...


class ClusterCache(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def cluster_source(self, key: tuple[str, str], settings: Settings) -> ClusterSource: ...


class ShardGate(Protocol):
    def owns(self, key: tuple[str, str]) -> bool: ...

    async def run(self, stop: asyncio.Event) -> None: ...


class ObjectSource(Protocol):
    @property
    def objects(self) -> Mapping[Key, ModelObject]: ...


@dataclass
class FleetController:
    settings: Settings  # the process's: tick_s, deadline, mode
    objects: ObjectSource
    builder: ModelBuilder
    metrics: FleetMetrics
    hub: SignalHub | None = None
    gate: ShardGate | None = None
    is_leader: Callable[[], bool] = lambda: True  # the process's leader election, without a gate
    status: StatusWriter | None = None
    step: FleetStep | None = None  # the fleet decision between the models' decide and finish (None: none)
    models: dict[Key, ModelControl] = field(default_factory=dict)
    invalid: dict[Key, ModelObject] = field(default_factory=dict)
    last_tick_s: float | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def owns(self, key: Key) -> bool:
        return self.gate.owns(key) if self.gate is not None else self.is_leader()

    def _error(self, exc: Exception, where: str, key: Key | None = None) -> None:
        kind = getattr(exc, "kind", type(exc).__name__)
        self.metrics.errors.labels(kind).inc()
        log.warning("error", where=where, kind=kind, error=str(exc),
                    **({"model": f"{key[0]}/{key[1]}"} if key else {}))

    async def reconcile(self) -> None:
        desired = dict(self.objects.objects)
        self.invalid = {k: o for k, o in desired.items() if o.settings is None}
        for key in [k for k in self.models if k not in desired or desired[k].settings is None]:
            model = self.models.pop(key)
            await model.stop()
            if self.builder.readers.forget is not None:
                self.builder.readers.forget(key)
            if self.status is not None and key not in self.invalid:
                self.status.forget(key)
            log.info("model stopped", model=f"{key[0]}/{key[1]}")
        for key, obj in desired.items():
            if obj.settings is None:
                continue
            model = self.models.get(key)
            if (model is None or obj.settings != model.settings) and obj.settings.tick_s != self.settings.tick_s:
                # the model ticks at the fleet's pace; its policy sizes windows counted in its own tick_s
                log.warning("model tick_s differs from the fleet's", model=f"{key[0]}/{key[1]}",
                            model_tick_s=obj.settings.tick_s, fleet_tick_s=self.settings.tick_s)
            if model is None:
                self.models[key] = self.builder.build(key, obj.settings, generation=obj.generation,
                                                      is_leader=lambda key=key: self.owns(key))
                log.info("model started", model=f"{key[0]}/{key[1]}", generation=obj.generation)
            elif obj.settings != model.settings:
                await self.builder.update(model, obj.settings, generation=obj.generation)
                log.info("model updated", model=f"{key[0]}/{key[1]}", generation=obj.generation)
            else:
                model.generation = obj.generation
        self.metrics.models.set(len(self.models))
        self.metrics.invalid.set(len(self.invalid))

    async def _tick_model(self, model: ModelControl, deadline_s: float) -> None:
        decision = await self._bounded(model, model.controller.tick(), deadline_s)
        if decision is not None:
            model.decision = decision
            model.decided_s = model.controller.last_tick_s

    async def _bounded(self, model: ModelControl, coro, deadline_s: float):
        try:
            return await asyncio.wait_for(coro, max(0.0, deadline_s))
        except asyncio.TimeoutError:
            self._error(EdgeError(f"tick missed the fleet deadline ({deadline_s:.1f} s)", kind="tick_deadline"),
                        "model tick", model.key)
        except Exception as exc:  # noqa: BLE001 - one model's bug must not stop the others
            self._error(exc, "model tick", model.key)
            log.exception("model tick failed", model=f"{model.key[0]}/{model.key[1]}")
        return None

    async def _tick_together(self, deadline_at: float) -> None:
        """Every model decides, then the fleet decides together (`step`), then every model finishes with its
        allocation; a model that fails or is late in either half is left out, as in `_tick_model`."""
        clock, started = self.builder.clock, time.perf_counter()
        models = list(self.models.values())
        decided = await asyncio.gather(*(self._bounded(m, m.controller.decide(clock.now()), deadline_at - clock.now())
                                         for m in models))
        ready: dict[Key, Decided] = {m.key: d for m, d in zip(models, decided) if d is not None}
        write_pool = self.settings.mode == Mode.actuate and self.is_leader()
        assert self.step is not None
        final = await self.step.run(ready, controllers={k: self.models[k].controller for k in ready},
                                    objects=self.objects.objects, write_pool=write_pool)

        async def finish(model: ModelControl) -> None:
            model.decision = await model.controller.finish(final[model.key], started_s=started)
            model.decided_s = model.controller.last_tick_s
            share = self._pooled_share(model.key)
            if share is not None:  # pooled: its decision's warm_slots is 0, its share is in the fleet's pool
                model.metrics.warm.set(share)

        await asyncio.gather(*(self._bounded(m, finish(m), deadline_at - clock.now()) for m in models
                               if m.key in final))

    def _pooled_share(self, key: Key) -> int | None:
        """The model's share of the fleet's pooled warm slots (None: warm capacity is not pooled)."""
        return self.step.pooled_share(key) if self.step is not None else None

    async def _write_statuses(self, now: float) -> None:
        if self.status is None or self.settings.mode == Mode.shadow:
            return
        self.status.next_tick()
        writes = []
        for key, model in self.models.items():
            if model.decision is not None and self.owns(key):
                share = self._pooled_share(key)  # as the gauge: its share of the pool, not its own 0
                shown = model.decision if share is None else replace(model.decision, warm_slots=share)
                writes.append(self.status.write(key, status_of(
                    decision=shown, error=None, generation=model.generation, decided_s=model.decided_s,
                    previous=self.status.previous_conditions(key), now=now)))
        for key, obj in self.invalid.items():
            if self.owns(key):
                writes.append(self.status.write(key, status_of(
                    decision=None, error=obj.error, generation=obj.generation, decided_s=None,
                    previous=self.status.previous_conditions(key), now=now)))
        await asyncio.gather(*writes)

    async def tick(self) -> None:
        started = time.perf_counter()
        clock = self.builder.clock
        now = clock.now()
        await self.reconcile()
        deadline_at = now + self.settings.deadline_s
        if self.hub is not None and self.models:
            try:
                await asyncio.wait_for(self.hub.refresh(now, {k: m.settings for k, m in self.models.items()}),
                                       self.settings.deadline_s / 2)
            except asyncio.TimeoutError:
                self._error(EdgeError("shared signals missed half the tick's deadline", kind="tick_deadline"),
                            "signals")
            except EdgeError as exc:
                self._error(exc, "signals")
        if self.step is None:
            await asyncio.gather(*(self._tick_model(m, deadline_at - clock.now()) for m in list(self.models.values())))
        else:
            await self._tick_together(deadline_at)
        await self._write_statuses(clock.now())
        self.last_tick_s = now
        self.metrics.tick.observe(time.perf_counter() - started)

    def _held(self) -> bool:
        return any(m.board.held_requests > 0 for m in self.models.values())

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop`; ticks start on a fixed period, never overlapping; a held request ticks at once."""
        clock = self.builder.clock
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self.wake.set())
        next_start = clock.now()
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - counted and logged; the next tick comes
                    self._error(exc, "fleet tick")
                    log.exception("fleet tick failed")
                next_start = max(next_start + self.settings.tick_s, clock.now())
                delay = next_start - clock.now()
                if self._held():
                    delay = min(delay, HELD_TICK_S)
                if await clock.wait(self.wake, delay):
                    next_start = clock.now()
        finally:
            stopping.cancel()
            await asyncio.gather(*(m.stop() for m in self.models.values()))
