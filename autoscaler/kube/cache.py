"""An informer-style cache of the cluster for the fleet (a `ClusterCache`): list once, then watch.

Watched, in every namespace: pods, nodes, Deployments, StatefulSets and the Events about pods: what the
per-model `ClusterReader` lists each tick (the target, its pods, the provisioners' Events, the nodes and
every live pod for the idle slots, the namespace's pods for its GPU cap, the placeholder warm pool's
Deployment, the nodes of node waits). Each kind is listed, then watched from the list's resourceVersion
(bookmarks keep it current); a watch ends after `watch_timeout_s` and resumes from where it was; a 410
(Gone: the version is too old) re-lists; any other failure reconnects after a backoff (doubling, at most
`BACKOFF_MAX_S`), serving what it held meanwhile, as client-go's informers do.

`cluster_source(key, settings)` is the per-model `ClusterReader`, built as the single-target loop builds it
(`readers.build_cluster_reader`), reading these items from memory through `CacheReads` (the
`reads.ClusterReads` seam): the same computation as the listing path, from the same kind of objects.
Until every kind has synced, reads raise a TransientError
(kind `cache_not_synced`): the tick holds. Writes stay per model, as do the reads the cache does not hold:
the Kueue LocalQueue and ClusterQueues (`capacity.kueue`) and a CapacityBuffer warm pool's status.
Watching every namespace needs list and watch on these kinds in a ClusterRole.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import structlog
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.config import Settings
from autoscaler.errors import PermanentError, TransientError
from autoscaler.kube.client import Kube, translate
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.pods import FINISHED_PHASES
from autoscaler.kube.readers import build_cluster_reader, build_warm_pool

log = structlog.get_logger("autoscaler")

WATCH_TIMEOUT_S = 300
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0

Key = tuple[str, str]


def object_key(obj: Any) -> Key:
    return (obj.metadata.namespace or "", obj.metadata.name)


@dataclass
class Informer:
    """One kind's items, listed then watched (see the module docstring)."""

    kube: Kube
    what: str
    list_fn: Callable
    kwargs: dict = field(default_factory=dict)
    watch_timeout_s: int = WATCH_TIMEOUT_S
    items: dict[Key, Any] = field(default_factory=dict)
    by_namespace: dict[str, dict[Key, Any]] = field(default_factory=dict)
    synced: bool = False
    resource_version: str | None = None
    relists: int = 0

    def _put(self, obj: Any) -> None:
        key = object_key(obj)
        self.items[key] = obj
        self.by_namespace.setdefault(key[0], {})[key] = obj

    def _drop(self, obj: Any) -> None:
        key = object_key(obj)
        self.items.pop(key, None)
        self.by_namespace.get(key[0], {}).pop(key, None)

    async def _list(self) -> None:
        listed = await self.kube.call(f"list {self.what}", self.list_fn, **self.kwargs)
        self.items, self.by_namespace = {}, {}
        for obj in listed.items:
            self._put(obj)
        self.resource_version = listed.metadata.resource_version
        self.synced = True

    async def _watch(self) -> None:
        stream = watch.Watch()
        try:
            async for event in stream.stream(self.list_fn, resource_version=self.resource_version,
                                             timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                                             **self.kwargs):
                if event["type"] == "DELETED":
                    self._drop(event["object"])
                elif event["type"] in ("ADDED", "MODIFIED"):
                    self._put(event["object"])
                self.resource_version = stream.resource_version or self.resource_version
        finally:
            await stream.close()

    async def run(self) -> None:
        """List and watch until cancelled."""
        delay_s = BACKOFF_FIRST_S
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
                delay_s = BACKOFF_FIRST_S
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:  # the version is gone: list again
                    self.resource_version = None
                    self.relists += 1
                    continue
                delay_s = await self._backoff(translate(exc, f"watch {self.what}"), delay_s)
            except Exception as exc:  # noqa: BLE001 - every failure of a watch is retried (logged, backed off)
                delay_s = await self._backoff(exc, delay_s)

    async def _backoff(self, exc: Exception, delay_s: float) -> float:
        log.warning("watch failed, reconnecting", what=self.what, error=str(exc), retry_in_s=delay_s)
        await asyncio.sleep(delay_s)
        return min(BACKOFF_MAX_S, delay_s * 2)


def _live(pod) -> bool:
    return ((pod.status.phase if pod.status else None) not in FINISHED_PHASES)


class CacheReads:
    """`reads.ClusterReads` from the informers' memory."""

    def __init__(self, informers: dict[str, Informer]) -> None:
        self.informers = informers

    def _synced(self, kind: str) -> Informer:
        informer = self.informers[kind]
        if not informer.synced:
            raise TransientError(f"the {kind} cache has not synced yet", kind="cache_not_synced")
        return informer

    async def workload(self, namespace: str, kind: str, name: str):
        found = self._synced("deployments" if kind == "Deployment" else "statefulsets").items.get((namespace, name))
        if found is None:
            raise PermanentError(f"read {kind} {namespace}/{name}: not found", kind="not_found")
        return found

    async def pods(self, namespace: str, match_labels: dict[str, str]) -> list:
        in_namespace = self._synced("pods").by_namespace.get(namespace, {}).values()
        wanted = match_labels.items()
        return [p for p in in_namespace if wanted <= (p.metadata.labels or {}).items()]

    async def live_pods(self, namespace: str | None) -> list:
        pods = self._synced("pods")
        found = pods.items if namespace is None else pods.by_namespace.get(namespace, {})
        return [p for p in found.values() if _live(p)]

    async def pod_events(self, namespace: str) -> list:
        return list(self._synced("events").by_namespace.get(namespace, {}).values())

    async def nodes(self) -> list:
        return list(self._synced("nodes").items.values())

    async def node(self, name: str):
        found = self._synced("nodes").items.get(("", name))
        if found is None:
            raise PermanentError(f"get node {name}: not found", kind="not_found")
        return found


class KubeCache:
    """The fleet's ClusterCache: `start` the watches, `cluster_source` per model, `stop`."""

    def __init__(self, kube: Kube, *, watch_timeout_s: int = WATCH_TIMEOUT_S) -> None:
        self.kube = kube
        core, apps = kube.core, kube.apps

        def informer(what: str, fn: Callable, **kwargs) -> Informer:
            return Informer(kube, what, fn, kwargs, watch_timeout_s=watch_timeout_s)

        self.informers = {
            "pods": informer("pods", core.list_pod_for_all_namespaces),
            "nodes": informer("nodes", core.list_node),
            "deployments": informer("deployments", apps.list_deployment_for_all_namespaces),
            "statefulsets": informer("statefulsets", apps.list_stateful_set_for_all_namespaces),
            "events": informer("pod events", core.list_event_for_all_namespaces,
                               field_selector="involvedObject.kind=Pod"),
        }
        self.reads = CacheReads(self.informers)
        self._tasks: list[asyncio.Task] = []
        self._sources: dict[Key, tuple[Settings, ClusterReader]] = {}

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers.values())

    async def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(i.run(), name=f"watch {i.what}") for i in self.informers.values()]

    async def wait_synced(self, timeout_s: float) -> bool:
        """Whether every kind synced within `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.synced and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return self.synced

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def cluster_source(self, key: Key, settings: Settings) -> ClusterReader:
        """The model's cluster reader on the cache; the same one (with what it learned) while its settings
        stay the same."""
        known = self._sources.get(key)
        if known is None or known[0] != settings:
            warm_pool = build_warm_pool(settings, self.kube, reads=self.reads)
            known = (settings, build_cluster_reader(settings, self.kube, warm_pool, reads=self.reads))
            self._sources[key] = known
        return known[1]

    def forget(self, key: Key) -> None:
        """Drop a model's reader (its object was deleted)."""
        self._sources.pop(key, None)
