"""Drive one policy over one workload on the simulated cluster: a fold of `decide` over ticks.

Every tick: the cluster advances to `now`, the simulator reports the signals Prometheus and the Kubernetes
API would show, the policy decides, a valid decision is applied (replicas, warm slots, shed levels), and the
simulator serves the traffic of the next tick. All policies start from the same cluster: the replicas the
first lead-time of the workload truly needs, ready, on the cluster's shape (`ClusterModel.gpus_per_replica`,
`gpus_per_node`), in the one cluster model (`autoscaler.sim.cluster`), which the run reaches through its
`Cluster` protocol.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from autoscaler.sim.cluster import Cluster, ClusterModel, Costs, SimCluster, WarmChurn
from autoscaler.sim.dispatch import Dispatch
from autoscaler.sim.guard import Guard
from autoscaler.sim.rate import RateSim
from autoscaler.sim.request import RequestSim
from autoscaler.sim.ticks import replicas_for_rates, tick_demand, ticks
from autoscaler.sim.workload import RateWorkload, RequestWorkload, ServerModel
from autoscaler.timeline import timeline_row
from policies import PolicySpec


@dataclass(frozen=True)
class PolicyRun:
    name: str
    spec: Any
    decide: Callable
    state: Any


@dataclass(frozen=True)
class SimConfig:
    tick_s: float = 15.0
    slo_s: float = 2.0
    miss_ratio: float = 0.001
    arrival_seed: int = 5  # rate traces: the per-tick draw of each client's arrivals
    cluster: ClusterModel = field(default_factory=ClusterModel)
    server: ServerModel = field(default_factory=ServerModel)
    # Scale to zero: requests arriving while no replica is ready are held up to this long (sim/hold.py);
    # None: not modelled (no hold figures, no held_requests signal).
    max_hold_s: float | None = None
    # The model servers serve their queue by class, highest first (vLLM's --scheduling-policy priority);
    # request-level simulation only.
    server_priority: bool = False
    # How the gateway hands requests to replicas: "shared" (one queue feeding any free slot) or "least-conn"
    # (a queue per replica, nginx's least_conn); request-level simulation only (sim/dispatch.py).
    dispatch: Dispatch = "shared"
    # The service-time signal is the mean of the requests completed in the rate window (as vLLM reports it),
    # not of those that arrived and started in it; request-level simulation only.
    service_by_completion: bool = False
    # Scale to zero: the admission endpoint learns the Ready replicas at the control loop's ticks, this far apart
    # while requests are held; None: at once. Request-level simulation only.
    ready_seen_every_s: float | None = None

    @property
    def cold_start_s(self) -> float:
        return self.cluster.startup_s + self.cluster.node_provisioning_s


@dataclass
class RunResult:
    policy: str
    outcome: dict
    costs: Costs
    scaling_actions: int
    wall_s: float
    decide_s: list[float]
    refit: list[bool]
    timeline: list[dict]
    capacity_lags_s: list[float] = field(default_factory=list)  # order -> Ready of every replica added
    warm_churn: WarmChurn = field(default_factory=WarmChurn)  # placeholders created, deleted, preempted


def sim_config_for(spec: PolicySpec) -> SimConfig:
    """The simulated cluster a policy spec describes: its tick, SLO, capacity and nominal start-up times."""
    return SimConfig(
        tick_s=spec.tick_s,
        slo_s=spec.slo_queue_wait_s,
        miss_ratio=spec.slo_miss_target_ratio,
        cluster=ClusterModel(startup_s=spec.default_startup_s, node_provisioning_s=spec.node_provisioning_s),
        server=ServerModel(concurrency=spec.replica_concurrency),
    )


def initial_replicas(needed: np.ndarray, config: SimConfig) -> int:
    """Every policy starts from the replicas the workload's first cold start truly needs, ready."""
    return int(needed[: int(config.cold_start_s // config.tick_s) + 1].max())


def sizing_spec(config: SimConfig) -> PolicySpec:
    """The policy fields the simulated cluster fixes: what `replicas_for_rate` sizes with."""
    return PolicySpec(tick_s=config.tick_s, replica_concurrency=config.server.concurrency,
                      slo_queue_wait_s=config.slo_s, slo_miss_target_ratio=config.miss_ratio)


def needed_replicas(workload: RequestWorkload | RateWorkload, config: SimConfig) -> np.ndarray:
    """Replicas each tick truly needs to meet the SLO, from the actual (future) traffic; at least one."""
    # A queue wait of one SLO absorbs fluctuations shorter than the SLO, not longer ones: size each tick
    # for its busiest SLO-long sub-window.
    bin_s = config.tick_s / max(1, round(config.tick_s / max(config.slo_s, 1.0)))
    rates, services = tick_demand(workload, config.tick_s, seed=config.arrival_seed, bin_s=bin_s)
    return np.maximum(1, replicas_for_rates(sizing_spec(config), rates, services))


def traffic_sim(workload: RequestWorkload | RateWorkload, config: SimConfig) -> RequestSim | RateSim:
    """The simulated servers for a workload, built from the config (the one place both benchmarks build them)."""
    k = config.server.concurrency
    if isinstance(workload, RequestWorkload):
        return RequestSim(workload, concurrency=k, slo_s=config.slo_s, tick_s=config.tick_s,
                          max_hold_s=config.max_hold_s, server_priority=config.server_priority,
                          service_by_completion=config.service_by_completion,
                          ready_seen_every_s=config.ready_seen_every_s, dispatch=config.dispatch)
    if config.server_priority:
        raise ValueError("server priority is modelled only for request traces (rate traces have one fluid queue)")
    if config.dispatch != "shared":
        raise ValueError(f"dispatch {config.dispatch!r} is modelled only for request traces (rate traces have "
                         "one fluid queue)")
    return RateSim(workload, concurrency=k, slo_s=config.slo_s, tick_s=config.tick_s, seed=config.arrival_seed,
                   max_hold_s=config.max_hold_s)


def run(
    policy: PolicyRun,
    workload: RequestWorkload | RateWorkload,
    config: SimConfig,
    *,
    initial_replicas: int,
    keep_timeline: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    started = time.perf_counter()
    sim = traffic_sim(workload, config)
    cluster: Cluster = SimCluster.started(config.cluster, replicas=initial_replicas, now=0.0)
    state = policy.state
    shed: dict[str, float] = {}
    guard = Guard()
    decide_s: list[float] = []
    refit: list[bool] = []
    timeline: list[dict] = []
    n = ticks(workload, config.tick_s)
    for tick in range(n):
        now = tick * config.tick_s
        cluster.advance(now)
        signals = sim.signals(now, cluster)
        t0 = time.perf_counter()
        decision, state = policy.decide(policy.spec, state, signals, now)
        decide_s.append(time.perf_counter() - t0)
        refit.append(decision.refitted)
        if decision.valid:
            cluster.scale_to(decision.replicas)
            cluster.warm_to(decision.warm_slots)
            shed = dict(decision.shed)
            guard = Guard.of(decision)
        if keep_timeline:
            timeline.append(timeline_row(
                now, signals, decision, replicas=cluster.replicas,
                warm_slots=cluster.warm_slots, shed=shed, classes=workload.classes,
            ))
        sim.serve(now, now + config.tick_s, cluster, shed, guard)
        if progress is not None:
            progress(1)
    end = n * config.tick_s
    cluster.advance(end)
    sim.finish(end)
    costs = cluster.finish()
    return RunResult(
        policy=policy.name,
        outcome=sim.outcome(),
        costs=costs,
        scaling_actions=cluster.scaling_actions,
        wall_s=time.perf_counter() - started,
        decide_s=decide_s,
        refit=refit,
        timeline=timeline,
        capacity_lags_s=list(cluster.capacity_lags_s),
        warm_churn=cluster.warm_churn,
    )
