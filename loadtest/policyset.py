"""The policies the benchmark compares, configured from one shared `SimConfig`, and the knob of each.

All of them size against the same replica capacity (`concurrency` slots) and the same bound on replicas.
The bound is at least `MIN_REPLICA_BOUND` and at least 1.25 x the busiest tick's need on the trace, so the
benchmark itself never caps a policy (`replica_bound`). The reactive baselines target 70 % of a replica's
slots by default (Knative's default target utilization; the same for the HPA and KEDA so the three differ
only in their algorithms). The predictive policy gets the SLO, the capacity and the cluster's nominal
start-up and node-provisioning times, and learns the rest online.

Knobs (what a user of each would turn, swept by `--frontier`): the target utilization of the HPA, KEDA and
KPA; the replica count of static; and for ours `capacity_ratio`, the multiple of what the queueing model
asks for that is provisioned.
"""

from __future__ import annotations

import math

import numpy as np

from autoscaler.sim.run import PolicyRun, SimConfig
from policies import PolicySpec, decide, initial_state
from policies.baselines import hpa, keda_prometheus, kpa, oracle

NAMES = ("predictive", "hpa", "kpa", "keda", "static", "clairvoyant")
# Run on request (--policies): the predictive policy with its warm pool switched off, for comparison.
EXTRA = ("predictive-no-warm",)
TARGET_UTILIZATION = 0.7
MIN_REPLICA_BOUND = 256
BOUND_OVER_PEAK = 1.25
KNOBS = {"predictive": "capacity_ratio", "hpa": "target_utilization", "kpa": "target_utilization",
         "keda": "target_utilization", "static": "replicas"}


# Fields of the predictive spec that describe the simulated world: a policy file may not contradict them.
WORLD = {"tick_s": "--tick-s", "replica_concurrency": "--concurrency", "slo_queue_wait_s": "--slo-s"}


def replica_bound(needed: np.ndarray) -> int:
    """The replica bound every policy shares: never below what the trace's busiest tick needs x 1.25."""
    return max(MIN_REPLICA_BOUND, math.ceil(BOUND_OVER_PEAK * int(needed.max(initial=0))))


def predictive_spec(config: SimConfig, overrides: dict | None = None, *,
                    max_replicas: int = MIN_REPLICA_BOUND) -> PolicySpec:
    """The predictive policy for the simulated cluster, with a policy file's (or flags') fields on top."""
    base = dict(
        min_replicas=1,
        max_replicas=max_replicas,
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


def policy(name: str, config: SimConfig, needed: np.ndarray, *, predictive: PolicySpec | None = None,
           max_replicas: int | None = None, knob: float | None = None) -> PolicyRun:
    """One policy, at its default setting or with its knob (see KNOBS) set to `knob`."""
    bound = max_replicas or replica_bound(needed)
    k = config.server.concurrency
    utilization = knob if knob is not None else TARGET_UTILIZATION
    target = k * utilization
    needed_t = tuple(min(int(x), bound) for x in needed)  # every policy shares the same bound
    ours = predictive or predictive_spec(config, max_replicas=bound)
    if name.startswith("predictive") and knob is not None:
        ours = ours.model_copy(update={"capacity_ratio": knob})
    if name == "predictive":
        return PolicyRun(name, ours, decide, initial_state())
    if name == "predictive-no-warm":
        return PolicyRun(name, ours.model_copy(update={"max_warm_slots": 0}), decide, initial_state())
    if name == "hpa":
        return PolicyRun(name, hpa.HpaSpec(target_per_pod=target, max_replicas=bound), hpa.decide, hpa.initial_state())
    if name == "kpa":
        spec = kpa.KpaSpec(container_concurrency=k, target_utilization_ratio=utilization, max_replicas=bound)
        return PolicyRun(name, spec, kpa.decide, kpa.initial_state())
    if name == "keda":
        return PolicyRun(name, keda_prometheus.keda_spec(target, max_replicas=bound), keda_prometheus.decide,
                         keda_prometheus.initial_state())
    if name == "static":
        replicas = (int(knob),) if knob is not None else needed_t
        spec = oracle.OracleSpec(needed=replicas, start_s=0.0, tick_s=config.tick_s, lead_s=0.0, static=True)
        return PolicyRun(name, spec, oracle.decide, oracle.initial_state())
    if name == "clairvoyant":
        spec = oracle.OracleSpec(needed=needed_t, start_s=0.0, tick_s=config.tick_s,
                                 lead_s=config.cluster.worst_cold_start_s)
        return PolicyRun(name, spec, oracle.decide, oracle.initial_state())
    raise ValueError(f"unknown policy {name!r}; choose from {list(NAMES + EXTRA)}")


def build(config: SimConfig, needed: np.ndarray, names: tuple[str, ...] = NAMES, *,
          predictive: PolicySpec | None = None, max_replicas: int | None = None) -> list[PolicyRun]:
    unknown = set(names) - set(NAMES + EXTRA)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; choose from {list(NAMES + EXTRA)}")
    return [policy(name, config, needed, predictive=predictive, max_replicas=max_replicas) for name in names]
