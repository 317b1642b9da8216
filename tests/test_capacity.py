"""The capacity model's pure parts: a replica's shape, whole-replica room, and a Kueue ClusterQueue's budget."""

from decimal import Decimal

from kubernetes_asyncio.client import (V1Affinity, V1Container, V1Node, V1NodeAffinity, V1NodeCondition, V1NodeSelector,
                                       V1NodeSelectorRequirement, V1NodeSelectorTerm, V1NodeSpec, V1NodeStatus,
                                       V1ObjectMeta, V1PodSpec, V1PodTemplateSpec, V1ResourceRequirements, V1Taint,
                                       V1Toleration)

from autoscaler.kube.budget import kueue_gpus
from autoscaler.kube.capacity import node_admits, replica_shape


def template(requests, **spec):
    container = V1Container(name="vllm", resources=V1ResourceRequirements(requests=requests, limits=requests))
    return V1PodTemplateSpec(spec=V1PodSpec(containers=[container], **spec))


def node(labels=None, taints=None, ready="True", unschedulable=None):
    return V1Node(metadata=V1ObjectMeta(name="n", labels=labels or {}),
                  spec=V1NodeSpec(taints=taints, unschedulable=unschedulable),
                  status=V1NodeStatus(conditions=[V1NodeCondition(type="Ready", status=ready)]))


def test_the_shape_names_the_gpu_or_mig_resource_and_counts_whole_replicas():
    shape = replica_shape(template({"nvidia.com/gpu": "4", "cpu": "8"}))
    assert shape.gpu_resource == "nvidia.com/gpu" and shape.gpus == 4
    assert shape.fits({"nvidia.com/gpu": Decimal(6), "cpu": Decimal(64)}) == 1  # 2 GPUs left over: no use
    assert shape.fits({"nvidia.com/gpu": Decimal(8), "cpu": Decimal(12)}) == 1  # CPU binds
    mig = replica_shape(template({"nvidia.com/mig-3g.40gb": "1"}))
    assert mig.gpu_resource == "nvidia.com/mig-3g.40gb"
    assert replica_shape(template({"cpu": "1"})).gpu_resource is None


def test_a_node_admits_by_selector_taints_affinity_and_state():
    tainted = [V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]
    tolerant = dict(tolerations=[V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")])
    spec = template({"nvidia.com/gpu": "1"}, node_selector={"pool": "a"}, **tolerant).spec
    assert node_admits(node({"pool": "a"}, tainted), spec)
    assert not node_admits(node({"pool": "b"}, tainted), spec)
    intolerant = template({"nvidia.com/gpu": "1"}, node_selector={"pool": "a"}).spec
    assert not node_admits(node({"pool": "a"}, tainted), intolerant)
    assert not node_admits(node({"pool": "a"}, ready="False"), spec)
    assert not node_admits(node({"pool": "a"}, unschedulable=True), spec)
    clique = V1NodeSelectorRequirement(key="nvidia.com/gpu.clique", operator="In", values=["c1"])
    required = V1NodeSelector(node_selector_terms=[V1NodeSelectorTerm(match_expressions=[clique])])
    with_affinity = template({"nvidia.com/gpu": "8"}, affinity=V1Affinity(node_affinity=V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=required))).spec
    assert node_admits(node({"nvidia.com/gpu.clique": "c1"}), with_affinity)
    assert not node_admits(node({"nvidia.com/gpu.clique": "c2"}), with_affinity)


def queue(name, nominal, used, cohort="ml", borrowing=None, lending=None):
    gpu = {"name": "nvidia.com/gpu", "nominalQuota": nominal}
    gpu.update({k: v for k, v in (("borrowingLimit", borrowing), ("lendingLimit", lending)) if v is not None})
    return {"metadata": {"name": name},
            "spec": {"cohort": cohort, "resourceGroups": [{"flavors": [{"name": "h100", "resources": [gpu]}]}]},
            "status": {"flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": used}]}]}}


def test_a_cluster_queue_budget_is_nominal_plus_what_the_cohort_may_lend_less_others_use():
    ours = queue("a", 16, used=12)
    peers = [ours, queue("b", 8, used=2, lending=4), queue("c", 8, used=8), queue("d", 50, used=0, cohort="other")]
    gpus, why = kueue_gpus(ours, peers, "nvidia.com/gpu", Decimal(8))
    assert gpus == 16 + 4 - 4  # b lends 4 of its 6 unused, c has nothing unused, d is in another cohort
    assert why == "ClusterQueue a: 16 nvidia.com/gpu nominal + 4 the cohort may lend - 4 used by others = 16"
    capped, _ = kueue_gpus(queue("a", 16, used=12, borrowing=1), peers, "nvidia.com/gpu", Decimal(8))
    assert capped == 16 + 1 - 4
    alone, _ = kueue_gpus(queue("a", 16, used=12, cohort=None), peers, "nvidia.com/gpu", Decimal(8))
    assert alone == 16 - 4
    none, why = kueue_gpus(ours, peers, "nvidia.com/mig-1g.10gb", Decimal(0))
    assert none == 0 and "no quota for nvidia.com/mig-1g.10gb" in why


def test_required_pod_rules_never_count_a_slot_the_scheduler_would_refuse():
    """4-GPU replicas, two 8-GPU nodes, one replica on node a. Without rules: 1 + 2 idle slots. One replica per
    node (anti-affinity by host on its own label): 0 on a, 1 on b. Anti-affinity over a clique, or required
    pod affinity: not evaluated, so no idle slot is counted (the lead time only gets longer)."""
    from kubernetes_asyncio.client import (V1LabelSelector, V1ObjectMeta as Meta, V1Pod, V1PodAffinity,
                                           V1PodAffinityTerm, V1PodAntiAffinity)

    from autoscaler.kube.capacity import node_room

    def gpu_node(name):
        n = node({"pool": "p"})
        n.metadata = Meta(name=name, labels={"pool": "p"})
        n.status.allocatable = {"nvidia.com/gpu": "8"}
        return n

    def replica(where, labels):
        spec = template({"nvidia.com/gpu": "4"}).spec
        spec.node_name = where
        return V1Pod(metadata=Meta(name=f"r-{where}", namespace="ml", labels=labels), spec=spec)

    def shaped(affinity=None):
        t = template({"nvidia.com/gpu": "4"}, affinity=affinity)
        t.metadata = Meta(labels={"app": "model"})
        return t

    nodes, pods = [gpu_node("a"), gpu_node("b")], [replica("a", {"app": "model"})]

    def idle(t, running=pods):
        return node_room(nodes, running, t, replica_shape(t), namespace="ml").idle_slots

    def term(key, app="model"):
        return V1PodAffinityTerm(topology_key=key, label_selector=V1LabelSelector(match_labels={"app": app}))

    assert idle(shaped()) == 3
    one_per_node = V1Affinity(pod_anti_affinity=V1PodAntiAffinity(
        required_during_scheduling_ignored_during_execution=[term("kubernetes.io/hostname")]))
    assert idle(shaped(one_per_node)) == 1
    assert idle(shaped(one_per_node), [replica("a", {"app": "other"})]) == 2  # a's pod is not one it names
    away_from_batch = V1Affinity(pod_anti_affinity=V1PodAntiAffinity(
        required_during_scheduling_ignored_during_execution=[term("kubernetes.io/hostname", app="batch")]))
    assert idle(shaped(away_from_batch), [replica("a", {"app": "batch"})]) == 2  # b only, both its slots
    per_clique = V1Affinity(pod_anti_affinity=V1PodAntiAffinity(
        required_during_scheduling_ignored_during_execution=[term("nvidia.com/gpu.clique")]))
    assert idle(shaped(per_clique)) == 0
    together = V1Affinity(pod_affinity=V1PodAffinity(
        required_during_scheduling_ignored_during_execution=[term("kubernetes.io/hostname")]))
    assert idle(shaped(together)) == 0


def test_the_nodes_usage_is_computed_once_per_list_of_pods():
    """The fleet's cache hands every model the same list while the pods are unchanged: one computation."""
    from types import SimpleNamespace as NS

    from autoscaler.kube.capacity import node_usage

    def pod(node):
        return NS(spec=NS(node_name=node, containers=[NS(resources=NS(requests={"nvidia.com/gpu": "4"}, limits=None))],
                          init_containers=None, overhead=None))

    pods = [pod("a"), pod("a"), pod("b")]
    first = node_usage(pods)
    assert node_usage(pods) is first
    assert {n: {k: int(v) for k, v in used.items()} for n, used in first.used.items()} == \
        {"a": {"nvidia.com/gpu": 8}, "b": {"nvidia.com/gpu": 4}}
    again = node_usage(list(pods))  # another list (another read): computed again
    assert again is not first and again.used == first.used
