"""A pod's facts, read once (`autoscaler.kube.pods`), from the client's objects and from the API's JSON; the
warm pool backends against their protocol; the cluster reader's capacity readers, run concurrently, each
keeping its own errors. The real control plane: test_kube.py, test_capacity_kube.py, test_warm_capacity.py."""

import asyncio
import inspect
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace as NS

import pytest
from kubernetes_asyncio.client import (ApiClient, V1Deployment, V1DeploymentSpec, V1DeploymentStatus,
                                       V1LabelSelector, V1ObjectMeta, V1Pod, V1PodCondition, V1PodSpec, V1PodStatus,
                                       V1PodTemplateSpec)

from autoscaler.errors import PermanentError, TransientError
from autoscaler.kube import warmpool
from autoscaler.kube.budget import Budget
from autoscaler.kube.capacity import NodeRoom
from autoscaler.kube.cluster import ClusterReader, serving_replicas, startup_s
from autoscaler.kube.pods import PodFacts, pod_facts

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pod(name="m-1", *, node="n1", scheduled=("True", None, 5.0), ready=("True", 65.0), phase="Running",
        deleting=False) -> V1Pod:
    conditions = []
    if scheduled is not None:
        status, reason, when = scheduled
        conditions.append(V1PodCondition(type="PodScheduled", status=status, reason=reason,
                                         last_transition_time=at(when) if when is not None else None))
    if ready is not None:
        conditions.append(V1PodCondition(type="Ready", status=ready[0], last_transition_time=at(ready[1])))
    return V1Pod(metadata=V1ObjectMeta(name=name, namespace="llm", uid=f"uid-{name}", labels={"app": "m"},
                                       creation_timestamp=at(0.0), deletion_timestamp=at(90.0) if deleting else None),
                 spec=V1PodSpec(containers=[], node_name=node),
                 status=V1PodStatus(phase=phase, pod_ip="10.0.0.7" if node else None, conditions=conditions))


def as_json(obj) -> dict:
    """The API's JSON form of a client object, as the client itself writes it."""
    async def go():
        api = ApiClient()
        try:
            return api.sanitize_for_serialization(obj)
        finally:
            await api.close()
    return asyncio.run(go())


def test_a_pod_reads_the_same_from_the_client_object_and_from_its_json():
    for p in (pod(), pod(node=None, scheduled=("False", "Unschedulable", 2.0), ready=("False", 2.0)),
              pod(ready=None, deleting=True, phase="Failed"), V1Pod(metadata=V1ObjectMeta(name="new"))):
        assert pod_facts(as_json(p)) == pod_facts(p)
    placed = pod_facts(pod())
    assert placed == PodFacts(name="m-1", namespace="llm", uid="uid-m-1", labels={"app": "m"},
                              created_s=T0.timestamp(), node="n1", phase="Running", ip="10.0.0.7", scheduled=True,
                              scheduled_s=at(5.0).timestamp(), ready=True, ready_s=at(65.0).timestamp())
    assert placed.live and placed.placed_s == placed.began_s == at(5.0).timestamp()
    # JSON as the apiserver sends it (Z times), e.g. to the harness over plain HTTP
    wire = {"metadata": {"name": "p", "creationTimestamp": "2026-11-01T00:00:00Z"}, "spec": {"nodeName": "n2"},
            "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                       "lastTransitionTime": "2026-11-01T00:00:30Z"}]}}
    assert pod_facts(wire).placed_s == at(30.0).timestamp() and not pod_facts(wire).ready


def test_what_each_condition_means():
    waiting = pod_facts(pod(node=None, scheduled=("False", "Unschedulable", 2.0), ready=("False", 2.0)))
    assert waiting.unschedulable and not waiting.scheduled and waiting.placed_s is None and waiting.ready_s is None
    assert waiting.began_s == T0.timestamp()  # never placed: its start-up is counted from its creation
    gated = pod_facts(pod(node=None, scheduled=("False", "SchedulingGated", 2.0), ready=None))
    assert not gated.unschedulable
    bound_no_time = pod_facts(pod(scheduled=("True", None, None)))
    assert bound_no_time.scheduled and bound_no_time.placed_s is None and bound_no_time.began_s is None
    assert not pod_facts(pod(deleting=True)).live and not pod_facts(pod(phase="Succeeded")).live
    empty = pod_facts(V1Pod())
    assert empty == PodFacts() and empty.live


def test_a_start_up_runs_from_placement_to_ready():
    assert startup_s(pod_facts(pod())) == 60.0
    assert startup_s(pod_facts(pod(scheduled=None))) == 65.0  # no PodScheduled: from creation
    assert startup_s(pod_facts(pod(scheduled=("True", None, 70.0)))) is None  # Ready before placed: no sample


@pytest.mark.parametrize("backend", [warmpool.PlaceholderPool, warmpool.CapacityBufferPool])
def test_both_warm_pool_backends_are_a_warm_pool(backend):
    for member in ("ensure", "ready"):
        wanted = inspect.signature(getattr(warmpool.WarmPool, member))
        assert inspect.signature(getattr(backend, member)).parameters.keys() == wanted.parameters.keys()
        assert inspect.iscoroutinefunction(getattr(backend, member))
    kwargs = dict(namespace="llm", name="m-warm-pool", max_slots=4)
    extra = ({"priority_class": "p", "pause_image": "i"} if backend is warmpool.PlaceholderPool
             else {"target_kind": "Deployment", "target": "m"})
    assert backend(NS(), **kwargs, **extra).name == "m-warm-pool"


# --- the capacity readers: concurrent, each with its own errors -------------------------------------------------

class Barrier:
    """Every reader waits here until all `n` are inside: readers run one after another would never get out."""

    def __init__(self, n: int):
        self.n, self.inside, self.open = n, [], asyncio.Event()

    async def cross(self, who: str, result=None, error: Exception | None = None):
        self.inside.append(who)
        if len(self.inside) == self.n:
            self.open.set()
        await self.open.wait()
        if error is not None:
            raise error
        return result


class Readers:
    def __init__(self, barrier: Barrier, errors: dict, *, room_kept: bool = False):
        self.barrier, self.errors = barrier, errors
        self.name, self.room_kept = "model-warm-pool", room_kept

    async def ready(self):
        return await self.barrier.cross("warm", 2, self.errors.get("warm"))

    async def room(self, template, shape, ours, namespace):
        return await self.barrier.cross("nodes", NodeRoom(idle_slots=3), self.errors.get("nodes"))

    async def read(self, workload, shape, pods):
        return await self.barrier.cross("budget", Budget(replicas=5, reason="cap"), self.errors.get("budget"))


class FakeKube:
    def __init__(self, barrier: Barrier, errors: dict):
        template = V1PodTemplateSpec(spec=V1PodSpec(containers=[]))
        workload = V1Deployment(spec=V1DeploymentSpec(replicas=3, selector=V1LabelSelector(match_labels={"app": "m"}),
                                                      template=template),
                                status=V1DeploymentStatus(ready_replicas=1))
        waiting = pod("m-2", node=None, scheduled=("False", "Unschedulable", 2.0), ready=("False", 2.0))
        event = NS(source=NS(component="karpenter"), reporting_component=None, involved_object=NS(name="m-2"),
                   reason="FailedScheduling", message="exceed limits", last_timestamp=at(100.0), event_time=None,
                   metadata=NS(creation_timestamp=at(100.0)))

        async def workload_read(name, namespace):
            return workload

        async def pods(namespace, label_selector):
            return NS(items=[pod("m-1"), waiting])

        async def events(namespace, field_selector):
            return await barrier.cross("events", NS(items=[event]), errors.get("events"))

        async def read_node(name):
            return NS(metadata=NS(creation_timestamp=at(-10.0), labels={}))

        self.apps = NS(read_namespaced_deployment=workload_read)
        self.core = NS(list_namespaced_pod=pods, list_namespaced_event=events, read_node=read_node)

    async def call(self, what, fn, *args, **kwargs):
        return await fn(*args, **kwargs)


def read_cluster(errors: dict | None = None, *, room_kept: bool = False):
    errors = errors or {}
    barrier = Barrier(4)
    readers = Readers(barrier, errors, room_kept=room_kept)
    reader = ClusterReader(FakeKube(barrier, errors), namespace="llm", kind="Deployment", name="m",
                           warm_pool=readers, nodes=readers, budget=readers)
    return asyncio.run(asyncio.wait_for(reader.read(at(110.0).timestamp()), 5.0)), sorted(barrier.inside)


def test_the_capacity_readers_run_at_once_into_one_state():
    state, inside = read_cluster()
    assert inside == ["budget", "events", "nodes", "warm"]
    assert (state.warm_slots_ready, state.idle_slots, state.budget_replicas, state.no_capacity_pods) == (2, 3, 5, 1)
    assert state.no_capacity_reason == "karpenter: exceed limits" and state.unschedulable_pods == 1
    assert state.startup_durations_s == (60.0,) and state.oldest_unschedulable_s == 110.0


def test_a_capacity_buffers_ready_slots_are_not_also_idle_slots():
    """A buffer's ready slots are free room on the nodes, which the nodes' reader counts too: 2 ready of 3 free
    slots leave 1 idle (counted twice, the warm stage took the buffer's own room for idle room and shrank it).
    Placeholder pods hold their room: the nodes' 3 free slots are all idle."""
    buffer, _ = read_cluster(room_kept=True)
    assert (buffer.warm_slots_ready, buffer.idle_slots) == (2, 1)
    placeholders, _ = read_cluster(room_kept=False)
    assert (placeholders.warm_slots_ready, placeholders.idle_slots) == (2, 3)


def test_a_failing_reader_fails_the_read_and_the_first_in_order_is_raised():
    with pytest.raises(PermanentError, match="budget"):
        read_cluster({"budget": PermanentError("budget")})
    with pytest.raises(TransientError, match="warm"):
        read_cluster({"budget": PermanentError("budget"), "warm": TransientError("warm")})
    with pytest.raises(TransientError, match="events"):
        read_cluster({"budget": PermanentError("budget"), "events": TransientError("events")})


def test_a_terminating_pod_is_not_a_ready_replica_while_the_status_still_counts_it():
    """The last replica going to zero: deleted, still Ready in its conditions and in the Deployment's status
    until the ReplicaSet's status is written. Counted Ready, it would release held requests to a draining pod."""
    going, new = pod("m-1", deleting=True), pod("m-2", ready=("False", 100.0))
    assert serving_replicas(1, [pod_facts(going)]) == 0
    assert serving_replicas(1, [pod_facts(going), pod_facts(new)]) == 0
    assert serving_replicas(2, [pod_facts(going), pod_facts(pod("m-3"))]) == 1
    assert serving_replicas(0, [pod_facts(going), pod_facts(pod("m-3"))]) == 0  # never above the status
    assert serving_replicas(3, [pod_facts(pod("m-3"))]) == 3  # nothing terminating: the status, as before

    kube = FakeKube(Barrier(1), {})
    workload = V1Deployment(spec=V1DeploymentSpec(replicas=0, selector=V1LabelSelector(match_labels={"app": "m"}),
                                                  template=V1PodTemplateSpec(spec=V1PodSpec(containers=[]))),
                            status=V1DeploymentStatus(ready_replicas=1))

    async def workload_read(name, namespace):
        return workload

    async def pods(namespace, label_selector):
        return NS(items=[going])

    kube.apps.read_namespaced_deployment, kube.core.list_namespaced_pod = workload_read, pods
    reader = ClusterReader(kube, namespace="llm", kind="Deployment", name="m")
    state = asyncio.run(asyncio.wait_for(reader.read(at(110.0).timestamp()), 5.0))
    assert (state.spec_replicas, state.ready_replicas) == (0, 0)
