"""Pooled warm capacity: warm slots kept per replica shape for the whole fleet, not per model.

One placeholder Deployment per shape, `fleet-warm-<N>gpu` (`fleet-warm-<N>x-<resource>` for a MIG profile or
another accelerator), all in one namespace (the controller's, or a configured one), each a `PlaceholderPool`
(warmpool.py): pause pods at a low PriorityClass requesting what one replica of that shape requests. A
replica of ANY model of that shape that finds no room preempts one (the scheduler does it: the placeholders
are below every model), the Deployment controller creates a new placeholder behind it at once, and that one
lands on free room or waits for a node (which the provisioner brings: the PriorityClass stays above the
cluster-autoscaler's expendable cutoff). So a slot is nobody's until taken, whichever model scales first
takes it, and the pool is refilled behind it. This is what makes pooling save: the fleet insures the growth
risk of the sum of its models (`policies.fleet`, `FleetDecision.warm_by_shape`), not each model's alone.

The fleet controller calls `ensure(slots_by_shape, templates)` once per tick: the pooled sizes keyed by GPUs
per replica (the decision's key) and the pod templates of the models it serves by model name, grouped here by
the same key.
The placeholder of a shape requests, per resource, the most any of its models' replicas request (so
preempting one frees room for whichever of them comes), and carries their scheduling constraints (node
selector, tolerations, affinity) and GPU resource, which must be the same for all of them: models of one GPU
count that must land on different nodes (or on different MIG profiles) cannot share a placeholder. Such a
shape is refused with an error naming the models' differences and held as it is, after the other shapes are
applied; so is a shape that has slots but no template. Every other pool of ours whose name was not applied
this tick is scaled to 0, not deleted, from its own template: a shape no model has any more, and the old pool
of a shape whose models changed GPU resource (`nvidia.com/gpu` to a MIG profile: the same GPU count, another
name).

`ready()`: the ready placeholders per shape, read at most once per `ready_ttl_s` for the whole fleet: the
models decide concurrently, so a read in flight is one task every caller awaits (single-flight), not a list
per model. A read that fails (5xx, 403, no answer within `read_timeout_s`: the client sets no timeout, and a
hung list would hold every later tick's models on it) serves the last good read while it is at most
`stale_max_s` old, then no slot (logged): never a failed capacity read for every model of the tick.
`share(namespace=, kind=, name=)`: the pool as the `WarmPool` of one model, for its
own cluster reader. Its ready slots are those of the model's shape, which any model of that shape may take.
Its `ensure` does nothing, since the fleet sizes the pool.

`PooledCapacityBuffer` (`warm_pool.backend: capacity-buffer`) is the same pool with the provisioner keeping the
room instead of placeholder pods: per shape, a core/v1 PodTemplate `fleet-warm-<N>gpu` whose pod is the shape's
placeholder pod (the same merge, the same refusal) and a CapacityBuffer of the same name pointing at it
(`podTemplateRef`; a buffer's `scalableRef` names one workload, so it cannot pool), `replicas` = the shape's
pooled slots. The provisioner (Karpenter behind its CapacityBuffer feature gate, the cluster-autoscaler) keeps
room for that many virtual replicas of the shape; a replica of any model of that shape lands on that room (no
preemption: nothing is there), and the provisioner brings room for the buffer again behind it. Both objects
carry our managed-by label; one of that name that is not ours is refused. The PodTemplate is rewritten only
when a field it owns (`owned_pod`: labels, containers' image and resources, scheduling fields) differs from the
merged pod, whether the models changed or someone else edited it (the merged pod's hash is in `TEMPLATE_HASH`,
for people); a shape gone gets `replicas: 0`. `ready()` per shape is `warmpool.buffer_ready` of its buffer,
read from the API (the watch cache holds no buffers); each model's reader bounds it by the free room for its
own template on Ready nodes (cluster.py `warm_and_idle`: the buffer's pod requests at least what the model's
does, so that room is where a replica of the model lands without a new node).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Awaitable, Callable, Mapping

import structlog
from kubernetes_asyncio.client import V1Container, V1ResourceRequirements

from autoscaler.errors import EdgeError, PermanentError, TransientError
from autoscaler.kube.capacity import replica_shape
from autoscaler.kube.client import Kube
from autoscaler.kube.quantity import effective_resources, format_quantity, parse_quantity
from autoscaler.kube.warmpool import (BUFFER_GROUP, BUFFER_PLURAL, BUFFER_VERSION, MANAGED_BY, MANAGED_KEY,
                                      CapacityBufferPool, PlaceholderPool, buffer_ready, no_buffer_api, owned,
                                      placeholder_spec, write_ours)

log = structlog.get_logger("autoscaler")

# How long a failed read of the pool serves the last good one: a few ticks of a blip, not a lasting outage
# (then no slot, the safe side: the lead time includes node provisioning again).
STALE_MAX_S = 5.0
# A shared read that has not answered in this long fails like an API error: the client sets no timeout of its
# own, and every model of every later tick awaits the one read in flight.
READ_TIMEOUT_S = 3.0

SHAPE_LABEL = "inference-autoscaler/fleet-warm-shape"  # value: GPUs per replica of the pool
# Our pool objects: the shape label AND our managed-by label (another's object with our shape label is not ours).
OURS_SELECTOR = f"{SHAPE_LABEL},{MANAGED_KEY}={MANAGED_BY[MANAGED_KEY]}"
TEMPLATE_HASH = "inference-autoscaler/template-hash"  # on a pooled buffer's PodTemplate: the pod it was written with
WHOLE_GPU = "nvidia.com/gpu"


def pool_name(prefix: str, gpus: int, resource: str) -> str:
    """`fleet-warm-4gpu`; for another resource `fleet-warm-1x-mig-1g.10gb` (a valid label value: the pods
    carry it)."""
    if resource == WHOLE_GPU:
        return f"{prefix}-{gpus}gpu"
    slug = re.sub(r"[^a-z0-9.-]+", "-", resource.rsplit("/", 1)[-1].lower()).strip("-.")
    return f"{prefix}-{gpus}x-{slug}"[:63].rstrip("-.")


def _constraints(template, serialize) -> dict:
    spec = template.spec
    return {"gpu resource": replica_shape(template).gpu_resource, "node selector": serialize(spec.node_selector),
            "tolerations": serialize(spec.tolerations), "affinity": serialize(spec.affinity)}


def merged_template(templates: Mapping[str, Any], serialize=lambda obj: obj):
    """One placeholder's template for the replicas of several models (model name -> pod template): per
    resource the largest request, and the scheduling constraints they all share. A ValueError names the
    models and what differs when they do not share them."""
    (first_name, first), *others = templates.items()
    ours = _constraints(first, serialize)
    for name, other in others:
        theirs = _constraints(other, serialize)
        differ = [k for k in ours if ours[k] != theirs[k]]
        if differ:
            raise ValueError(f"{first_name} and {name} differ in {', '.join(differ)}: one placeholder cannot "
                             "fit both")
    largest: dict[str, Decimal] = {}
    for template in templates.values():
        for key, value in effective_resources(template.spec)[0].items():
            largest[key] = max(largest.get(key, Decimal(0)), value)
    merged = copy.deepcopy(first)
    merged.spec.containers = [V1Container(name="replica", resources=V1ResourceRequirements(
        requests={k: format_quantity(v) for k, v in sorted(largest.items())}))]
    merged.spec.init_containers, merged.spec.overhead = None, None
    return merged


def group_by_shape(templates: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The models' pod templates by GPUs per replica (replicas without a GPU need no GPU warm slot)."""
    groups: dict[int, dict[str, Any]] = {}
    for model, template in templates.items():
        gpus = replica_shape(template).gpus
        if gpus > 0:
            groups.setdefault(int(gpus), {})[model] = template
    return groups


def shape_of(labels: Mapping[str, str] | None, *, name: str = "") -> int | None:
    """The GPUs per replica of one of our pool objects, from its labels (None: not one of ours, or a shape label
    that is not a whole number, which is logged with the object's `name` and skipped, never raised: one bad
    object must not stop the fleet's tick)."""
    labels = labels or {}
    shape = labels.get(SHAPE_LABEL)
    if shape is None or not owned({"labels": labels}):
        return None
    if not shape.isdigit():
        _bad_shape(name, shape)
        return None
    return int(shape)


@functools.lru_cache(maxsize=256)
def _bad_shape(name: str, shape: str) -> None:
    """Logged once per object and label value, not at every read of the pool (each second)."""
    log.warning("error", where="pooled warm pool", kind="bad_shape_label", object=name,
                error=f"label {SHAPE_LABEL}={shape!r} is not a number of GPUs; object skipped")


def slots_by_shape(pools) -> dict[int, int]:
    """Ready slots per shape (GPUs per replica) of `pools`, each (name, labels, ready slots); objects that are
    not our pools (`shape_of`) are left out."""
    out: dict[int, int] = {}
    for name, labels, ready in pools:
        gpus = shape_of(labels, name=name)
        if gpus is not None:
            out[gpus] = out.get(gpus, 0) + ready
    return out


def ready_by_shape(deployments) -> dict[int, int]:
    """Ready placeholders per shape (GPUs per replica) of the pool Deployments among `deployments`."""
    return slots_by_shape((d.metadata.name, d.metadata.labels, (d.status.ready_replicas or 0) if d.status else 0)
                          for d in deployments)


OWNED_POD_FIELDS = ("priorityClassName", "terminationGracePeriodSeconds", "nodeSelector", "tolerations", "affinity")
OWNED_CONTAINER_FIELDS = ("name", "image", "resources")


def owned_pod(template: Mapping[str, Any]) -> dict:
    """The fields of a pod template (a dict) that a pooled buffer's PodTemplate owns: its labels, its containers'
    name, image and resources, and the pod's scheduling fields. The apiserver's defaults (dnsPolicy, the
    containers' imagePullPolicy...) are left out, so they never count as a change."""
    spec = template.get("spec") or {}
    return {"labels": (template.get("metadata") or {}).get("labels"),
            "containers": [{k: _quantities(c.get(k)) if k == "resources" else c.get(k) for k in OWNED_CONTAINER_FIELDS}
                           for c in spec.get("containers") or []],
            **{k: spec.get(k) for k in OWNED_POD_FIELDS}}


def _quantities(resources: Any) -> Any:
    """A container's resources with every quantity as its value: the apiserver keeps the form it was given
    in its canonical spelling (we write 1 GB as "1000000000", it answers "1G"), which is no change."""
    if not isinstance(resources, Mapping):
        return resources
    return {part: {k: _value(v) for k, v in amounts.items()} if isinstance(amounts, Mapping) else amounts
            for part, amounts in resources.items()}


def _value(quantity: Any) -> Any:
    try:
        return parse_quantity(quantity)
    except ValueError:
        return quantity  # not a quantity (someone's edit): compared as written, so it is put back


class PooledWarmPool:
    """The fleet's warm placeholders, one `PlaceholderPool` per replica shape (see the module docstring).
    Subclasses keep the shapes in other objects: `_ours`, `_apply`, `_described`, `_zero` and `_read_ready`."""

    room_kept = False  # as `warmpool.WarmPool.room_kept`: placeholder pods hold their room

    def __init__(self, kube: Kube, *, namespace: str, priority_class: str, pause_image: str, max_slots: int,
                 prefix: str = "fleet-warm", ready_ttl_s: float = 1.0, stale_max_s: float = STALE_MAX_S,
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.kube, self.namespace, self.prefix = kube, namespace, prefix
        self.priority_class, self.pause_image, self.max_slots = priority_class, pause_image, max_slots
        self.ready_ttl_s, self.stale_max_s, self.read_timeout_s = ready_ttl_s, stale_max_s, read_timeout_s
        self._ready: tuple[float, dict[int, int]] | None = None  # (read at, slots): served for `ready_ttl_s`
        self._good: tuple[float, dict[int, int]] | None = None  # the last read that did not fail
        self._reading: asyncio.Task | None = None  # the read in flight, which concurrent callers share
        self._failing: str | None = None  # what failed reads serve now ("last", "none"), logged when it changes

    def _pool(self, name: str, gpus: int) -> PlaceholderPool:
        return PlaceholderPool(self.kube, namespace=self.namespace, name=name, priority_class=self.priority_class,
                               pause_image=self.pause_image, max_slots=self.max_slots,
                               labels={SHAPE_LABEL: str(gpus)})

    async def _ours(self) -> list:
        listed = await self.kube.call(f"list pooled warm pools {self.namespace}",
                                      self.kube.apps.list_namespaced_deployment, self.namespace,
                                      label_selector=OURS_SELECTOR)
        return listed.items

    def _name(self, gpus: int, template: Any) -> str:
        return pool_name(self.prefix, gpus, replica_shape(template).gpu_resource)

    async def _apply(self, *, name: str, gpus: int, template: Any, slots: int) -> None:
        """Write one shape's pool: `template` is the shape's merged pod template."""
        await self._pool(name, gpus).ensure(template, slots)

    @staticmethod
    def _described(obj: Any) -> tuple[str, Mapping[str, str] | None, int]:
        """The name, labels and replicas of one of the objects `_ours` lists."""
        return obj.metadata.name, obj.metadata.labels, obj.spec.replicas or 0

    async def _zero(self, obj: Any, *, name: str, gpus: int) -> None:
        await self._pool(name, gpus).ensure(obj.spec.template, 0)

    async def _empty_gone(self, *, keep: set[str], held_gpus: set[int]) -> None:
        """Scale to 0 our pools whose name is not in `keep` (the pools applied or held this tick), except those
        of the shapes in `held_gpus`: a pool left behind by a shape whose models changed resource (whole GPUs to
        a MIG profile: another name, the same GPU count) goes to 0 too."""
        for obj in await self._ours():
            name, labels, replicas = self._described(obj)
            gpus = shape_of(labels, name=name)
            if gpus is not None and name not in keep and gpus not in held_gpus and replicas > 0:
                await self._zero(obj, name=name, gpus=gpus)

    async def _read_ready(self) -> dict[int, int]:
        return ready_by_shape(await self._ours())

    async def ensure(self, slots_by_shape: Mapping[int, int], templates: Mapping[str, Any]) -> None:
        """Size every shape's pool from the pooled sizes (GPUs per replica -> slots) and the models' pod
        templates (model name -> V1PodTemplateSpec); shapes no model has any more go to 0. Raises one
        PermanentError naming every shape it had to hold, after applying the others."""
        groups = group_by_shape(templates)
        problems: list[str] = []
        keep: set[str] = set()  # the pools applied or held this tick, by name
        held_gpus: set[int] = set()  # shapes held whose pool's name is not known (no template)
        for gpus in sorted(set(groups) | {g for g, n in slots_by_shape.items() if n > 0}):
            if gpus not in groups:
                problems.append(f"{gpus}-GPU replicas: {slots_by_shape[gpus]} warm slots decided but no model's "
                                "pod template of that shape was read; held as it is")
                held_gpus.add(gpus)
                continue
            try:
                template = merged_template(groups[gpus], self.kube.api.sanitize_for_serialization)
            except ValueError as exc:
                problems.append(f"{gpus}-GPU replicas: {exc}; held as it is")
                keep |= {self._name(gpus, t) for t in groups[gpus].values()}
                continue
            name = self._name(gpus, template)
            keep.add(name)
            await self._apply(name=name, gpus=gpus, template=template, slots=slots_by_shape.get(gpus, 0))
        await self._empty_gone(keep=keep, held_gpus=held_gpus)
        if problems:
            raise PermanentError("pooled warm pool: " + "; ".join(problems), kind="pooled_warm_shape")

    async def ready(self) -> dict[int, int]:
        """Ready slots per shape (GPUs per replica), read at most once per `ready_ttl_s` and once at a time
        (see the module docstring)."""
        now = self.kube.clock.now()
        if self._ready is not None and now - self._ready[0] < self.ready_ttl_s:
            return dict(self._ready[1])
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_shared(now))
        # shielded: a caller cancelled (its tick's deadline) must not cancel the read the others await
        return dict(await asyncio.shield(self._reading))

    async def _read_shared(self, now: float) -> dict[int, int]:
        try:
            try:
                out = await self._read_in_time()
                self._good = (now, out)
                if self._failing is not None:
                    log.info("pooled warm slots read again", slots=out)
                    self._failing = None
            except EdgeError as exc:
                out = self._stale(now, exc)
            self._ready = (now, out)  # a failure too is kept for `ready_ttl_s`: not a list per model
            return out
        finally:
            self._reading = None

    async def _read_in_time(self) -> dict[int, int]:
        """`_read_ready`, failing like an API error when it has not answered in `read_timeout_s`."""
        try:
            return await asyncio.wait_for(self._read_ready(), self.read_timeout_s)
        except TimeoutError:
            raise TransientError(f"pooled warm slots: no answer in {self.read_timeout_s:g} s", kind="timeout") from None

    def _stale(self, now: float, exc: EdgeError) -> dict[int, int]:
        """What a failed read serves: the last good read while it is at most `stale_max_s` old, else none
        (logged when that changes, not at every failed read of an outage)."""
        if self._good is not None and now - self._good[0] <= self.stale_max_s:
            if self._failing != "last":
                log.warning("pooled warm slots not read: the last read's are served", error=str(exc),
                            kind=exc.kind, age_s=round(now - self._good[0], 1), slots=self._good[1],
                            stale_max_s=self.stale_max_s)
                self._failing = "last"
            return self._good[1]
        if self._failing != "none":
            log.warning("pooled warm slots not read: none counted until a read succeeds", error=str(exc),
                        kind=exc.kind, stale_max_s=self.stale_max_s)
            self._failing = "none"
        return {}

    def cached_ready(self, reads: Any) -> Callable[[], Awaitable[dict[int, int]]]:
        """How a model's view reads the ready slots per shape with the fleet's watch cache (`reads`: its
        `CacheReads`): the placeholder Deployments from memory."""
        return lambda: reads.pooled_ready(self.namespace)

    def share(self, *, namespace: str, kind: str, name: str) -> "SharedSlots":
        """The pool as the `WarmPool` of the model whose workload this is (its shape read from its template)."""
        kube = self.kube
        read = kube.apps.read_namespaced_deployment if kind == "Deployment" else kube.apps.read_namespaced_stateful_set

        async def template():
            return (await kube.call(f"read {kind} {namespace}/{name}", read, name, namespace)).spec.template

        return SharedSlots(self, template)


class PooledCapacityBuffer(PooledWarmPool):
    """The fleet's warm capacity as one PodTemplate and one CapacityBuffer per replica shape (see the module
    docstring): the same grouping, merge and refusals as the placeholders, kept by the provisioner."""

    room_kept = True  # the provisioner keeps free room for the buffers: no pod of ours holds it

    def _buffer(self, name: str, gpus: int) -> CapacityBufferPool:
        return CapacityBufferPool(self.kube, namespace=self.namespace, name=name, max_slots=self.max_slots,
                                  pod_template=name, labels={SHAPE_LABEL: str(gpus)})

    async def _ours(self) -> list:
        try:
            listed = await self.kube.call(f"list pooled CapacityBuffers {self.namespace}",
                                          self.kube.custom.list_namespaced_custom_object, BUFFER_GROUP,
                                          BUFFER_VERSION, self.namespace, BUFFER_PLURAL, label_selector=OURS_SELECTOR)
        except PermanentError as exc:
            if exc.kind == "not_found":
                raise no_buffer_api() from None
            raise
        return listed.get("items") or []

    async def _apply(self, *, name: str, gpus: int, template: Any, slots: int) -> None:
        """The PodTemplate first, so that the buffer never points at a template that is not there."""
        await self._write_pod_template(name=name, gpus=gpus, template=template)
        await self._buffer(name, gpus).ensure(None, slots)

    async def _write_pod_template(self, *, name: str, gpus: int, template: Any) -> None:
        pod = placeholder_spec(template, name=name, priority_class=self.priority_class, pause_image=self.pause_image,
                               serialize=self.kube.api.sanitize_for_serialization)["spec"]["template"]
        digest = hashlib.sha256(json.dumps(pod, sort_keys=True).encode()).hexdigest()[:16]
        body = {"apiVersion": "v1", "kind": "PodTemplate", "template": pod,
                "metadata": {"name": name, "namespace": self.namespace, "annotations": {TEMPLATE_HASH: digest},
                             "labels": {SHAPE_LABEL: str(gpus), **MANAGED_BY}}}
        core, ns = self.kube.core, self.namespace

        def unchanged(current: dict) -> bool:  # someone else's edit of a field we own is put back
            return (current["metadata"].get("labels") == body["metadata"]["labels"]
                    and owned_pod(current.get("template") or {}) == owned_pod(pod))

        await write_ours(self.kube, what=f"PodTemplate {ns}/{name}", body=body,
                         read=lambda: core.read_namespaced_pod_template(name, ns),
                         create=lambda b: core.create_namespaced_pod_template(ns, b),
                         replace=lambda b: core.replace_namespaced_pod_template(name, ns, b), same=unchanged)

    @staticmethod
    def _described(obj: Any) -> tuple[str, Mapping[str, str] | None, int]:
        return obj["metadata"]["name"], obj["metadata"].get("labels"), (obj.get("spec") or {}).get("replicas", 0)

    async def _zero(self, obj: Any, *, name: str, gpus: int) -> None:
        await self._buffer(name, gpus).ensure(None, 0)

    async def _read_ready(self) -> dict[int, int]:
        """Every buffer's slots on existing capacity; none while the API is not served (as a missing buffer)."""
        try:
            buffers = await self._ours()
        except PermanentError as exc:
            if exc.kind != "no_capacity_buffer_api":
                raise
            return {}
        return slots_by_shape((b["metadata"]["name"], b["metadata"].get("labels"), buffer_ready(b)) for b in buffers)

    def cached_ready(self, reads: Any) -> Callable[[], Awaitable[dict[int, int]]]:
        """The watch cache holds no buffers: their status from the API, shared by every model of a tick."""
        return self.ready


@dataclass(frozen=True)
class PooledView:
    """What `SharedSlots` needs of the pooled pool: its name prefix and its ready slots per shape (the fleet's
    watch cache serves them from memory: autoscaler/kube/cache.py), and whether they are free room kept on the
    nodes (`warmpool.WarmPool.room_kept`)."""

    prefix: str
    ready: Callable[[], Awaitable[dict[int, int]]]
    room_kept: bool = False


class SharedSlots:
    """The pooled pool seen by one model as its `WarmPool`: the fleet sizes it (`ensure` does nothing), the
    model reads the ready slots of its own shape, which it may take (as may any model of that shape)."""

    def __init__(self, pooled: PooledWarmPool | PooledView, template: Callable[[], Awaitable[Any]]) -> None:
        self.pooled, self.template = pooled, template
        self.name = pooled.prefix  # no placeholder is the model's own: none carries this name
        self.room_kept = pooled.room_kept

    async def ensure(self, template: Any, slots: int) -> None:
        """Nothing: the fleet decides the pooled size (`PooledWarmPool.ensure`), not one model."""

    async def ready(self) -> int:
        gpus = replica_shape(await self.template()).gpus
        return (await self.pooled.ready()).get(int(gpus), 0) if gpus > 0 else 0
