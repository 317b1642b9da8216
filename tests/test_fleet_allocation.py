"""The fleet decision inside the fleet controller (autoscaler/fleet/allocation.py): every model decides, the
fleet decides together on one GPU cap, every model is applied with its allocation. On a real kube-apiserver
with the fleet controller's own test scaffolding (tests/test_fleet.py); and the step's safe holds alone."""

import asyncio

from autoscaler.signals.prometheus import QueryResult
from kubernetes_asyncio.client import V1Container, V1PodSpec, V1PodTemplateSpec, V1ResourceRequirements

from autoscaler.fleet.allocation import FleetStep, Member
from autoscaler.loop import Decided
from policies import ClusterState, Decision, Sample, Signals
from policies.fleet import Budgets

from test_fleet import Hub, Running, create, crd, fleet_settings, objects_path, replicas  # noqa: F401 - crd


def test_two_tiers_under_a_fleet_gpu_cap_the_top_tier_keeps_its_replicas_the_lower_is_capped(
        cluster, crd, namespace):  # noqa: F811 - the fixture
    """Both models ask for 4 one-GPU replicas (64 requests in flight, 16 per replica); the fleet has 5 GPUs.
    Tier 0 keeps 4, tier 1 gets 1, and its status says CappedByBudget with the fleet's reason."""
    ns = namespace
    create(cluster, ns, ["top", "low"])
    for name, tier in (("top", 0), ("low", 1)):
        status, body = cluster.request("PATCH", objects_path(ns, name), {"spec": {"tier": tier}})
        assert status == 200, body
    hub = Hub({(ns, "top"): 64, (ns, "low"): 64})
    settings = fleet_settings(ns).model_copy(update={"capacity": fleet_settings(ns).capacity.model_copy(
        update={"max_gpus": 5})})

    async def go():
        async with Running(cluster, settings, hub) as run:
            fleet = run.fleet
            assert fleet.step is not None
            await fleet.tick()
            await fleet.tick()  # the same again: no flapping
            return {k[1]: m.decision for k, m in fleet.models.items()}

    decisions = asyncio.run(go())
    assert (replicas(cluster, ns, "top"), replicas(cluster, ns, "low")) == (4, 1)
    assert decisions["low"].capped_by_budget and not decisions["top"].capped_by_budget
    status = cluster.request("GET", objects_path(ns, "low"))[1]["status"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert status["replicas"] == 1 and conditions["CappedByBudget"] == "True"
    assert any(r.startswith("fleet: capped by fleet budget (5 GPUs): 1 of 4 replicas") for r in status["reasons"])
    top = cluster.request("GET", objects_path(ns, "top"))[1]["status"]
    assert top["replicas"] == 4 and {c["type"]: c["status"] for c in top["conditions"]}["CappedByBudget"] == "False"


def test_the_configured_level_order_is_the_fleet_decisions(cluster, crd, namespace):  # noqa: F811 - the fixture
    """The same two models and cap, with `fleet.decision.levels` naming tier 1's levels first: tier 1 keeps its
    4 replicas and tier 0 gets the one GPU left (its levels, not named, come after)."""
    ns = namespace
    create(cluster, ns, ["top", "low"])
    for name, tier in (("top", 0), ("low", 1)):
        assert cluster.request("PATCH", objects_path(ns, name), {"spec": {"tier": tier}})[0] == 200
    base = fleet_settings(ns)
    levels = [[1, c] for c in ("critical", "standard", "sheddable")]
    settings = base.model_copy(update={
        "capacity": base.capacity.model_copy(update={"max_gpus": 5}),
        "fleet": base.fleet.model_validate({**base.fleet.model_dump(), "decision": {"levels": levels}})})

    async def go():
        async with Running(cluster, settings, Hub({(ns, "top"): 64, (ns, "low"): 64})) as run:
            await run.fleet.tick()

    asyncio.run(go())
    assert (replicas(cluster, ns, "top"), replicas(cluster, ns, "low")) == (1, 4)


class RateHub(Hub):
    """The test's in-flight requests, and as many arriving per second (1 s each): enough for a growth risk."""

    def source(self, key):
        hub = self

        class Source:
            async def collect(self, now):
                value = hub.in_flight[key]
                return QueryResult(samples={"in_flight": Sample(value, now), "queue_depth": Sample(0.0, now),
                                            "arrival_rate_per_s": Sample(value, now),
                                            "service_time_s": Sample(1.0, now)})

        return Source()


def two_pooling_models(cluster, ns):
    """Models "a" and "b", each needing 2 warm slots alone at 5 replicas (+50 % growth), the placeholders'
    PriorityClass, and the fleet's settings: 13 GPUs, the warm pool pooled in `ns`."""
    create(cluster, ns, ["a", "b"], warm_growth_min_ratio=0.5)
    base = fleet_settings(ns)
    status, body = cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                   {"metadata": {"name": base.warm_pool.priority_class}, "value": -5})
    assert status in (201, 409), body
    return base.model_copy(update={
        "capacity": base.capacity.model_copy(update={"max_gpus": 13}),
        "warm_pool": base.warm_pool.model_copy(update={"enabled": True}),
        "fleet": base.fleet.model_copy(update={"lease_namespace": ns})})


def test_warm_slots_are_pooled_for_the_fleet_in_one_placeholder_set_per_shape(cluster, crd, namespace):  # noqa: F811
    """Two models each needing 2 warm slots alone (+50 % growth of 5 replicas), one fleet of 13 GPUs: the
    pooled 1-GPU placeholders are ceil(sqrt(2^2 + 2^2)) = 3, not 4, in the controller's namespace, and the
    models keep none of their own. Once the placeholders are Ready, the models' readers count them: their
    lead time drops the node provisioning."""
    ns = namespace
    settings = two_pooling_models(cluster, ns)

    async def go():
        async with Running(cluster, settings, RateHub({(ns, "a"): 64, (ns, "b"): 64})) as run:
            await run.fleet.tick()
            first = {k[1]: m.decision for k, m in run.fleet.models.items()}
            pooled = run.fleet.step.pooled
            await until_async(lambda: pooled.ready(), lambda r: r.get(1) == 3)
            await asyncio.sleep(pooled.ready_ttl_s)
            await run.fleet.tick()
            return first, {k[1]: m.decision for k, m in run.fleet.models.items()}

    decisions, later = asyncio.run(go())
    listed = cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments")[1]["items"]
    sizes = {d["metadata"]["name"]: d["spec"]["replicas"] for d in listed}
    assert sizes == {"a": 5, "b": 5, "fleet-warm-1gpu": 3}  # no placeholders of the models' own
    # the models' readers see the pooled slots: no node provisioning in their lead time any more
    assert all(d.lead_time_s >= 300 for d in decisions.values()), decisions
    assert all(d.lead_time_s < 300 for d in later.values()), later
    for decision in decisions.values():
        assert decision.warm_slots == 0
        assert any("2 slots beyond 5 replicas" in r for r in decision.reasons)  # its own need, alone
        assert any(r.startswith("fleet: warm pool: ") and "of the 3 pooled 1-GPU slots" in r
                   for r in decision.reasons)


async def until_async(read, done, timeout_s=30.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not done(value := await read()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out at {value}"
        await asyncio.sleep(0.25)
    return value


def template(gpus: str):
    return V1PodTemplateSpec(spec=V1PodSpec(containers=[V1Container(name="m", resources=V1ResourceRequirements(
        requests={"nvidia.com/gpu": gpus}))]))


def decided(decision: Decision, *, spec_replicas: int) -> Decided:
    cluster = ClusterState(spec_replicas=spec_replicas, ready_replicas=spec_replicas, starting_replicas=0, at_s=0.0)
    return Decided(0.0, Signals(cluster=cluster), decision)


def test_a_holding_model_keeps_what_it_holds_and_a_model_without_whole_gpus_is_held():
    """"held" cannot decide (invalid): its 3 current replicas still count, so "busy" gets the other 3 of 6 GPUs
    and "held" stays invalid (nothing applied). "cpu" requests no GPU: held, with the reason, left out."""
    step = FleetStep(budgets=Budgets(fleet_gpus=6))
    out = step.decide([
        Member(("a", "held"), decided(Decision(replicas=0, valid=False, reasons=("signals missing",)),
                                       spec_replicas=3),
               template("1"), tier=1),
        Member(("a", "busy"), decided(Decision(replicas=10), spec_replicas=2), template("1"), tier=1),
        Member(("a", "cpu"), decided(Decision(replicas=2), spec_replicas=2), template("0")),
    ])
    assert out[("a", "busy")].decision.replicas == 3 and out[("a", "busy")].decision.capped_by_budget
    assert not out[("a", "held")].decision.valid
    assert not out[("a", "cpu")].decision.valid
    assert "fleet: held: the fleet decision refused its input" in out[("a", "cpu")].decision.reasons[-1]


def test_a_models_min_replicas_is_guaranteed_so_the_actuators_floor_stays_within_the_cap():
    """3 GPUs; tier 0 wants 4, tier 1 wants 4 with min_replicas 1. Without the floor the fleet gives tier 1
    nothing and its actuator would raise it to 1 anyway (4 GPUs held); with it, 2 and 1."""
    step = FleetStep(budgets=Budgets(fleet_gpus=3))
    out = step.decide([
        Member(("a", "top"), decided(Decision(replicas=4), spec_replicas=1), template("1"), tier=0, min_replicas=1),
        Member(("a", "low"), decided(Decision(replicas=4), spec_replicas=1), template("1"), tier=1, min_replicas=1),
    ])
    assert (out[("a", "top")].decision.replicas, out[("a", "low")].decision.replicas) == (2, 1)
