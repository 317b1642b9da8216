"""The per-model `autoscaler_warm_slots` gauge in fleet mode with pooled warm capacity: each model's share of
the pooled slots (its decision's own `warm_slots` is 0, since it writes no placeholder of its own). On a real
kube-apiserver with the fleet controller's test scaffolding (tests/test_fleet.py)."""

import asyncio

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from test_fleet import Running, create, crd, fleet_settings  # noqa: F401 - crd: the fixture
from test_fleet_allocation import RateHub


def scraped_warm_slots(registry) -> dict[str, float]:
    """`autoscaler_warm_slots` per model, as Prometheus scrapes the fleet's /metrics."""
    text = generate_latest(registry).decode()
    return {s.labels["model_autoscaler"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "autoscaler_warm_slots"}


def test_each_models_warm_slots_gauge_is_its_share_of_the_pooled_slots(cluster, crd, namespace):  # noqa: F811
    """Two models each needing 2 warm slots alone pool 3 (ceil(sqrt(8))): the gauges read 2 and 1, their
    shares of the pool, not 0."""
    ns = namespace
    create(cluster, ns, ["a", "b"], warm_growth_min_ratio=0.5)
    status, body = cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                   {"metadata": {"name": fleet_settings(ns).warm_pool.priority_class}, "value": -5})
    assert status in (201, 409), body
    base = fleet_settings(ns)
    settings = base.model_copy(update={
        "capacity": base.capacity.model_copy(update={"max_gpus": 13}),
        "warm_pool": base.warm_pool.model_copy(update={"enabled": True}),
        "fleet": base.fleet.model_copy(update={"lease_namespace": ns})})

    async def go():
        async with Running(cluster, settings, RateHub({(ns, "a"): 64, (ns, "b"): 64})) as run:
            await run.fleet.tick()
            shares = {k[1]: run.fleet.step.last.models[f"{k[0]}/{k[1]}"].warm_slots for k in run.fleet.models}
            return shares, {k[1]: m.decision.warm_slots for k, m in run.fleet.models.items()}, \
                scraped_warm_slots(run.fleet.metrics.registry)

    shares, own, scraped = asyncio.run(go())
    assert sorted(shares.values()) == [1, 2] and own == {"a": 0, "b": 0}
    assert scraped == {name: float(n) for name, n in shares.items()}
