"""The ModelAutoscaler objects the fleet serves: list, then watch, kept as a snapshot in memory.

One watch per namespace of `namespaces` (empty: one cluster-wide watch). Each lists the objects, replaces its
share of the snapshot with the list (so an object deleted while the watch was down is gone), then watches from
the list's resourceVersion with bookmarks, resuming from the last resourceVersion seen whenever the server ends
the watch. A 410 Gone (the resourceVersion is older than etcd keeps) re-lists; any other failure waits with
backoff (doubling from `FIRST_RETRY_S` to `MAX_RETRY_S`) and resumes. Cancellation passes through.

Every object is parsed on arrival: `parse_spec`, then `settings_for` with the process's base config. One that
does not validate is kept in the snapshot with its error (a log line names it; the status writer reports it as
Active=False), never raising: one bad object stops nothing else. The fleet controller reads `objects` at the
start of every tick; it does not need to follow events one by one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

import structlog
from kubernetes_asyncio import watch as kube_watch
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.clock import Clock
from autoscaler.config import Settings
from autoscaler.crd import GROUP, PLURAL, VERSION, parse_spec, settings_for
from autoscaler.errors import ConfigError, EdgeError
from autoscaler.kube.client import Kube

log = structlog.get_logger("autoscaler")

Key = tuple[str, str]

# The server ends each watch after this long (it resumes at once from the last resourceVersion), so a
# connection that died silently is noticed within it.
WATCH_TIMEOUT_S = 300
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0


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
    """The snapshot `objects` of every ModelAutoscaler in `namespaces` (empty: all), kept current by watches."""

    def __init__(self, kube: Kube, *, namespaces: tuple[str, ...] = (), base: dict[str, Any] | None = None,
                 clock: Clock | None = None, on_error: Callable[[EdgeError], None] | None = None) -> None:
        self.kube = kube
        self.namespaces = tuple(namespaces)
        self.base = dict(base or {})
        self.clock = clock or kube.clock
        self.on_error = on_error or (lambda exc: None)
        self.objects: dict[Key, ModelObject] = {}
        self.synced = asyncio.Event()  # every watch has listed once
        self._listed: set[str | None] = set()

    def _list_call(self, namespace: str | None):
        custom = self.kube.custom
        if namespace is None:
            return custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL)
        return custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        parsed = understood(obj, self.base)
        if kind == "DELETED":
            self.objects.pop(parsed.key, None)
        else:
            self.objects[parsed.key] = parsed

    async def _relist(self, namespace: str | None) -> str:
        fn, args = self._list_call(namespace)
        listed = await self.kube.call(f"list {PLURAL}", fn, *args)
        fresh = {m.key: m for m in (understood(obj, self.base) for obj in listed.get("items", []))}
        stale = [k for k in self.objects if namespace is None or k[0] == namespace]
        for key in stale:
            if key not in fresh:
                self.objects.pop(key)
        self.objects.update(fresh)
        self._listed.add(namespace)
        if len(self._listed) == len(self.namespaces or (None,)):
            self.synced.set()
        return listed["metadata"]["resourceVersion"]

    async def _follow(self, namespace: str | None, resource_version: str) -> str:
        """Watch from `resource_version` until the server ends the watch; the last resourceVersion seen."""
        fn, args = self._list_call(namespace)
        async with kube_watch.Watch() as stream:
            async for event in stream.stream(fn, *args, resource_version=resource_version,
                                             allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S):
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(event["type"], event["raw_object"])
                resource_version = stream.resource_version or resource_version
        return resource_version

    async def _watch(self, namespace: str | None, stop: asyncio.Event, resource_version: str | None = None) -> None:
        """List (unless resuming from `resource_version`), then watch, until `stop`."""
        delay = FIRST_RETRY_S
        while not stop.is_set():
            try:
                if resource_version is None:
                    resource_version = await self._relist(namespace)
                resource_version = await self._follow(namespace, resource_version)
                delay = FIRST_RETRY_S
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:  # too old: list again, from now
                    resource_version = None
                    continue
                await self._failed(EdgeError(f"watch {PLURAL}: HTTP {exc.status} {exc.reason}",
                                             kind="watch_failed"), delay)
                delay = min(MAX_RETRY_S, delay * 2)
            except Exception as exc:  # noqa: BLE001 - a dropped connection, a list that failed: retried
                await self._failed(exc if isinstance(exc, EdgeError) else
                                   EdgeError(f"watch {PLURAL}: {exc!r}", kind="watch_failed"), delay)
                delay = min(MAX_RETRY_S, delay * 2)

    async def _failed(self, exc: EdgeError, delay_s: float) -> None:
        self.on_error(exc)
        log.warning("error", where="watch", kind=exc.kind, error=str(exc), retry_in_s=delay_s)
        await self.clock.sleep(delay_s)

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._watch(ns, stop)) for ns in (self.namespaces or (None,))]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
