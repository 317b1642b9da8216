"""Which pods a scale-down removes, on the real control plane: ScaleActuator marks the pods
(pod-deletion-cost) and the real ReplicaSet controller deletes them.

Each test brings its own kwok nodes (unique names, a label and a taint only its pods select and tolerate, so
the shared gpu-0..2 and other tests' pods stay out of it) and deletes them afterwards. Without the marks, the
ReplicaSet controller takes a pod doubled up on a node first (it spreads the survivors), then the one Ready
for the shortest time: each test is set up so that this default removes a different pod than the ordering."""

import asyncio
import itertools
import time

import pytest

from autoscaler.kube.client import Kube
from autoscaler.kube.deletion import ANNOTATION, PENDING_COST, DeletionOrder
from autoscaler.kube.scale import ScaleActuator

from loadtest.kube.controlplane import gpu_node, model_deployment

_ids = itertools.count()
KEY = "deletion-cost-test"


@pytest.fixture
def place(cluster):
    """A namespace and a way to add nodes only its pods can use; all deleted afterwards."""
    name = f"dc{next(_ids)}-{int(time.time() * 1000) % 100000}"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})[0] == 201
    nodes = []

    def add_node(gpus: int) -> str:
        node = gpu_node(f"{name}-n{len(nodes)}", gpus=gpus)
        node["metadata"]["labels"] = {KEY: name}  # not type=kwok: the other tests' pods select that
        node["spec"]["taints"].append({"key": KEY, "value": name, "effect": "NoSchedule"})
        status, body = cluster.request("POST", "/api/v1/nodes", node)
        assert status == 201, body
        nodes.append(node["metadata"]["name"])
        return node["metadata"]["name"]

    yield name, add_node
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cluster.request("GET", f"/api/v1/namespaces/{name}/pods")[1].get("items"):
        time.sleep(0.5)
    for node in nodes:
        cluster.request("DELETE", f"/api/v1/nodes/{node}")


def deploy(cluster, ns: str, *, replicas: int, gpus: int) -> None:
    body = model_deployment(ns, "model", replicas)
    spec = body["spec"]["template"]["spec"]
    spec["nodeSelector"] = {KEY: ns}
    spec["tolerations"].append({"key": KEY, "operator": "Exists", "effect": "NoSchedule"})
    spec["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}
    status, created = cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert status == 201, created


def pods(cluster, ns: str) -> dict[str, dict]:
    """The model's pods by name, terminating ones included."""
    return {p["metadata"]["name"]: p for p in cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"]}


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def wait_for(cluster, ns: str, check, timeout_s: float = 60.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        now = pods(cluster, ns)
        if check(now):
            return now
        assert time.monotonic() < deadline, {n: (p["spec"].get("nodeName"), ready(p)) for n, p in now.items()}
        time.sleep(0.3)


def on_node(found: dict[str, dict]) -> dict[str, list[str]]:
    by_node: dict[str, list[str]] = {}
    for name, pod in found.items():
        by_node.setdefault(pod["spec"].get("nodeName"), []).append(name)
    return by_node


def scale_down(cluster, ns: str, replicas: int, *, in_flight=None) -> tuple[dict[str, int], list]:
    """Scale the model through ScaleActuator with the deletion order; returns the costs written and the errors."""
    errors, written = [], {}

    class Recorded(DeletionOrder):
        async def before_scale_down(self, selector):
            written.update(await super().before_scale_down(selector))
            return written

    async def go():
        kube = await Kube.connect(cluster.kubeconfig)
        try:
            order = Recorded(kube, namespace=ns, in_flight=in_flight, on_error=errors.append, timeout_s=10.0)
            actuator = ScaleActuator(kube, namespace=ns, kind="Deployment", name="model", min_replicas=1,
                                     max_replicas=10, deletion=order)
            return await actuator.scale(replicas)
        finally:
            await kube.close()

    assert asyncio.run(go()) is not None
    return written, errors


def settled(count: int):
    """Exactly `count` pods, none terminating."""
    return lambda found: len(found) == count and all(p["metadata"].get("deletionTimestamp") is None
                                                     for p in found.values())


def test_a_scale_down_empties_the_least_used_node(cluster, place):
    ns, add_node = place
    a, b = add_node(8), add_node(8)
    deploy(cluster, ns, replicas=3, gpus=4)  # 2 fit on a node: one node gets 2 replicas, the other 1
    before = wait_for(cluster, ns, lambda found: len(found) == 3 and all(ready(p) for p in found.values()))
    placed = on_node(before)
    assert sorted(len(placed[n]) for n in (a, b)) == [1, 2]
    lone_node = a if len(placed[a]) == 1 else b
    [lone] = placed[lone_node]

    written, errors = scale_down(cluster, ns, 2)

    assert errors == []
    assert written[lone] < min(c for n, c in written.items() if n != lone)
    after = wait_for(cluster, ns, settled(2))
    assert sorted(after) == sorted(set(before) - {lone})
    assert lone_node not in on_node(after)  # the node is empty: a provisioner can remove it
    assert all(p["metadata"]["annotations"][ANNOTATION] == str(written[n]) for n, p in after.items())


def test_a_pod_no_node_can_hold_goes_first_then_the_least_used_node_empties(cluster, place):
    ns, add_node = place
    big, small = add_node(8), add_node(4)
    deploy(cluster, ns, replicas=4, gpus=4)  # 2 on big, 1 on small, the 4th waits for a node forever
    before = wait_for(cluster, ns, lambda found: len(found) == 4 and sum(ready(p) for p in found.values()) == 3
                      and sum(not p["spec"].get("nodeName") for p in found.values()) == 1)
    placed = on_node(before)
    [waiting], [_on_small] = placed[None], placed[small]  # exactly one pod on the small node

    written, errors = scale_down(cluster, ns, 2)  # one write removes two pods

    assert errors == [] and written[waiting] == PENDING_COST
    after = wait_for(cluster, ns, settled(2))
    # gone: the waiting pod and the one on the small node (now empty); both on the big node still serve
    assert sorted(after) == sorted(placed[big]) and all(ready(p) for p in after.values())


def test_among_equally_used_nodes_the_pod_with_fewer_requests_in_flight_goes(cluster, place):
    ns, add_node = place
    add_node(8)
    add_node(8)
    deploy(cluster, ns, replicas=1, gpus=8)  # one replica per node: both nodes equally used
    [first] = wait_for(cluster, ns, lambda found: len(found) == 1 and all(ready(p) for p in found.values()))
    time.sleep(8)  # the first replica is Ready for clearly longer, so by default the second one would go
    status, _ = cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model", {"spec": {"replicas": 2}})
    assert status == 200
    found = wait_for(cluster, ns, lambda found: len(found) == 2 and all(ready(p) for p in found.values()))
    [second] = [n for n in found if n != first]

    class InFlight:
        """The per-pod figures a scrape of the model servers would give: the newer replica is the busy one."""

        def __init__(self) -> None:
            self.asked = {}

        async def in_flight(self, pods):
            self.asked = dict(pods)
            return {first: 0.0, second: 5.0}

    figures = InFlight()
    written, errors = scale_down(cluster, ns, 1, in_flight=figures)

    assert errors == [] and set(figures.asked) == {first, second}  # ready pods, by their pod IPs
    after = wait_for(cluster, ns, settled(1))
    assert list(after) == [second] and written[first] < written[second]
