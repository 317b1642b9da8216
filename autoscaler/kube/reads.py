"""What the cluster readers read, behind one seam: from the API per call (`ApiReads`), or from the watch
cache (`autoscaler/kube/cache.py`, `CacheReads`).

The readers (`cluster.py`, `capacity.py`, `budget.py`, `warmpool.py`, `nodewaits.py`) compute the model's
`ClusterState` from the items these return, the same way whichever implementation serves them; each read
returns the client's objects (V1Pod, V1Node, V1Deployment...; the Kueue queues as dicts). Errors are the edge
error kinds: a target or a node that does not exist is a PermanentError of kind `not_found`.
"""

from __future__ import annotations

from typing import Any, Protocol

from autoscaler.kube.client import Kube

LIVE = "status.phase!=Succeeded,status.phase!=Failed"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_PLURALS = {"LocalQueue": "localqueues", "ClusterQueue": "clusterqueues"}


def label_selector(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


class ClusterReads(Protocol):
    async def workload(self, namespace: str, kind: str, name: str) -> Any:
        """A Deployment or StatefulSet."""
        ...

    async def pods(self, namespace: str, match_labels: dict[str, str]) -> list:
        """The pods of a namespace whose labels hold `match_labels` (finished ones too)."""
        ...

    async def live_pods(self, namespace: str | None) -> list:
        """Pods neither Succeeded nor Failed, of a namespace (None: of every namespace)."""
        ...

    async def pod_events(self, namespace: str) -> list:
        """The Events about pods in a namespace."""
        ...

    async def nodes(self) -> list:
        ...

    async def node(self, name: str) -> Any:
        ...

    async def kueue(self, kind: str, name: str, namespace: str | None = None, *, version: str) -> dict:
        """A Kueue LocalQueue (of `namespace`) or ClusterQueue (`namespace` None), as a dict."""
        ...

    async def cluster_queues(self, version: str) -> list[dict]:
        """Every Kueue ClusterQueue (a cohort's peers)."""
        ...


class ApiReads:
    """Every read is a request (as the single-model controller reads each tick)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def workload(self, namespace: str, kind: str, name: str):
        read = (self.kube.apps.read_namespaced_deployment if kind == "Deployment"
                else self.kube.apps.read_namespaced_stateful_set)
        return await self.kube.call(f"read {kind} {namespace}/{name}", read, name, namespace)

    async def pods(self, namespace: str, match_labels: dict[str, str]) -> list:
        selector = label_selector(match_labels)
        return (await self.kube.call(f"list pods {namespace} {selector}", self.kube.core.list_namespaced_pod,
                                     namespace, label_selector=selector)).items

    async def live_pods(self, namespace: str | None) -> list:
        if namespace is None:
            return (await self.kube.call("list pods in all namespaces", self.kube.core.list_pod_for_all_namespaces,
                                         field_selector=LIVE)).items
        return (await self.kube.call(f"list pods {namespace}", self.kube.core.list_namespaced_pod, namespace,
                                     field_selector=LIVE)).items

    async def pod_events(self, namespace: str) -> list:
        return (await self.kube.call(f"list events {namespace}", self.kube.core.list_namespaced_event, namespace,
                                     field_selector="involvedObject.kind=Pod")).items

    async def nodes(self) -> list:
        return (await self.kube.call("list nodes", self.kube.core.list_node)).items

    async def node(self, name: str):
        return await self.kube.call(f"get node {name}", self.kube.core.read_node, name)

    async def kueue(self, kind: str, name: str, namespace: str | None = None, *, version: str) -> dict:
        custom, plural = self.kube.custom, KUEUE_PLURALS[kind]
        if namespace is None:
            return await self.kube.call(f"read {kind} {name}", custom.get_cluster_custom_object, KUEUE_GROUP,
                                        version, plural, name)
        return await self.kube.call(f"read {kind} {namespace}/{name}", custom.get_namespaced_custom_object,
                                    KUEUE_GROUP, version, namespace, plural, name)

    async def cluster_queues(self, version: str) -> list[dict]:
        return (await self.kube.call("list ClusterQueues", self.kube.custom.list_cluster_custom_object, KUEUE_GROUP,
                                     version, "clusterqueues")).get("items", [])
