"""The rules of measurement, in one place: the class targets, what a run is billed, the floor, and a run's
figures. The benchmark (`bench`), its frontiers (`frontier`) and the closed loop (`e2e`) all measure with
these; what a tick needs is the simulator's (`autoscaler.sim.ticks`), sized by the policy's own rule.

Targets: the highest class that is never shed meets its SLO for 99.9 % of requests, the other classes that
are never shed for 99 %, and at most 5 % of a sheddable class is shed.

Billing: replica GPU-hours count what replicas and warm placeholders held and the slots of empty nodes, in
GPUs (a replica of N GPUs counts N); node GPU-hours count every GPU of every node while it exists. Policies
are compared on replica GPU-hours on one-GPU nodes, on node GPU-hours otherwise (a node is paid for whole).

The floor: every tick's demand served at the SLO with instant scaling and no start-up, provisioning or
rounding waste; a lower bound on GPU-hours.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from autoscaler.sim.cluster import ClusterModel, Costs
from autoscaler.sim.run import RunResult, SimConfig
from autoscaler.sim.ticks import tick_demand
from policies.queueing import servers_for

TOP_TARGET, OTHER_TARGET, MAX_SHED = 0.999, 0.99, 0.05


def targets(classes: tuple[str, ...], sheddable: tuple[str, ...]) -> dict[str, float]:
    """Attainment target per class that is never shed (highest first)."""
    kept = [c for c in classes if c not in sheddable]
    return {c: TOP_TARGET if i == 0 else OTHER_TARGET for i, c in enumerate(kept)}


def margins(row: dict, classes: tuple[str, ...], sheddable: tuple[str, ...]) -> list[float]:
    """Each target's margin, smallest first: attainment - target per kept class, `MAX_SHED` - shed per
    sheddable class (negative: outside). Rows compare by their tightest margin, ties by the next."""
    a = row["slo_attainment"]
    parts = [a[c] - t for c, t in targets(classes, sheddable).items()]
    return sorted(parts + [MAX_SHED - row["shed_by_class"][c] for c in sheddable])


def margin(row: dict, classes: tuple[str, ...], sheddable: tuple[str, ...]) -> float:
    """How far a row of figures is inside the targets (negative: how far outside), in attainment units: the
    smallest of attainment - target and `MAX_SHED` - shed."""
    return min(margins(row, classes, sheddable), default=0.0)


def meets(row: dict, classes: tuple[str, ...], sheddable: tuple[str, ...]) -> bool:
    return margin(row, classes, sheddable) >= 0


def billed(cluster: ClusterModel) -> tuple[str, str]:
    """What policies are compared on (a row's key) and its unit: GPU-hours of the replicas on one-GPU nodes,
    else node GPU-hours (a node is paid for all its GPUs, used or not, until it is removed)."""
    return ("node_gpu_hours", "node GPU-h") if cluster.gpus_per_node > 1 else ("gpu_hours", "GPU-h")


def warm_pool_gpu_hours(costs: Costs) -> float:
    """GPU-hours the warm placeholders held: replica-shaped, so N GPUs each."""
    return costs.warm_pool_s * costs.gpus_per_replica / 3600.0


def floor_gpu_hours(workload, config: SimConfig) -> float:
    """A lower bound on GPU-hours: every tick's demand served at the SLO (the Erlang C slots its arrival
    rate needs at its mean service time), with no start-up, provisioning or rounding waste: fractional
    replicas, ready the instant they are needed, of `gpus_per_replica` GPUs each. What perfect, instant
    scaling would cost (in replica GPU-hours: no node is ever partly used)."""
    rates, services = tick_demand(workload, config.tick_s, seed=config.arrival_seed)
    cache: dict[tuple[float, float], int] = {}
    slots = 0.0
    for rate, service in zip(rates, services):
        key = (round(float(rate), 3), round(float(service), 3))
        if key not in cache:
            cache[key] = servers_for(rate_per_s=key[0], service_s=key[1], wait_s=config.slo_s,
                                     miss_ratio=config.miss_ratio)
        slots += cache[key]
    return slots / config.server.concurrency * config.tick_s / 3600.0 * config.cluster.gpus_per_replica


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def figures(result: RunResult, clairvoyant_gpu_hours: float | None, *, gpu_hour_price: float = 1.0) -> dict:
    """One run's row: attainment, waits, GPU-hours by both measures, cost, shedding, time to capacity."""
    costs = result.costs
    gpu = costs.replica_gpu_hours
    return {
        "policy": result.policy,
        "slo_attainment": {c: round(v, 5) for c, v in result.outcome["slo_attainment"].items()},
        "p99_queue_wait_s": round(result.outcome["p99_queue_wait_s"], 3),
        "gpu_hours": round(gpu, 3),
        "gpu_hours_vs_clairvoyant": round(gpu / clairvoyant_gpu_hours, 3) if clairvoyant_gpu_hours else None,
        "shed_fraction": round(result.outcome["shed_fraction"], 5),
        "shed_by_class": {c: round(v, 5) for c, v in result.outcome["shed_by_class"].items()},
        "shed_time_s": result.outcome["shed_time_s"],
        "warm_pool_gpu_hours": round(warm_pool_gpu_hours(costs), 3),
        "node_hours": round(costs.node_hours, 3),
        "node_gpu_hours": round(costs.node_gpu_hours, 3),
        "cost": round(costs.node_gpu_hours * gpu_hour_price, 3),
        "time_to_capacity_s": {"p50": _percentile(result.capacity_lags_s, 50),
                               "p95": _percentile(result.capacity_lags_s, 95)},
        "scaling_actions": result.scaling_actions,
        # Placeholders created (new_nodes: of them, those that requested a node), deleted (the pool shrank) and
        # preempted by replicas: the warm pool's churn.
        "warm_churn": asdict(result.warm_churn),
        "wall_s": round(result.wall_s, 2),
        **({"hold": result.outcome["hold"]} if "hold" in result.outcome else {}),
        **({"drain": result.outcome["drain"]} if "drain" in result.outcome else {}),
    }
