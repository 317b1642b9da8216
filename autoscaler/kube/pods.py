"""A pod's facts, read once: the one place that interprets a pod's metadata, spec and status.

`pod_facts(pod)` takes a pod as the client returns it (a `kubernetes_asyncio` V1Pod) or as the API's JSON
(a dict with the API's camelCase keys, as the harness reads it over plain HTTP): the same function reads
both, field names from the client's own `attribute_map`, so the two forms cannot drift apart.

What the conditions mean here:
- PodScheduled True: the scheduler bound the pod to a node; `scheduled_s` is when (the condition's
  lastTransitionTime). `placed_s` is that time for a pod that names its node.
- PodScheduled False with reason Unschedulable: the pod waits for room (a node to be provisioned or freed).
- Ready True: the pod passes its readiness probe; `ready_s` is when it became Ready.
The API merges conditions by type, so a type appears once; the first one is read. Fields a pod does not
have yet (a pod just created has no status) read as None or False. Timestamps are unix seconds
(`times.parse_time`); a timestamp that is no time raises ValueError, as the client would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kubernetes_asyncio.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodSpec, V1PodStatus

from autoscaler.kube.client import object_time

FINISHED_PHASES = ("Succeeded", "Failed")


def _get(obj: Any, model: type, name: str) -> Any:
    """Field `name` (the client's snake_case) of an API object, or of its JSON form (a dict)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(model.attribute_map[name])
    return getattr(obj, name, None)


@dataclass(frozen=True)
class PodFacts:
    """One pod as the controller and the harness read it."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_s: float | None = None
    deleting: bool = False  # a deletion timestamp is set
    node: str | None = None  # the node it is bound to
    phase: str | None = None
    ip: str | None = None
    scheduled: bool = False  # PodScheduled True
    scheduled_s: float | None = None  # when PodScheduled became True
    unschedulable: bool = False  # PodScheduled False, reason Unschedulable
    ready: bool = False  # Ready True
    ready_s: float | None = None  # when it became Ready

    @property
    def live(self) -> bool:
        """Neither being deleted nor finished."""
        return not self.deleting and self.phase not in FINISHED_PHASES

    @property
    def placed_s(self) -> float | None:
        """When the scheduler placed the pod on its node, if it has."""
        return self.scheduled_s if self.scheduled and self.node else None

    @property
    def began_s(self) -> float | None:
        """Where its start-up began: its placement on a node, else (never placed as far as the status says)
        its creation."""
        return self.scheduled_s if self.scheduled else self.created_s


def _condition(conditions, kind: str):
    return next((c for c in conditions or [] if _get(c, V1PodCondition, "type") == kind), None)


def _when(condition) -> float | None:
    return object_time(_get(condition, V1PodCondition, "last_transition_time"))


def pod_facts(pod: Any) -> PodFacts:
    """The facts of a pod: a V1Pod, or its JSON form (a dict)."""
    meta = _get(pod, V1Pod, "metadata")
    spec = _get(pod, V1Pod, "spec")
    status = _get(pod, V1Pod, "status")
    conditions = _get(status, V1PodStatus, "conditions")
    scheduled = _condition(conditions, "PodScheduled")
    ready = _condition(conditions, "Ready")
    is_scheduled = scheduled is not None and _get(scheduled, V1PodCondition, "status") == "True"
    is_ready = ready is not None and _get(ready, V1PodCondition, "status") == "True"
    return PodFacts(
        name=_get(meta, V1ObjectMeta, "name"),
        namespace=_get(meta, V1ObjectMeta, "namespace"),
        uid=_get(meta, V1ObjectMeta, "uid"),
        labels=_get(meta, V1ObjectMeta, "labels") or {},
        created_s=object_time(_get(meta, V1ObjectMeta, "creation_timestamp")),
        deleting=_get(meta, V1ObjectMeta, "deletion_timestamp") is not None,
        node=_get(spec, V1PodSpec, "node_name") or None,
        phase=_get(status, V1PodStatus, "phase"),
        ip=_get(status, V1PodStatus, "pod_ip") or None,
        scheduled=is_scheduled,
        scheduled_s=_when(scheduled) if is_scheduled else None,
        unschedulable=scheduled is not None and _get(scheduled, V1PodCondition, "status") == "False"
        and _get(scheduled, V1PodCondition, "reason") == "Unschedulable",
        ready=is_ready,
        ready_s=_when(ready) if is_ready else None,
    )
