"""The ModelAutoscaler objects the fleet serves: list, then watch, kept as a snapshot in memory.

One `Informer` (autoscaler/kube/cache.py) per namespace of `namespaces` (empty: one cluster-wide), the same
list-then-watch as the cluster cache's: each lists the objects (so an object deleted while the watch was down is
gone), then watches from the list's resourceVersion with bookmarks, resuming whenever the server ends the watch;
a 410 Gone re-lists; any other failure is counted (`on_error`) and retried with backoff. Cancellation passes
through.

Every object is parsed on arrival (the informer's `parse`): `parse_spec`, then `settings_for` with the
process's base config. One that does not validate is kept in the snapshot with its error (a log line names
it; the status writer reports it as Active=False), never raising: one bad object stops nothing else. The fleet
controller reads `objects` at the start of every tick; it does not need to follow events one by one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

import structlog

from autoscaler.clock import Clock
from autoscaler.config import Settings
from autoscaler.crd import GROUP, PLURAL, VERSION, parse_spec, settings_for
from autoscaler.errors import ConfigError, EdgeError
from autoscaler.kube.cache import Informer
from autoscaler.kube.client import Kube

log = structlog.get_logger("autoscaler")

Key = tuple[str, str]


@dataclass(frozen=True)
class ModelObject:
    """One ModelAutoscaler as the controller understood it: its settings, or why it has none."""

    key: Key
    generation: int | None
    settings: Settings | None
    error: str | None = None
    tier: int = 1  # the spec's tier and weight, for the fleet decision (autoscaler/fleet/allocation.py)
    weight: float = 1.0


def understood(obj: dict[str, Any], base: dict[str, Any]) -> ModelObject:
    """An object from the apiserver -> its settings, or the validation error that names what is wrong."""
    meta = obj.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    generation = meta.get("generation")
    try:
        spec = parse_spec(obj.get("spec") or {}, source=f"ModelAutoscaler {key[0]}/{key[1]}: spec")
        return ModelObject(key, generation, settings_for(namespace=key[0], spec=spec, base=base), tier=spec.tier,
                           weight=spec.weight)
    except ConfigError as exc:
        log.warning("invalid model autoscaler", model=f"{key[0]}/{key[1]}", error=str(exc))
        return ModelObject(key, generation, None, error=str(exc))


class ObjectWatch:
    """The snapshot `objects` of every ModelAutoscaler in `namespaces` (empty: all), kept current by informers;
    `synced` is set once every one of them has listed."""

    def __init__(self, kube: Kube, *, namespaces: tuple[str, ...] = (), base: dict[str, Any] | None = None,
                 clock: Clock | None = None, on_error: Callable[[EdgeError], None] | None = None) -> None:
        self.namespaces = tuple(namespaces)
        self.base = dict(base or {})
        custom = kube.custom

        def informer(namespace: str | None) -> Informer:
            fn, args = ((custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL)) if namespace is None else
                        (custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL)))
            return Informer(kube, PLURAL, fn, args=args, parse=lambda obj: understood(obj, self.base),
                            on_error=on_error or (lambda exc: None))

        self.informers = [informer(ns) for ns in self.namespaces or (None,)]
        self.synced = asyncio.Event()

    @property
    def objects(self) -> dict[Key, ModelObject]:
        return {key: obj for informer in self.informers for key, obj in informer.items.items()}

    async def _mark_synced(self) -> None:
        await asyncio.gather(*(informer.listed.wait() for informer in self.informers))
        self.synced.set()

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(i.run(), name=f"watch {i.what}") for i in self.informers]
        tasks.append(asyncio.create_task(self._mark_synced()))
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
