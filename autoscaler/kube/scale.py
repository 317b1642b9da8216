"""Replicas through the scale subresource of the target Deployment/StatefulSet.

Optimistic concurrency: the write carries the resourceVersion that was read, so a concurrent change is a
409 conflict, which re-reads and retries with backoff (as do 429 and 5xx). The count is clamped to the
policy's bounds before anything is written; nothing is written for an invalid decision or when the
target already has that many replicas.

Before a scale-down of a Deployment, once per `scale` call, a `DeletionMarker` (in production the
`DeletionOrder` of `deletion.py`) marks which pods should go (pods not on a node, then those on the
least-used nodes, then the least busy); it never raises and is bounded in time, so the scale write goes
ahead whatever becomes of the marks. A StatefulSet
removes its highest ordinal whatever its pods say, so its pods are not marked."""

from __future__ import annotations

from typing import Protocol

from autoscaler.kube.client import Kube, with_backoff


class DeletionMarker(Protocol):
    """Marks the pods a scale-down of `selector` should remove first; never raises, bounded in time."""

    async def before_scale_down(self, selector: str) -> object: ...


class ScaleActuator:
    def __init__(self, kube: Kube, *, namespace: str, kind: str, name: str, min_replicas: int, max_replicas: int,
                 deletion: DeletionMarker | None = None):
        """`deletion`: marks the pods a scale-down should remove (ignored for a StatefulSet)."""
        self.kube = kube
        self.namespace, self.kind, self.name = namespace, kind, name
        self.min, self.max = min_replicas, max_replicas
        self.deletion = deletion if kind == "Deployment" else None
        apps = kube.apps
        if kind == "Deployment":
            self._read, self._replace = apps.read_namespaced_deployment_scale, apps.replace_namespaced_deployment_scale
        else:
            self._read, self._replace = (apps.read_namespaced_stateful_set_scale,
                                         apps.replace_namespaced_stateful_set_scale)

    async def scale(self, replicas: int) -> tuple[int, int] | None:
        """Set replicas; returns (before, after) when something was written, else None."""
        wanted = min(self.max, max(self.min, replicas))
        where = f"{self.kind} {self.namespace}/{self.name}"
        ordered = False

        async def attempt() -> tuple[int, int] | None:
            nonlocal ordered
            current = await self.kube.call(f"read scale of {where}", self._read, self.name, self.namespace)
            selector = current.status.selector if current.status else None
            if (current.spec.replicas or 0) > wanted and self.deletion is not None and selector and not ordered:
                ordered = True  # once: a conflict re-reads the scale, not the pods
                await self.deletion.before_scale_down(selector)
                # the marks took a moment, in which the controllers updated the target: write on fresh state
                current = await self.kube.call(f"read scale of {where}", self._read, self.name, self.namespace)
            before = current.spec.replicas or 0
            if before == wanted:
                return None
            body = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": current.metadata.resource_version},
                "spec": {"replicas": wanted},
            }
            await self.kube.call(f"scale {where} to {wanted}", self._replace, self.name, self.namespace, body)
            return before, wanted

        return await with_backoff(attempt, clock=self.kube.clock)
