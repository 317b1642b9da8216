"""The policies the benchmark compares, configured from one shared `SimConfig`.

All of them size against the same replica capacity (`concurrency` slots) and the same bounds. The reactive
baselines target 70 % of a replica's slots (Knative's default target utilization; the same value for the
HPA and KEDA so the three differ only in their algorithms). The predictive policy gets the SLO, the
capacity and the cluster's nominal start-up and node-provisioning times, and learns the rest online.
"""

from __future__ import annotations

import numpy as np

from autoscaler.sim.run import PolicyRun, SimConfig
from policies import PolicySpec, decide, initial_state
from policies.baselines import hpa, keda_prometheus, kpa, oracle

NAMES = ("predictive", "hpa", "kpa", "keda", "static", "clairvoyant")
# Run on request (--policies): the predictive policy with its warm pool switched off, for comparison.
EXTRA = ("predictive-no-warm",)
TARGET_UTILIZATION = 0.7
MAX_REPLICAS = 256


# Fields of the predictive spec that describe the simulated world: a policy file may not contradict them.
WORLD = {"tick_s": "--tick-s", "replica_concurrency": "--concurrency", "slo_queue_wait_s": "--slo-s"}


def predictive_spec(config: SimConfig, overrides: dict | None = None) -> PolicySpec:
    """The predictive policy for the simulated cluster, with a policy file's (or flags') fields on top."""
    base = dict(
        min_replicas=1,
        max_replicas=MAX_REPLICAS,
        tick_s=config.tick_s,
        replica_concurrency=config.server.concurrency,
        slo_queue_wait_s=config.slo_s,
        slo_miss_target_ratio=config.miss_ratio,
        p99_latency_target_s=config.slo_s,  # the simulator's p99 signal is the queue wait
        default_startup_s=config.cluster.startup_s,
        node_provisioning_s=config.cluster.node_provisioning_s,
    )
    overrides = dict(overrides or {})
    for name, flag in WORLD.items():
        if name in overrides and overrides[name] != base[name]:
            raise ValueError(f"the policy sets {name} = {overrides[name]}, the simulated cluster {base[name]} "
                             f"({flag}): make them agree")
    return PolicySpec(**{**base, **overrides})


def build(config: SimConfig, needed: np.ndarray, names: tuple[str, ...] = NAMES, *,
          predictive: PolicySpec | None = None) -> list[PolicyRun]:
    k = config.server.concurrency
    target = k * TARGET_UTILIZATION
    needed_t = tuple(min(int(x), MAX_REPLICAS) for x in needed)  # every policy shares the same bounds
    runs = {
        "predictive": lambda: PolicyRun("predictive", predictive or predictive_spec(config), decide, initial_state()),
        "predictive-no-warm": lambda: PolicyRun(
            "predictive-no-warm", (predictive or predictive_spec(config)).model_copy(update={"max_warm_slots": 0}),
            decide, initial_state(),
        ),
        "hpa": lambda: PolicyRun(
            "hpa", hpa.HpaSpec(target_per_pod=target, max_replicas=MAX_REPLICAS), hpa.decide, hpa.initial_state()
        ),
        "kpa": lambda: PolicyRun(
            "kpa",
            kpa.KpaSpec(container_concurrency=k, target_utilization_ratio=TARGET_UTILIZATION, max_replicas=MAX_REPLICAS),
            kpa.decide,
            kpa.initial_state(),
        ),
        "keda": lambda: PolicyRun(
            "keda", keda_prometheus.keda_spec(target, max_replicas=MAX_REPLICAS), keda_prometheus.decide,
            keda_prometheus.initial_state(),
        ),
        "static": lambda: PolicyRun(
            "static",
            oracle.OracleSpec(needed=needed_t, start_s=0.0, tick_s=config.tick_s, lead_s=0.0, static=True),
            oracle.decide,
            oracle.initial_state(),
        ),
        "clairvoyant": lambda: PolicyRun(
            "clairvoyant",
            oracle.OracleSpec(needed=needed_t, start_s=0.0, tick_s=config.tick_s, lead_s=config.cluster.worst_cold_start_s),
            oracle.decide,
            oracle.initial_state(),
        ),
    }
    unknown = set(names) - set(runs)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; choose from {list(NAMES + EXTRA)}")
    return [runs[name]() for name in names]
