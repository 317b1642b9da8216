"""The capacity model against a real kube-apiserver, scheduler and kwok nodes: whole-replica idle slots and warm
slots for 4-GPU replicas on 8-GPU nodes, MIG-sliced nodes, and GPU budgets from the config and from a Kueue
ClusterQueue (its CRDs defined here for the fields the controller reads)."""

import asyncio
import time

import pytest

from autoscaler.errors import PermanentError
from autoscaler.kube.budget import BudgetReader
from autoscaler.kube.capacity import NodeReader, replica_shape
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.warmpool import BUFFER_GROUP, BUFFER_PLURAL, BUFFER_VERSION, CapacityBufferPool, PlaceholderPool
from policies import PolicySpec, Sample, Signals, decide, initial_state

from loadtest.kube.controlplane import gpu_node, model_deployment

from helpers import tell_no_capacity, with_kube
from test_pooled_buffer import buffer_api  # noqa: F401 - the fixture



@pytest.fixture
def pool_nodes(cluster, namespace):
    """8-GPU kwok nodes only this test's pods select (label `pool` = the namespace), removed afterwards."""
    made = []

    def make(count=2, resources=None, instance_type="p4d.24xlarge"):
        for i in range(count):
            node = gpu_node(f"{namespace}-n{i}")
            node["metadata"]["labels"] = {"type": "kwok", "pool": namespace,
                                          "kubernetes.io/hostname": node["metadata"]["name"],
                                          "node.kubernetes.io/instance-type": instance_type}
            if resources:
                node["status"]["capacity"].update(resources)
                node["status"]["allocatable"].update(resources)
            status, body = cluster.request("POST", "/api/v1/nodes", node)
            assert status == 201, body
            made.append(node["metadata"]["name"])
        return made

    yield make
    for name in made:
        cluster.request("DELETE", f"/api/v1/nodes/{name}")


def deploy(cluster, ns, *, replicas, resource="nvidia.com/gpu", amount="4", labels=None, affinity=None):
    body = model_deployment(ns, "model", replicas)
    spec = body["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"pool": ns}
    if affinity:
        spec["affinity"] = affinity
    spec["containers"][0]["resources"] = {"limits": {resource: amount}, "requests": {resource: amount}}
    if labels:
        body["metadata"]["labels"] = {**body["metadata"]["labels"], **labels}
    status, created = cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert status == 201, created


async def until(read, done, tries=60):
    for _ in range(tries):
        state = await read()
        if done(state):
            return state
        await asyncio.sleep(0.5)
    return state


def collecting_waits(reader):
    """A read of the target's state that also collects every node wait it reports, and the list it fills."""
    waits = []

    async def read():
        state = await reader.read(time.time())
        waits.extend(state.node_waits_s)
        return state

    return read, waits


def read_with_budget(cluster, ns, *, ready, max_gpus=None):
    """The target's state, read with idle slots and a budget (Kueue followed), once `ready` replicas are."""
    async def go(kube):
        budget = BudgetReader(kube, namespace=ns, max_gpus=max_gpus, namespace_max_gpus=None, kueue=True,
                              kueue_version="v1beta1")
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", nodes=NodeReader(kube),
                               budget=budget)
        return await until(lambda: reader.read(time.time()), lambda s: s.ready_replicas == ready)

    return with_kube(cluster, go)


def test_four_gpu_replicas_on_eight_gpu_nodes_count_whole_replica_slots(cluster, namespace, pool_nodes):
    """3 replicas of 4 GPUs on two 8-GPU nodes: one node full, one with room for exactly one more replica. A
    warm placeholder takes that room whole; a second one finds no node that fits and waits for a new node."""
    ns = namespace
    pool_nodes()
    deploy(cluster, ns, replicas=3)
    status, _ = cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                {"metadata": {"name": f"placeholder-{ns}"}, "value": -5})
    assert status == 201

    async def go(kube):
        pool = PlaceholderPool(kube, namespace=ns, name="model-warm", priority_class=f"placeholder-{ns}",
                               pause_image="registry.k8s.io/pause:3.10", max_slots=4)
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", warm_pool=pool,
                               nodes=NodeReader(kube, prices={"p4d.24xlarge": 4.0, "default": 9.0}))
        placed = await until(lambda: reader.read(time.time()), lambda s: s.ready_replicas == 3)
        room = await NodeReader(kube).room(await reader.pod_template(), replica_shape(await reader.pod_template()))
        await pool.ensure(await reader.pod_template(), 2)
        warmed = await until(lambda: reader.read(time.time()), lambda s: s.warm_slots_ready == 1 and s.idle_slots == 0)
        await asyncio.sleep(2)  # the second placeholder stays Pending: no node has 4 GPUs free
        return placed, room, warmed, await reader.read(time.time())

    placed, room, warmed, later = with_kube(cluster, go)
    assert placed.ready_replicas == 3 and placed.idle_slots == 1
    assert placed.gpus_held == 12 and placed.gpu_cost_per_hour == 48.0  # 3 x 4 GPUs at 4.0 per GPU-hour
    assert room.per_node == {"p4d.24xlarge": 2}
    assert warmed.warm_slots_ready == 1 and warmed.idle_slots == 0 and warmed.gpus_held == 16  # with the placeholder
    assert later.warm_slots_ready == 1
    pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=inference-autoscaler/warm-pool")[1]
    assert sorted(bool(p["spec"].get("nodeName")) for p in pods["items"]) == [False, True]


def test_mig_sliced_nodes_count_slices_and_budget_in_slices(cluster, namespace, pool_nodes):
    """Nodes cut into seven 1g.10gb MIG slices: a replica of one slice is the unit of room and of budget."""
    ns = namespace
    mig = "nvidia.com/mig-1g.10gb"
    pool_nodes(count=1, resources={mig: "7", "nvidia.com/gpu": "0"}, instance_type="a100-mig")
    deploy(cluster, ns, replicas=2, resource=mig, amount="1")

    state = read_with_budget(cluster, ns, ready=2, max_gpus=3)
    assert state.idle_slots == 5
    assert state.budget_replicas == 3 and "capacity.max_gpus 3 nvidia.com/mig-1g.10gb" in state.budget_reason


KUEUE_CRDS = [("localqueues", "LocalQueue", "Namespaced"), ("clusterqueues", "ClusterQueue", "Cluster")]


def kueue_crds(cluster):
    names = []
    for plural, kind, scope in KUEUE_CRDS:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
            "spec": {"group": "kueue.x-k8s.io", "scope": scope,
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                     "versions": [{"name": "v1beta1", "served": True, "storage": True,
                                   "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]},
        }
        status, body = cluster.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        assert status in (201, 409), body
        names.append(crd["metadata"]["name"])
    cluster.wait_established(names)


def cluster_queue(name, *, nominal, cohort, used, borrowing=None, lending=None):
    gpu = {"name": "nvidia.com/gpu", "nominalQuota": nominal}
    if borrowing is not None:
        gpu["borrowingLimit"] = borrowing
    if lending is not None:
        gpu["lendingLimit"] = lending
    return ({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name},
             "spec": {"cohort": cohort, "namespaceSelector": {},
                      "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                          "flavors": [{"name": "h100", "resources": [gpu]}]}]}},
            {"flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": used,
                                                              "borrowed": 0}]}]})


def test_a_kueue_cluster_queue_caps_the_decision_and_sheds_by_priority(cluster, namespace, pool_nodes):
    """team-a: 8 nominal GPUs, borrowing up to 4; its cohort peer team-b has 8 nominal, 2 used, lends up to 6.
    team-a uses 8: 4 by this model's one replica, 4 by others. Budget: 8 + min(6, 4) - 4 = 8 GPUs = 2 replicas
    of 4. Demand for far more: the decision orders 2, says "capped by quota" naming the ClusterQueue, and sheds
    the lowest priority."""
    ns = namespace
    pool_nodes()
    kueue_crds(cluster)
    suffix = ns.replace("-", "")
    for name, kwargs in ((f"team-a-{suffix}", dict(nominal=8, cohort=suffix, used=8, borrowing=4)),
                         (f"team-b-{suffix}", dict(nominal=8, cohort=suffix, used=2, lending=6)),
                         (f"other-{suffix}", dict(nominal=100, cohort="elsewhere", used=0))):
        document, status_body = cluster_queue(name, **kwargs)
        created = cluster.apply(document)
        created["status"] = status_body
        status, body = cluster.request("PUT", f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/{name}/status", created)
        assert status == 200, body
    local = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
             "metadata": {"name": "models", "namespace": ns}, "spec": {"clusterQueue": f"team-a-{suffix}"}}
    cluster.apply(local, namespace=ns)
    deploy(cluster, ns, replicas=1, labels={"kueue.x-k8s.io/queue-name": "models"})

    state = read_with_budget(cluster, ns, ready=1)
    assert state.budget_replicas == 2
    assert state.budget_reason.startswith(f"ClusterQueue team-a-{suffix}: 8 nvidia.com/gpu nominal + 4 the cohort "
                                          f"may lend - 4 used by others = 8")
    spec = PolicySpec(replica_concurrency=8, max_replicas=20)
    now = state.at_s
    rates = {"critical": 20.0, "standard": 40.0, "sheddable": 40.0}
    signals = Signals(cluster=state, arrival_rate_per_s=Sample(100.0, now), in_flight=Sample(8.0, now),
                      queue_depth=Sample(50.0, now), service_time_s=Sample(1.0, now), arrival_rate_by_priority=rates)
    decision, _ = decide(spec, initial_state(), signals, now)
    assert decision.replicas == 2 and decision.capped_by_budget and decision.warm_slots == 0
    assert any(r.startswith("capped by quota: 2 replicas") and f"ClusterQueue team-a-{suffix}" in r
               for r in decision.reasons)
    assert decision.shed["sheddable"] > 0


def test_a_namespace_cap_counts_other_pods_and_a_missing_local_queue_holds(cluster, namespace, pool_nodes):
    ns = namespace
    pool_nodes()
    deploy(cluster, ns, replicas=1, labels={"kueue.x-k8s.io/queue-name": "nowhere"})
    other = model_deployment(ns, "batch", 1)
    other["spec"]["template"]["spec"]["nodeSelector"] = {"pool": ns}
    other["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"},
                                                                       "requests": {"nvidia.com/gpu": "2"}}
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", other)[0] == 201

    async def go(kube):
        capped = BudgetReader(kube, namespace=ns, max_gpus=None, namespace_max_gpus=12, kueue=False,
                              kueue_version="v1beta1")
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", budget=capped)
        state = await until(lambda: reader.read(time.time()), lambda s: s.ready_replicas == 1 and
                            s.budget_replicas == 2)
        queued = ClusterReader(kube, namespace=ns, kind="Deployment", name="model",
                               budget=BudgetReader(kube, namespace=ns, max_gpus=None, namespace_max_gpus=None,
                                                   kueue=True, kueue_version="v1beta1"))
        try:
            await queued.read(time.time())
        except PermanentError as exc:
            return state, str(exc)
        return state, None

    state, error = with_kube(cluster, go)
    assert state.budget_replicas == 2  # (12 - 2 used by the batch pod) // 4
    assert "- 2 used by other pods" in state.budget_reason
    assert error is not None and "LocalQueue" in error and "nowhere" in error


def test_a_pod_that_waited_for_a_new_node_teaches_node_provisioning_by_node_type(cluster, namespace, pool_nodes):
    """No node fits the replica at first, so its pod waits; a g6e.12xlarge node (8 GPUs) is added 3 s later and
    the scheduler places the pod there. That wait is learned with the node's type. The second replica lands on
    room the node already had and teaches nothing; a restarted controller (a fresh reader) gets the wait back."""
    ns = namespace
    deploy(cluster, ns, replicas=1)

    async def go(kube):
        read, waits = collecting_waits(ClusterReader(kube, namespace=ns, kind="Deployment", name="model"))

        await until(read, lambda s: s.unschedulable_pods == 1)
        await asyncio.sleep(3)
        pool_nodes(count=1, instance_type="g6e.12xlarge")
        await until(read, lambda s: s.ready_replicas == 1)
        first = list(waits)
        status, _ = cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model",
                                    {"spec": {"replicas": 2}})
        assert status == 200
        await until(read, lambda s: s.ready_replicas == 2)
        restarted = ClusterReader(kube, namespace=ns, kind="Deployment", name="model")
        return first, list(waits), (await restarted.read(time.time())).node_waits_s

    first, after_second, restarted = with_kube(cluster, go)
    assert len(first) == 1 and first[0][0] == "g6e.12xlarge" and 3.0 <= first[0][1] <= 30.0, first
    assert after_second == first  # the second pod found room on a node that was there before it
    assert list(restarted) == first


def test_one_replica_per_node_counts_one_slot_per_free_node_as_the_scheduler_does(cluster, namespace, pool_nodes):
    """Required anti-affinity by host on the replica's own label: two 8-GPU nodes, one 4-GPU replica. The idle
    slots are 1 (not 3), and the scheduler agrees: of 3 replicas, the third stays Pending."""
    ns = namespace
    pool_nodes()
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "model"}}}]}}
    deploy(cluster, ns, replicas=1, affinity=apart)
    one = read_with_budget(cluster, ns, ready=1)
    assert one.idle_slots == 1
    status, _ = cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model", {"spec": {"replicas": 3}})
    assert status == 200

    async def go(kube):
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", nodes=NodeReader(kube))
        return await until(lambda: reader.read(time.time()), lambda s: s.ready_replicas == 2 and s.unschedulable_pods)

    full = with_kube(cluster, go)
    assert full.ready_replicas == 2 and full.unschedulable_pods == 1 and full.idle_slots == 0


def test_a_pod_a_provisioner_could_not_place_teaches_no_node_provisioning(cluster, namespace, pool_nodes):
    """The pod waits and Karpenter's Event says the NodePool's limit is reached; when a node comes later (the
    limit raised), the pod's wait was for the limit, not for a node's boot: nothing is learned from it."""
    ns = namespace
    deploy(cluster, ns, replicas=1)

    async def go(kube):
        read, waits = collecting_waits(ClusterReader(kube, namespace=ns, kind="Deployment", name="model"))

        await until(read, lambda s: s.unschedulable_pods == 1)
        [pod] = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"]
        tell_no_capacity(cluster, ns, pod["metadata"])
        told = await read()
        await asyncio.sleep(2)  # timestamps are in whole seconds: the node must be newer than the pod
        pool_nodes(count=1, instance_type="g6e.12xlarge")
        placed = await until(read, lambda s: s.ready_replicas == 1)
        return told, placed, waits

    told, placed, waits = with_kube(cluster, go)
    assert told.no_capacity_pods == 1 and placed.ready_replicas == 1
    assert waits == [], waits


def test_a_capacity_buffers_room_is_its_warm_slots_not_also_idle_slots(cluster, namespace, pool_nodes,
                                                                        buffer_api):  # noqa: F811 - the fixture
    """A model of 4-GPU replicas at 0, one empty 8-GPU node, a CapacityBuffer of 2 whose status says both fit
    on existing capacity (as Karpenter writes it): the node's room for 2 replicas is the buffer's, so 2 warm
    slots and no idle one (not 2 of each). The model's 2 replicas then take that room: while the status still
    says 2 (Karpenter's next look at the buffer is up to 30 s away; here nothing rewrites it), 0 warm slots."""
    ns = namespace
    pool_nodes(count=1)
    deploy(cluster, ns, replicas=0)
    fits = {"replicas": 2, "conditions": [{"type": "Provisioning", "status": "True", "reason": "Provisioned",
                                           "message": "fits", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}

    async def go(kube):
        pool = CapacityBufferPool(kube, namespace=ns, name="model-warm-pool", target_kind="Deployment",
                                  target="model", max_slots=4)
        reader = ClusterReader(kube, namespace=ns, kind="Deployment", name="model", warm_pool=pool,
                               nodes=NodeReader(kube))
        await pool.ensure(None, 2)
        path = f"/apis/{BUFFER_GROUP}/{BUFFER_VERSION}/namespaces/{ns}/{BUFFER_PLURAL}/model-warm-pool/status"
        assert cluster.request("PATCH", path, {"status": fits})[0] == 200
        kept = await reader.read(time.time())
        cluster.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/model", {"spec": {"replicas": 2}})
        taken = await until(lambda: reader.read(time.time()), lambda s: s.ready_replicas == 2)
        return kept, taken

    kept, taken = with_kube(cluster, go)
    assert (kept.warm_slots_ready, kept.idle_slots) == (2, 0)
    assert taken.ready_replicas == 2 and (taken.warm_slots_ready, taken.idle_slots) == (0, 0)
