"""Which pods a scale-down removes: the pure ordering, and the seams around it (ScaleActuator, DeletionOrder)
with a few lines of fakes. The real control plane: test_deletion_cost.py."""

import asyncio
from decimal import Decimal
from types import SimpleNamespace as NS

import pytest

from autoscaler.errors import EdgeError, PermanentError, TransientError
from autoscaler.kube.deletion import (ANNOTATION, INT32_MAX, INT32_MIN, PENDING_COST, DeletionOrder, PodPlace,
                                      deletion_costs, node_leaving, node_usage, pod_gpus)
from autoscaler.kube.scale import ScaleActuator


def order(costs: dict[str, int]) -> list[str]:
    """Pod names in the order the ReplicaSet controller deletes them (lowest cost first)."""
    return sorted(costs, key=costs.get)


def test_pods_not_on_a_node_go_first_then_those_on_the_least_used_node():
    pods = [PodPlace("a1", "a"), PodPlace("b1", "b"), PodPlace("b2", "b"), PodPlace("waiting", None)]
    usage = node_usage([PodPlace("a1", "a", Decimal(4)), PodPlace("b1", "b", Decimal(4)),
                        PodPlace("b2", "b", Decimal(4))])
    assert usage == {"a": 4, "b": 8}
    costs = deletion_costs(pods, usage=usage)
    assert costs["waiting"] == PENDING_COST == INT32_MIN
    assert order(costs)[:2] == ["waiting", "a1"]  # then node a is empty
    assert costs["b1"] == costs["b2"]  # equals: nothing else tells them apart


def test_among_equals_the_pod_with_fewer_requests_in_flight_goes_first():
    pods = [PodPlace("busy", "a"), PodPlace("idle", "b"), PodPlace("unread", "c")]
    usage = {"a": Decimal(4), "b": Decimal(4), "c": Decimal(4)}
    costs = deletion_costs(pods, usage=usage, in_flight={"busy": 12.0, "idle": 0.0})
    # a pod whose figure could not be read may be the busy one: last among its equals
    assert order(costs) == ["idle", "busy", "unread"]
    # but node usage comes first: an idle pod on a fuller node stays
    costs = deletion_costs(pods, usage={**usage, "b": Decimal(8)}, in_flight={"busy": 12.0, "idle": 0.0})
    assert order(costs)[0] == "busy"
    # without figures, node usage alone
    assert len(set(deletion_costs(pods, usage=usage).values())) == 1


def test_pods_on_a_node_going_away_go_before_healthy_ones():
    pods = [PodPlace("light", "a"), PodPlace("drained", "b"), PodPlace("waiting", None)]
    costs = deletion_costs(pods, usage={"a": Decimal(1), "b": Decimal(8)}, leaving={"b"})
    assert order(costs) == ["waiting", "drained", "light"]


def test_costs_are_int32_and_follow_the_measurements_not_the_ranks():
    pods = [PodPlace("p", "huge"), PodPlace("q", "small")]
    costs = deletion_costs(pods, usage={"huge": Decimal(10 ** 9), "small": Decimal("0.5")},
                           in_flight={"p": 1e12, "q": -3.0})
    assert all(INT32_MIN <= c <= INT32_MAX for c in costs.values())
    assert costs["q"] < costs["p"]
    # a pod's cost does not move because another pod's load did
    before = deletion_costs(pods, usage={"huge": Decimal(8), "small": Decimal(4)}, in_flight={"p": 3, "q": 1})
    after = deletion_costs(pods, usage={"huge": Decimal(8), "small": Decimal(4)}, in_flight={"p": 9, "q": 1})
    assert before["q"] == after["q"] and before["p"] != after["p"]


def test_gpus_of_a_pod_and_nodes_on_their_way_out():
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}},
                           {"resources": {"requests": {"cpu": "2", "nvidia.com/mig-1g.10gb": "1"}}}]}
    assert pod_gpus(spec) == 5

    def node(*, unschedulable=False, taints=(), deleting=False):
        return NS(metadata=NS(deletion_timestamp="now" if deleting else None),
                  spec=NS(unschedulable=unschedulable, taints=[NS(key=k) for k in taints]))

    assert not node_leaving(node(taints=["kwok.x-k8s.io/node"]))
    assert node_leaving(node(unschedulable=True))  # kubectl drain / cordon
    assert node_leaving(node(deleting=True))
    assert node_leaving(node(taints=["karpenter.sh/disrupted"]))
    assert node_leaving(node(taints=["ToBeDeletedByClusterAutoscaler"]))


# --- ScaleActuator: when it asks for the order -------------------------------------------------------------


class FakeScale:
    """The scale subresource: replicas and the target's selector."""

    def __init__(self, replicas: int, selector: str = "app=model", conflicts: int = 0) -> None:
        self.replicas, self.selector, self.conflicts, self.writes = replicas, selector, conflicts, []

    async def read(self, name, namespace):
        return NS(spec=NS(replicas=self.replicas), status=NS(selector=self.selector),
                  metadata=NS(resource_version="1"))

    async def replace(self, name, namespace, body):
        if self.conflicts:
            self.conflicts -= 1
            raise TransientError("conflict", kind="conflict")
        self.replicas = body["spec"]["replicas"]
        self.writes.append(self.replicas)


def fake_kube(scale: FakeScale):
    async def call(what, fn, *args, **kwargs):
        return await fn(*args, **kwargs)

    apps = NS(read_namespaced_deployment_scale=scale.read, replace_namespaced_deployment_scale=scale.replace,
              read_namespaced_stateful_set_scale=scale.read, replace_namespaced_stateful_set_scale=scale.replace)
    async def no_wait(seconds):
        pass

    return NS(apps=apps, call=call, clock=NS(sleep=no_wait))  # retries without waiting


class RecordingOrder:
    def __init__(self, scale: FakeScale | None = None) -> None:
        self.calls, self.scale = [], scale

    async def before_scale_down(self, selector):
        # the marks must be in place before the replicas go down
        self.calls.append((selector, self.scale.replicas if self.scale else None))
        return {}


def actuator(scale, deletion, kind="Deployment"):
    return ScaleActuator(fake_kube(scale), namespace="llm", kind=kind, name="model", min_replicas=1,
                         max_replicas=10, deletion=deletion)


def test_the_order_is_written_before_a_scale_down_only():
    scale = FakeScale(4)
    deletion = RecordingOrder(scale)
    act = actuator(scale, deletion)
    assert asyncio.run(act.scale(6)) == (4, 6)
    assert asyncio.run(act.scale(6)) is None
    assert deletion.calls == []  # nothing on a scale-up or no change
    assert asyncio.run(act.scale(3)) == (6, 3)
    assert deletion.calls == [("app=model", 6)]


def test_a_statefulset_is_never_marked():
    scale = FakeScale(4)
    deletion = RecordingOrder(scale)
    assert asyncio.run(actuator(scale, deletion, kind="StatefulSet").scale(2)) == (4, 2)
    assert deletion.calls == []  # it removes its highest ordinal whatever the annotation says


def test_a_conflict_retries_the_scale_write_not_the_marks():
    scale = FakeScale(5, conflicts=2)
    deletion = RecordingOrder(scale)
    assert asyncio.run(actuator(scale, deletion).scale(2)) == (5, 2)
    assert len(deletion.calls) == 1 and scale.writes == [2]


# --- DeletionOrder: a failure to mark never stops the scale-down --------------------------------------------


def pod(name, node, *, gpus=1, cost=None, ready=True, ip=None):
    return NS(
        metadata=NS(name=name, deletion_timestamp=None, annotations={ANNOTATION: cost} if cost else {}),
        spec=NS(node_name=node, containers=[{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]),
        status=NS(phase="Running" if node else "Pending", pod_ip=ip,
                  conditions=[NS(type="Ready", status="True" if ready else "False")]),
    )


class FakeCore:
    def __init__(self, pods, *, patch_error=None, node_error=None, hang=False):
        self.pods, self.patch_error, self.node_error, self.hang = pods, patch_error, node_error, hang
        self.patched = {}

    async def list_namespaced_pod(self, namespace, label_selector=None):
        if self.hang:
            await asyncio.sleep(3600)
        return NS(items=self.pods)

    async def read_node(self, name):
        if self.node_error:
            raise self.node_error
        return NS(metadata=NS(deletion_timestamp=None), spec=NS(unschedulable=False, taints=[]))

    async def patch_namespaced_pod(self, name, namespace, body):
        if self.patch_error and name in self.patch_error:
            raise PermanentError(f"patch {name}: HTTP 404", kind="not_found")
        self.patched[name] = body["metadata"]["annotations"][ANNOTATION]


def deletion_order(core, **kw):
    async def call(what, fn, *args, **kwargs):
        return await fn(*args, **kwargs)

    errors = []
    return DeletionOrder(NS(core=core, call=call), namespace="llm", on_error=errors.append, **kw), errors


def test_only_changed_costs_are_written_and_a_failed_patch_spares_the_others():
    pods = [pod("a1", "a"), pod("b1", "b", cost="10009"), pod("b2", "b"), pod("gone", "b"), pod("waiting", None)]
    core = FakeCore(pods, patch_error={"gone"})
    marks, errors = deletion_order(core)
    written = asyncio.run(marks.before_scale_down("app=model"))
    # b has 3 GPUs in use, a 1; no in-flight figures: "unknown" (9_999) for all
    assert core.patched == {"a1": "19999", "b1": "39999", "b2": "39999", "waiting": str(PENDING_COST)}
    assert written == {k: int(v) for k, v in core.patched.items()}
    assert [e.kind for e in errors] == ["not_found"]
    pods[0].metadata.annotations = {ANNOTATION: "19999"}
    core.patched.clear()
    asyncio.run(marks.before_scale_down("app=model"))
    assert "a1" not in core.patched  # unchanged: not written again


def test_in_flight_figures_come_from_the_reader_for_ready_pods_with_an_address():
    class Reader:
        def __init__(self):
            self.asked = None

        async def in_flight(self, pods):
            self.asked = dict(pods)
            return {"a1": 5.0}

    reader = Reader()
    core = FakeCore([pod("a1", "a", ip="10.0.0.1"), pod("a2", "a", ip="10.0.0.2", ready=False),
                     pod("waiting", None)])
    marks, errors = deletion_order(core, in_flight=reader)
    asyncio.run(marks.before_scale_down("app=model"))
    assert reader.asked == {"a1": "10.0.0.1"}
    assert core.patched["a1"] == "20005" and core.patched["a2"] == "29999" and errors == []


@pytest.mark.parametrize("core,kind", [
    (FakeCore([], hang=True), "deletion_cost_deadline"),
    (FakeCore([pod("a1", "a"), pod("a2", "a"), pod("b1", "b")],
              node_error=PermanentError("get node: HTTP 403", kind="forbidden")), "forbidden"),
])
def test_a_failure_is_counted_once_and_never_raised(core, kind):
    marks, errors = deletion_order(core, timeout_s=0.05)
    asyncio.run(marks.before_scale_down("app=model"))
    assert [e.kind for e in errors] == [kind]
    assert all(isinstance(e, EdgeError) for e in errors)
    if kind == "forbidden":  # nodes unknown: taken as staying, and the pods are still ordered by usage
        assert int(core.patched["b1"]) < int(core.patched["a1"])


def test_a_bug_in_the_ordering_does_not_stop_the_scale_down():
    class Broken:
        async def in_flight(self, pods):
            raise ZeroDivisionError("bug")

    core = FakeCore([pod("a1", "a", ip="10.0.0.1")])
    marks, errors = deletion_order(core, in_flight=Broken())
    assert asyncio.run(marks.before_scale_down("app=model")) == {}
    assert [e.kind for e in errors] == ["ZeroDivisionError"]
