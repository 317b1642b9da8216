"""The warm pool, in two backends chosen by `warm_pool.backend`:

- `placeholders` (works with any node provisioner): a Deployment of pause-container placeholder pods shaped
  like one model replica, at a low priority, so the scheduler preempts one for a real replica and the
  provisioner replaces the node it held. Ready slots: the Deployment's ready replicas.
- `capacity-buffer`: a SIG Autoscaling `CapacityBuffer` (autoscaling.x-k8s.io/v1beta1) with `scalableRef` to
  the model's workload and `replicas` = warm slots: the provisioner (Karpenter behind its CapacityBuffer
  feature gate, the cluster-autoscaler) keeps room for that many replicas itself, with no pods to preempt.
  Ready slots: all of them when its Provisioning condition says they fit existing capacity, else those
  that did not need new capacity (from the condition's "N/M virtual pods required new capacity"). Karpenter
  counts nodes still starting (launched NodeClaims) as existing capacity, so for the node start-up time
  after the buffer grows this is ahead of the nodes themselves, and it sees a replica that took the room only
  at its next look at the buffer (up to ~30 s). Where the nodes are read (`capacity.read_nodes`, the fleet's
  watch cache), the cluster reader bounds it by the free room on Ready nodes (cluster.py `warm_and_idle`).

Placeholders in detail:
Each placeholder requests what one replica's pod requests, all of it (GPUs, CPU, memory, as the scheduler
counts a pod: `quantity.effective_resources`), and copies the scheduling constraints (node selector,
affinity, tolerations), so a node provisioned for a placeholder fits the replica, and preempting one frees
exactly one replica's worth of usable capacity. Its PriorityClass is negative but not below the cluster-autoscaler's
expendable cutoff (-10), so a preempted placeholder still triggers a new node.

Both backends are a `WarmPool`: the loop calls `ensure` with the decided slots, the cluster reader `ready` and
`name` (the pool's object, and the `WARM_POOL_LABEL` value of placeholder pods, whose GPUs the target holds)."""

from __future__ import annotations

import re
from typing import Any, Awaitable, Callable, Mapping, Protocol

from autoscaler.errors import PermanentError
from autoscaler.kube.client import Kube, with_backoff
from autoscaler.kube.quantity import effective_resources, format_quantity
from autoscaler.kube.reads import ApiReads, ClusterReads

MANAGED_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY = {MANAGED_KEY: "inference-autoscaler"}
WARM_POOL_LABEL = "inference-autoscaler/warm-pool"  # value: the pool's name
NATIVE = ("cpu", "memory", "ephemeral-storage", "hugepages-")


class WarmPool(Protocol):
    """A warm pool backend."""

    # Whether its ready slots are free room the provisioner keeps on the nodes (a CapacityBuffer) rather than
    # pods that hold it (placeholders): the nodes' free room then includes them (cluster.py).
    room_kept: bool

    @property
    def name(self) -> str:
        """The pool's object in the target's namespace; placeholder pods carry it in `WARM_POOL_LABEL`."""
        ...

    async def ensure(self, template: Any, slots: int) -> None:
        """Create or update the pool for the target's pod template with `slots` slots (at most its maximum)."""
        ...

    async def ready(self) -> int:
        """The slots ready to take a replica now (0 when the pool does not exist)."""
        ...


def owned(metadata: Mapping[str, Any]) -> bool:
    """Whether an object's metadata (a dict) carries our `MANAGED_BY` label."""
    return (metadata.get("labels") or {}).get(MANAGED_KEY) == MANAGED_BY[MANAGED_KEY]


async def write_ours(kube: Kube, *, what: str, body: dict, read: Callable[[], Awaitable[Any]],
                     create: Callable[[dict], Awaitable[Any]], replace: Callable[[dict], Awaitable[Any]],
                     same: Callable[[dict], bool] = lambda current: False) -> None:
    """Create `body`, or replace the object of its name with it unless `same(current)` (the object read, as a
    dict). One not ours (no `MANAGED_BY` label) is refused, never taken over. `what`: "Kind namespace/name";
    `read`, `create`, `replace`: the API calls. Transient errors are retried (`with_backoff`).

    A 404 from the create means no namespace to create it in (kind `no_namespace`; for a custom resource it
    may also mean that its API is not served: the caller checks). One from the replace means the object was
    deleted since the read: it is created again."""

    async def create_it() -> None:
        try:
            await kube.call(f"create {what}", create, body)
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            namespace = body["metadata"].get("namespace")
            raise PermanentError(f"create {what}: HTTP 404, the namespace {namespace} does not exist",
                                 kind="no_namespace") from exc

    async def attempt() -> None:
        try:
            current = await kube.call(f"read {what}", read)
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            await create_it()
            return
        if not isinstance(current, dict):
            current = kube.api.sanitize_for_serialization(current)
        if not owned(current["metadata"]):
            raise PermanentError(f"{what} exists and is not ours; refusing to take it over", kind="not_owned")
        if same(current):
            return
        metadata = {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
        try:
            await kube.call(f"update {what}", replace, {**body, "metadata": metadata})
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            await create_it()  # deleted since the read (if made again meanwhile: a 409, retried from the read)

    await with_backoff(attempt, clock=kube.clock)


def placeholder_spec(template, *, name: str, priority_class: str, pause_image: str,
                     serialize=lambda obj: obj, labels: Mapping[str, str] | None = None) -> dict:
    """The placeholder Deployment for a target pod template (a V1PodTemplateSpec); `labels`: more labels for
    the Deployment and its pods (the selector is `WARM_POOL_LABEL` alone)."""
    spec = template.spec
    requests, _ = effective_resources(spec)
    # The scheduler places by requests; extended resources (GPUs, MIG slices) must also be limited to the
    # same amount. CPU and memory get no limit: the pause container uses neither.
    limits = {k: v for k, v in requests.items() if not k.startswith(NATIVE)}
    labels = {**(labels or {}), WARM_POOL_LABEL: name, **MANAGED_BY}
    pod_spec: dict = {
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "placeholder",
            "image": pause_image,
            "resources": {"requests": {k: format_quantity(v) for k, v in sorted(requests.items())},
                          "limits": {k: format_quantity(v) for k, v in sorted(limits.items())}},
        }],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [
            {k: v for k, v in {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect,
                               "tolerationSeconds": t.toleration_seconds}.items() if v is not None}
            for t in spec.tolerations
        ]
    if spec.affinity:
        pod_spec["affinity"] = serialize(spec.affinity)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {WARM_POOL_LABEL: name}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


class PlaceholderPool:
    room_kept = False  # the placeholder pods hold their room: it is no node's free room

    def __init__(self, kube: Kube, *, namespace: str, name: str, priority_class: str,
                 pause_image: str, max_slots: int, reads: ClusterReads | None = None,
                 labels: Mapping[str, str] | None = None) -> None:
        """`reads`: where `ready` reads the pool's Deployment (default: the API); `labels`: more labels for the
        Deployment and its pods."""
        self.kube = kube
        self.reads = reads or ApiReads(kube)
        self.namespace, self.name = namespace, name
        self.priority_class, self.pause_image, self.max_slots = priority_class, pause_image, max_slots
        self.labels = dict(labels or {})

    async def ensure(self, template, slots: int) -> None:
        """Create or update the placeholder Deployment with `slots` replicas (clamped to max_slots)."""
        body = placeholder_spec(template, name=self.name, priority_class=self.priority_class,
                                pause_image=self.pause_image, serialize=self.kube.api.sanitize_for_serialization,
                                labels=self.labels)
        body["metadata"]["namespace"] = self.namespace
        body["spec"]["replicas"] = max(0, min(self.max_slots, slots))
        apps, ns, name = self.kube.apps, self.namespace, self.name
        await write_ours(self.kube, what=f"Deployment {ns}/{name}", body=body,
                         read=lambda: apps.read_namespaced_deployment(name, ns),
                         create=lambda b: apps.create_namespaced_deployment(ns, b),
                         replace=lambda b: apps.replace_namespaced_deployment(name, ns, b))

    async def ready(self) -> int:
        try:
            pool = await self.reads.workload(self.namespace, "Deployment", self.name)
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            return 0
        return (pool.status.ready_replicas or 0) if pool.status else 0


BUFFER_GROUP, BUFFER_VERSION, BUFFER_PLURAL = "autoscaling.x-k8s.io", "v1beta1", "capacitybuffers"
ACTIVE_CAPACITY = "buffer.x-k8s.io/active-capacity"
_NEEDS_NEW = re.compile(r"(\d+)/(\d+) virtual pods required new capacity, (\d+) failed")


def buffer_ready(buffer: dict) -> int:
    """Slots of a CapacityBuffer that sit on existing capacity, from its status (0 when it does not say)."""
    status = buffer.get("status") or {}
    replicas = int(status.get("replicas") or 0)
    for condition in status.get("conditions") or []:
        if condition.get("type") != "Provisioning":
            continue
        if condition.get("status") == "True":
            return replicas
        match = _NEEDS_NEW.search(condition.get("message") or "")
        if match:
            new, desired, failed = (int(g) for g in match.groups())
            return max(0, desired - new - failed)
    return 0


async def buffer_api_served(kube: Kube) -> bool:
    """Whether the apiserver serves CapacityBuffers (a discovery GET of their group version)."""
    try:
        found = await kube.call(f"discover {BUFFER_GROUP}/{BUFFER_VERSION}", kube.custom.get_api_resources,
                                BUFFER_GROUP, BUFFER_VERSION)
    except PermanentError as exc:
        if exc.kind != "not_found":
            raise
        return False
    return any(resource.name == BUFFER_PLURAL for resource in found.resources or [])


def no_buffer_api() -> PermanentError:
    return PermanentError("the CapacityBuffer API (autoscaling.x-k8s.io/v1beta1) is not served here: install its "
                          "CRD or set warm_pool.backend: placeholders", kind="no_capacity_buffer_api")


class CapacityBufferPool:
    """The warm pool as a CapacityBuffer named like the placeholder Deployment would be. Its chunk is one
    replica of the target (`target_kind` and `target`: `scalableRef`), or, with `pod_template`, the PodTemplate
    of that name in the same namespace (`podTemplateRef`: the fleet's pooled buffers, pooledwarm.py); exactly
    one of the two (a ValueError otherwise). `labels`: more labels for it."""

    room_kept = True  # no pod holds the buffer's room: it is free room on the nodes

    def __init__(self, kube: Kube, *, namespace: str, name: str, max_slots: int, target_kind: str = "",
                 target: str = "", pod_template: str | None = None, labels: Mapping[str, str] | None = None) -> None:
        # neither would write `scalableRef: {kind: "", name: ""}` without a word
        whole_target, any_target = bool(target_kind and target), bool(target_kind or target)
        if (pod_template is None and not whole_target) or (pod_template is not None and any_target):
            raise ValueError(f"CapacityBuffer {namespace}/{name}: needs either a target (target_kind and target) "
                             f"or a pod_template, not both nor neither (target_kind={target_kind!r}, "
                             f"target={target!r}, pod_template={pod_template!r})")
        self.kube = kube
        self.namespace, self.name, self.target_kind, self.target = namespace, name, target_kind, target
        self.max_slots, self.labels = max_slots, {**(labels or {}), **MANAGED_BY}
        self.ref = ({"podTemplateRef": {"name": pod_template}} if pod_template is not None
                    else {"scalableRef": {"apiGroup": "apps", "kind": target_kind, "name": target}})

    def _call(self, what: str, method: str, *args):
        fn = getattr(self.kube.custom, method)
        return self.kube.call(f"{what} CapacityBuffer {self.namespace}/{self.name}", fn, BUFFER_GROUP,
                              BUFFER_VERSION, self.namespace, BUFFER_PLURAL, *args)

    async def ensure(self, template, slots: int) -> None:
        """Create or update the buffer with `slots` chunks (clamped to max_slots); `template` is not read (the
        provisioner resolves the chunk's pod from the reference)."""
        body = {
            "apiVersion": f"{BUFFER_GROUP}/{BUFFER_VERSION}", "kind": "CapacityBuffer",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
            "spec": {**self.ref, "replicas": max(0, min(self.max_slots, slots)),
                     "provisioningStrategy": ACTIVE_CAPACITY},
        }
        custom, args = self.kube.custom, (BUFFER_GROUP, BUFFER_VERSION, self.namespace, BUFFER_PLURAL)
        try:
            await write_ours(self.kube, what=f"CapacityBuffer {self.namespace}/{self.name}", body=body,
                             read=lambda: custom.get_namespaced_custom_object(*args, self.name),
                             create=lambda b: custom.create_namespaced_custom_object(*args, b),
                             replace=lambda b: custom.replace_namespaced_custom_object(*args, self.name, b),
                             same=lambda current: current.get("spec") == body["spec"])
        except PermanentError as exc:
            # the create's 404: no namespace, or no API to make the buffer in (the read's 404 too, then)
            if exc.kind == "no_namespace" and not await buffer_api_served(self.kube):
                raise no_buffer_api() from None
            raise

    async def ready(self) -> int:
        try:
            return buffer_ready(await self._call("read", "get_namespaced_custom_object", self.name))
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            return 0
