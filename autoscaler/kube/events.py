"""Kubernetes Events on the target: one per scaling action, carrying the decision's reasons, and a Warning
when ordered replicas cannot get a node."""

from __future__ import annotations

import uuid

from autoscaler.kube.client import Kube
from autoscaler.times import rfc3339

COMPONENT = "inference-autoscaler"


class EventRecorder:
    def __init__(self, kube: Kube, *, namespace: str, kind: str, name: str, instance: str) -> None:
        self.kube = kube
        self.namespace, self.kind, self.name, self.instance = namespace, kind, name, instance

    async def scaled(self, *, before: int, after: int, reasons: tuple[str, ...], now: float) -> None:
        message = f"Scaled {before} -> {after}: " + "; ".join(reasons)
        await self._emit("ScaledUp" if after > before else "ScaledDown", message, "Normal", now)

    async def capacity_unavailable(self, *, replicas: int, reasons: tuple[str, ...], now: float) -> None:
        why = next((r for r in reasons if r.startswith("capacity:")), f"{replicas} replicas cannot get a node")
        await self._emit("CapacityUnavailable", why, "Warning", now)

    async def _emit(self, reason: str, message: str, kind: str, now: float) -> None:
        stamp = rfc3339(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.name}.{uuid.uuid4().hex[:12]}", "namespace": self.namespace},
            "involvedObject": {"apiVersion": "apps/v1", "kind": self.kind, "name": self.name,
                               "namespace": self.namespace},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self.kube.call("create event", self.kube.core.create_namespaced_event, self.namespace, body)
