"""Warm slots in the fleet controller. The per-model `autoscaler_warm_slots` gauge and the ModelAutoscaler's
status `warmSlots` with pooled warm capacity: each model's share of the pooled slots (its decision's own
`warm_slots` is 0, since it writes no placeholder of its own), on a real kube-apiserver with the fleet
controller's test scaffolding (tests/test_fleet.py). And the drain the fleet step reads from each model's pod
template, which ranks a higher tier's warm slots before a lower tier's replicas when the budget binds
(policies/fleet.py)."""

import asyncio
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.fleet.allocation import FleetStep
from autoscaler.fleet.model import ReclaimableView
from autoscaler.loop import Decided
from policies import ClusterState, Decision, PolicySpec, Sample, Signals, decide, initial_state
from policies.fleet import Budgets, FleetSpec

from test_fleet import Running, crd, objects_path  # noqa: F401 - crd: the fixture
from test_fleet_allocation import RateHub, template, two_pooling_models

TIER = FleetSpec(warm_after="tier")  # the early-warm-slot rule, asked for


def scraped_warm_slots(registry) -> dict[str, float]:
    """`autoscaler_warm_slots` per model, as Prometheus scrapes the fleet's /metrics."""
    text = generate_latest(registry).decode()
    return {s.labels["model_autoscaler"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "autoscaler_warm_slots"}


def test_each_models_warm_slots_gauge_and_status_are_its_share_of_the_pooled_slots(cluster, crd, namespace):  # noqa: F811
    """Two models each needing 2 warm slots alone pool 3 (ceil(sqrt(8))): the gauges and the objects' status
    `warmSlots` read 2 and 1, their shares of the pool, not 0."""
    ns = namespace
    settings = two_pooling_models(cluster, ns)

    async def go():
        async with Running(cluster, settings, RateHub({(ns, "a"): 64, (ns, "b"): 64})) as run:
            await run.fleet.tick()
            shares = {k[1]: run.fleet.step.last.models[f"{k[0]}/{k[1]}"].warm_slots for k in run.fleet.models}
            # each model's cluster reader is the fleet's view (lower tiers' reclaimable GPUs as idle slots)
            assert all(isinstance(m.controller.cluster, ReclaimableView) for m in run.fleet.models.values())
            return shares, {k[1]: m.decision.warm_slots for k, m in run.fleet.models.items()}, \
                scraped_warm_slots(run.fleet.metrics.registry)

    shares, own, scraped = asyncio.run(go())
    assert sorted(shares.values()) == [1, 2] and own == {"a": 0, "b": 0}
    assert scraped == {name: float(n) for name, n in shares.items()}
    status = {name: cluster.request("GET", objects_path(ns, name))[1]["status"]["warmSlots"] for name in shares}
    assert status == shares


def model_at(replicas: int, *, warm: int, grace_s: int | None, rates: dict[str, float] | None = None):
    """A model's controller as the fleet step reads it (its pod template, its policy) and its decision."""
    pod = template("1")
    pod.spec.termination_grace_period_seconds = grace_s

    async def pod_template():
        return pod

    controller = SimpleNamespace(cluster=SimpleNamespace(pod_template=pod_template),
                                 settings=SimpleNamespace(policy=SimpleNamespace(idle_after_s=None, min_replicas=0)))
    cluster = ClusterState(spec_replicas=replicas, ready_replicas=replicas, starting_replicas=0, at_s=0.0)
    # a pooled slot free: the lead time is the 20-s start-up; the warm need covers 120 s of node provisioning
    decision = Decision(replicas=replicas, warm_slots=warm, lead_time_s=20.0, node_provisioning_s=120.0)
    return controller, Decided(0.0, Signals(cluster=cluster, arrival_rate_by_priority=rates or {}), decision)


def test_a_lower_tiers_grace_period_ranks_the_top_tiers_warm_slot_before_its_replicas():
    """10 GPUs; "top" (tier 0) wants 6 and its growth risk over its 120-s node provisioning is 4 slots; "low"
    (tier 2) wants 6. A reclaim of low's GPUs waits for its pods' 30-s grace period, so ceil(4 x 30 / 120) = 1
    slot is top's before low's replicas: low gets 3. With a grace period of 0, low gets all 4 GPUs left. The
    rule is asked for (`warm_after="tier"`); by default warm slots rank after every replica: low gets 4."""
    def run(grace_s, spec=TIER):
        models = {("ns", "top"): model_at(6, warm=4, grace_s=None), ("ns", "low"): model_at(6, warm=0, grace_s=grace_s)}
        objects = {("ns", name): SimpleNamespace(tier=tier, weight=1.0) for name, tier in (("top", 0), ("low", 2))}
        step = FleetStep(budgets=Budgets(fleet_gpus=10), spec=spec)
        out = asyncio.run(step.run({k: d for k, (_, d) in models.items()}, controllers={k: c for k, (c, _) in
                                   models.items()}, objects=objects, write_pool=False))
        return out[("ns", "low")].decision, step.last

    low, fleet = run(30)
    assert low.replicas == 3 and fleet.warm_by_shape == {1: 1}
    assert any(r.startswith("fleet: 1 warm slot for tier 0 before tier 2's replicas") for r in low.reasons)
    low, fleet = run(0)
    assert low.replicas == 4 and fleet.warm_by_shape == {1: 0}
    low, fleet = run(30, spec=None)
    assert low.replicas == 4 and fleet.warm_by_shape == {1: 0}


def test_a_top_tier_reads_the_lower_tiers_gpus_as_idle_slots_once_the_budget_binds():
    """10 GPUs, "top" (tier 0) at 6 and "low" (tier 2) at 4, half of low's arrivals sheddable: the budget
    binds, so top's cluster reader (the fleet's view) adds low's 2 sheddable replicas' GPUs to its idle slots
    on the next tick, and low's adds none. Its lead time then drops the node provisioning, as with a free
    slot: a reclaim needs no new node."""
    half = {"critical": 1.0, "sheddable": 1.0}
    models = {("ns", "top"): model_at(6, warm=0, grace_s=None),
              ("ns", "low"): model_at(4, warm=0, grace_s=None, rates=half)}
    objects = {("ns", name): SimpleNamespace(tier=tier, weight=1.0) for name, tier in (("top", 0), ("low", 2))}
    step = FleetStep(budgets=Budgets(fleet_gpus=10))
    assert step.reclaimable(("ns", "top")) == 0  # before any fleet decision
    asyncio.run(step.run({k: d for k, (_, d) in models.items()}, controllers={k: c for k, (c, _) in models.items()},
                         objects=objects, write_pool=False))
    assert (step.reclaimable(("ns", "top")), step.reclaimable(("ns", "low"))) == (2, 0)

    class Inner:
        async def read(self, now):
            return ClusterState(spec_replicas=6, ready_replicas=6, starting_replicas=0, at_s=now)

        async def pod_template(self):
            return "template"

    top = ReclaimableView(Inner(), lambda: step.reclaimable(("ns", "top")))
    low = ReclaimableView(Inner(), lambda: step.reclaimable(("ns", "low")))
    assert asyncio.run(top.pod_template()) == "template"
    spec = PolicySpec(default_startup_s=120.0, node_provisioning_s=300.0)

    def lead_time_s(view):
        cluster = asyncio.run(view.read(0.0))
        signals = Signals(cluster=cluster, arrival_rate_per_s=Sample(1.0, 0.0), queue_depth=Sample(0.0, 0.0),
                          in_flight=Sample(8.0, 0.0))
        return cluster.idle_slots, decide(spec, initial_state(), signals, 0.0)[0].lead_time_s

    assert lead_time_s(top) == (2, 120.0) and lead_time_s(low) == (0, 420.0)
