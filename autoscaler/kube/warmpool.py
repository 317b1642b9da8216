"""The warm pool: a Deployment of pause-container placeholder pods shaped like one model replica.

Each placeholder requests what one replica's pod requests, all of it (GPUs, CPU, memory, as the scheduler
counts a pod: `quantity.effective_resources`), and copies the scheduling constraints (node selector,
affinity, tolerations), so a node provisioned for a placeholder fits the replica, and preempting one frees
exactly one replica's worth of usable capacity. Its PriorityClass is negative but not below the cluster-autoscaler's
expendable cutoff (-10), so a preempted placeholder still triggers a new node."""

from __future__ import annotations

from autoscaler.errors import PermanentError
from autoscaler.kube.client import Kube, with_backoff
from autoscaler.kube.quantity import effective_resources, format_quantity

MANAGED_BY = {"app.kubernetes.io/managed-by": "inference-autoscaler"}
NATIVE = ("cpu", "memory", "ephemeral-storage", "hugepages-")


def placeholder_spec(template, *, name: str, priority_class: str, pause_image: str,
                     serialize=lambda obj: obj) -> dict:
    """The placeholder Deployment for a target pod template (a V1PodTemplateSpec)."""
    spec = template.spec
    requests, _ = effective_resources(spec)
    # The scheduler places by requests; extended resources (GPUs, MIG slices) must also be limited to the
    # same amount. CPU and memory get no limit: the pause container uses neither.
    limits = {k: v for k, v in requests.items() if not k.startswith(NATIVE)}
    labels = {"inference-autoscaler/warm-pool": name, **MANAGED_BY}
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
            "selector": {"matchLabels": {"inference-autoscaler/warm-pool": name}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


class WarmPool:
    def __init__(self, kube: Kube, *, namespace: str, name: str, priority_class: str,
                 pause_image: str, max_slots: int) -> None:
        self.kube = kube
        self.namespace, self.name = namespace, name
        self.priority_class, self.pause_image, self.max_slots = priority_class, pause_image, max_slots

    async def ensure(self, template, slots: int) -> None:
        """Create or update the placeholder Deployment with `slots` replicas (clamped to max_slots)."""
        body = placeholder_spec(template, name=self.name, priority_class=self.priority_class,
                                pause_image=self.pause_image, serialize=self.kube.api.sanitize_for_serialization)
        body["metadata"]["namespace"] = self.namespace
        body["spec"]["replicas"] = max(0, min(self.max_slots, slots))
        apps = self.kube.apps

        async def attempt() -> None:
            try:
                current = await self.kube.call(f"read warm pool {self.name}", apps.read_namespaced_deployment,
                                               self.name, self.namespace)
            except PermanentError as exc:
                if exc.kind != "not_found":
                    raise
                await self.kube.call(f"create warm pool {self.name}", apps.create_namespaced_deployment,
                                     self.namespace, body)
                return
            labels = current.metadata.labels or {}
            if labels.get("app.kubernetes.io/managed-by") != MANAGED_BY["app.kubernetes.io/managed-by"]:
                raise PermanentError(f"Deployment {self.namespace}/{self.name} exists and is not ours; "
                                     "refusing to take it over", kind="not_owned")
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            await self.kube.call(f"update warm pool {self.name}", apps.replace_namespaced_deployment,
                                 self.name, self.namespace, body)

        await with_backoff(attempt, clock=self.kube.clock)
