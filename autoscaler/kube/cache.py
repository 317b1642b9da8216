"""An informer-style cache of the cluster for the fleet (a `ClusterCache`): list once, then watch.

Watched, in every namespace: pods, nodes, Deployments, StatefulSets, the Events about pods and, when their CRDs
are served as the cache starts, Kueue's LocalQueues and ClusterQueues: what the
per-model `ClusterReader` lists each tick (the target, its pods, the provisioners' Events, the nodes and
every live pod for the idle slots, the namespace's pods for its GPU cap, the placeholder warm pool's
Deployment, the nodes of node waits). Each kind is listed, then watched from the list's resourceVersion
(bookmarks keep it current); a watch ends after `watch_timeout_s` and resumes from where it was; a 410
(Gone: the version is too old) re-lists; any other failure reconnects after a backoff (doubling, at most
`BACKOFF_MAX_S`), serving what it held meanwhile, as client-go's informers do.

`cluster_source(key, settings)` is the per-model `ClusterReader`, built as the single-target loop builds it
(`readers.build_cluster_reader`), reading these items from memory through `CacheReads` (the
`reads.ClusterReads` seam): the same computation as the listing path, from the same kind of objects. With the
fleet's pooled warm pool (`use_pooled`), a model's warm pool is its view of it (the ready pooled placeholders
of its shape, `pooledwarm.SharedSlots`), read from the cached Deployments too (the pooled CapacityBuffers'
status from the API: `PooledWarmPool.cached_ready`, bounded by the free room the cached nodes and pods
leave, whether or not `capacity.read_nodes` counts idle slots: `readers.build_cluster_reader`).
Until every kind has synced, reads raise a TransientError
(kind `cache_not_synced`): the tick holds. Writes stay per model, as do the reads the cache does not hold:
the Kueue queues without their CRDs (or at another API version than the cache's), and a CapacityBuffer
warm pool's status.
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
from autoscaler.errors import EdgeError, PermanentError, TransientError
from autoscaler.kube.client import Kube, translate
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.pods import FINISHED_PHASES
from autoscaler.kube.pooledwarm import PooledView, PooledWarmPool, SharedSlots, ready_by_shape
from autoscaler.kube.readers import build_cluster_reader, build_warm_pool
from autoscaler.kube.reads import KUEUE_GROUP, KUEUE_PLURALS, ApiReads, ClusterReads
from autoscaler.kube.warmpool import WarmPool

log = structlog.get_logger("autoscaler")

WATCH_TIMEOUT_S = 300
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0

Key = tuple[str, str]


def _meta(obj: Any) -> tuple[str, str, dict]:
    """(namespace, name, labels) of a typed object (V1Pod...) or of a custom object (a dict)."""
    if isinstance(obj, dict):
        meta = obj.get("metadata") or {}
        return meta.get("namespace") or "", meta.get("name", ""), meta.get("labels") or {}
    return obj.metadata.namespace or "", obj.metadata.name, obj.metadata.labels or {}


def object_key(obj: Any) -> Key:
    return _meta(obj)[:2]


def _listed(listed: Any) -> tuple[list, str]:
    """The items and resourceVersion of a list answer, typed or a custom objects' dict."""
    if isinstance(listed, dict):
        return listed.get("items", []), listed["metadata"]["resourceVersion"]
    return listed.items, listed.metadata.resource_version


@dataclass
class Informer:
    """One kind's items, listed then watched (see the module docstring). `args`, `kwargs`: of `list_fn` (a
    namespace, a custom resource's group...); `parse`: what is kept of an object (default: the object, with an
    index by namespace and by label); `on_error`: told of every failure it backs off from."""

    kube: Kube
    what: str
    list_fn: Callable
    kwargs: dict = field(default_factory=dict)
    args: tuple = ()
    watch_timeout_s: int = WATCH_TIMEOUT_S
    parse: Callable[[Any], Any] | None = None
    on_error: Callable[[EdgeError], None] = lambda exc: None
    items: dict[Key, Any] = field(default_factory=dict)
    by_namespace: dict[str, dict[Key, Any]] = field(default_factory=dict)
    by_label: dict[tuple[str, str, str], dict[Key, Any]] = field(default_factory=dict)  # (namespace, key, value)
    listed: asyncio.Event = field(default_factory=asyncio.Event)  # set by the first list
    resource_version: str | None = None
    relists: int = 0
    changes: int = 0  # counts every change of `items`, so what is derived from them can be kept until the next

    @property
    def synced(self) -> bool:
        return self.listed.is_set()

    def _put(self, obj: Any) -> None:
        namespace, name, labels = _meta(obj)
        key = (namespace, name)
        self._drop(obj)  # its labels may have changed
        if self.parse is not None:  # parsed objects are looked up by key only
            self.items[key] = self.parse(obj)
            return
        self.items[key] = obj
        self.by_namespace.setdefault(namespace, {})[key] = obj
        for label in labels.items():
            self.by_label.setdefault((namespace, *label), {})[key] = obj

    def _drop(self, obj: Any) -> None:
        key = object_key(obj)
        self.changes += 1
        old = self.items.pop(key, None)
        self.by_namespace.get(key[0], {}).pop(key, None)
        if old is not None and self.parse is None:
            for label in _meta(old)[2].items():
                self.by_label.get((key[0], *label), {}).pop(key, None)

    async def _list(self) -> None:
        items, self.resource_version = _listed(
            await self.kube.call(f"list {self.what}", self.list_fn, *self.args, **self.kwargs))
        self.items, self.by_namespace, self.by_label = {}, {}, {}
        self.changes += 1
        for obj in items:
            self._put(obj)
        self.listed.set()

    async def _watch(self) -> None:
        stream = watch.Watch()
        try:
            async for event in stream.stream(self.list_fn, *self.args, resource_version=self.resource_version,
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
        """List (unless `resource_version` says where to resume) and watch until cancelled."""
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
                delay_s = await self._backoff(exc if isinstance(exc, EdgeError) else
                                              TransientError(f"watch {self.what}: {exc!r}", kind="watch_failed"),
                                              delay_s)

    async def _backoff(self, exc: EdgeError, delay_s: float) -> float:
        self.on_error(exc)
        log.warning("watch failed, reconnecting", what=self.what, kind=exc.kind, error=str(exc), retry_in_s=delay_s)
        await asyncio.sleep(delay_s)
        return min(BACKOFF_MAX_S, delay_s * 2)


def _live(pod) -> bool:
    return ((pod.status.phase if pod.status else None) not in FINISHED_PHASES)


class CacheReads:
    """`reads.ClusterReads` from the informers' memory; the Kueue objects from `fallback` (the API) when they
    have no informer (their CRDs were absent when the cache started, or another API version is asked)."""

    def __init__(self, informers: dict[str, Informer], *, fallback: ClusterReads, kueue_version: str) -> None:
        self.informers, self.fallback, self.kueue_version = informers, fallback, kueue_version
        self._live: tuple[int, list] | None = None  # (the pods' changes, every live pod)

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
        """In the apiserver's order (by name), as a list would give them: start-ups are reported in it."""
        pods = self._synced("pods")
        wanted = match_labels.items()
        first = next(iter(wanted), None)  # the pods carrying one of the labels, not the whole namespace
        candidates = (pods.by_label.get((namespace, *first), {}) if first is not None
                      else pods.by_namespace.get(namespace, {})).values()
        found = [p for p in candidates if wanted <= (p.metadata.labels or {}).items()]
        return sorted(found, key=lambda p: p.metadata.name)

    async def live_pods(self, namespace: str | None) -> list:
        """Of every namespace: the same list while the pods have not changed (so the nodes' usage, derived
        from it, is computed once for the fleet: `capacity.node_usage`)."""
        pods = self._synced("pods")
        if namespace is not None:
            return [p for p in pods.by_namespace.get(namespace, {}).values() if _live(p)]
        if self._live is None or self._live[0] != pods.changes:
            self._live = (pods.changes, [p for p in pods.items.values() if _live(p)])
        return self._live[1]

    async def pod_events(self, namespace: str) -> list:
        """By name, as a list gives them (the last of several provisioners' messages is the one reported)."""
        return sorted(self._synced("events").by_namespace.get(namespace, {}).values(), key=lambda e: e.metadata.name)

    async def nodes(self) -> list:
        return list(self._synced("nodes").items.values())

    def _kueue_informer(self, plural: str, version: str) -> Informer | None:
        return self.informers.get(plural) if version == self.kueue_version else None

    async def kueue(self, kind: str, name: str, namespace: str | None = None, *, version: str) -> dict:
        plural = KUEUE_PLURALS[kind]
        if self._kueue_informer(plural, version) is None:
            return await self.fallback.kueue(kind, name, namespace, version=version)
        found = self._synced(plural).items.get((namespace or "", name))
        if found is None:
            where = f"{namespace}/{name}" if namespace else name
            raise PermanentError(f"read {kind} {where}: not found", kind="not_found")
        return found

    async def cluster_queues(self, version: str) -> list[dict]:
        if self._kueue_informer("clusterqueues", version) is None:
            return await self.fallback.cluster_queues(version)
        return list(self._synced("clusterqueues").items.values())

    async def pooled_ready(self, namespace: str) -> dict[int, int]:
        """The fleet's pooled placeholders' ready replicas per shape (`pooledwarm.ready_by_shape`)."""
        return ready_by_shape(self._synced("deployments").by_namespace.get(namespace, {}).values())

    async def node(self, name: str):
        found = self._synced("nodes").items.get(("", name))
        if found is None:
            raise PermanentError(f"get node {name}: not found", kind="not_found")
        return found


class KubeCache:
    """The fleet's ClusterCache: `start` the watches, `cluster_source` per model, `stop`."""

    def __init__(self, kube: Kube, *, watch_timeout_s: int = WATCH_TIMEOUT_S, kueue_version: str = "v1beta1") -> None:
        self.kube, self.kueue_version = kube, kueue_version
        core, apps = kube.core, kube.apps

        def informer(what: str, fn: Callable, *args, **kwargs) -> Informer:
            return Informer(kube, what, fn, kwargs, args=args, watch_timeout_s=watch_timeout_s)

        self._informer = informer

        self.informers = {
            "pods": informer("pods", core.list_pod_for_all_namespaces),
            "nodes": informer("nodes", core.list_node),
            "deployments": informer("deployments", apps.list_deployment_for_all_namespaces),
            "statefulsets": informer("statefulsets", apps.list_stateful_set_for_all_namespaces),
            "events": informer("pod events", core.list_event_for_all_namespaces,
                               field_selector="involvedObject.kind=Pod"),
        }
        self.reads = CacheReads(self.informers, fallback=ApiReads(kube), kueue_version=kueue_version)
        self.pooled: PooledWarmPool | None = None
        self._tasks: list[asyncio.Task] = []
        self._sources: dict[Key, tuple[Settings, ClusterReader]] = {}

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers.values())

    async def _kueue_informers(self) -> dict[str, Informer]:
        """Informers of the Kueue LocalQueues and ClusterQueues when their CRDs are served (one list probes it);
        none otherwise: the budget then reads them per model, as without the cache."""
        list_fn = self.kube.custom.list_cluster_custom_object
        try:
            await self.kube.call("list ClusterQueues", list_fn, KUEUE_GROUP, self.kueue_version, "clusterqueues",
                                 limit=1)
        except EdgeError as exc:
            log.info("Kueue objects not watched", error=str(exc))
            return {}
        return {plural: self._informer(plural, list_fn, KUEUE_GROUP, self.kueue_version, plural)
                for plural in KUEUE_PLURALS.values()}

    async def start(self) -> None:
        if not self._tasks:
            self.informers.update(await self._kueue_informers())
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

    def use_pooled(self, pooled: PooledWarmPool | None) -> None:
        """The fleet's pooled warm pool (None: each model has its own): from now on each model's warm pool is
        its view of it, as `fleet.model.ModelBuilder` gives its controller."""
        self.pooled = pooled
        self._sources.clear()

    def _warm_pool(self, settings: Settings) -> WarmPool | None:
        """The model's own warm pool, or its view of the pooled one: the ready slots of its shape, its
        template and the slots read from the cache."""
        if self.pooled is None:
            return build_warm_pool(settings, self.kube, reads=self.reads)
        target, reads = settings.target, self.reads

        async def template():
            return (await reads.workload(target.namespace, target.kind, target.name)).spec.template

        return SharedSlots(PooledView(self.pooled.prefix, self.pooled.cached_ready(reads), self.pooled.room_kept),
                           template)

    def cluster_source(self, key: Key, settings: Settings) -> ClusterReader:
        """The model's cluster reader on the cache: the same one while its settings stay the same; a new one
        when they change, which keeps what the old one reported and learned if the target is the same."""
        known = self._sources.get(key)
        if known is None or known[0] != settings:
            warm_pool = self._warm_pool(settings)
            reader = build_cluster_reader(settings, self.kube, warm_pool, reads=self.reads, nodes_in_memory=True)
            if known is not None and known[0].target == settings.target:
                reader.carry_over(known[1])
            known = (settings, reader)
            self._sources[key] = known
        return known[1]

    def forget(self, key: Key) -> None:
        """Drop a model's reader (its object was deleted)."""
        self._sources.pop(key, None)
