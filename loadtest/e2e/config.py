"""What a closed-loop scenario runs with, at factor 1 (real time), and how it is compressed.

One factor divides every duration together: pod start-up, node start-up, idle-node removal, the control
tick, scrape, rate window and probe intervals, the SLO, service times and the trace's clock. The policy's
settings are compressed the same way (every `*_s` field), so the controller makes, tick by tick, the
decisions it would make at factor 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler.sim.cluster import ClusterModel
from autoscaler.sim.dispatch import Dispatch
from autoscaler.loop import HELD_TICK_S
from autoscaler.sim.hold import default_max_hold_s
from autoscaler.sim.run import SimConfig
from autoscaler.sim.workload import ServerModel
from loadtest.kube.karpenter import ONE_GPU, NodeShape
from policies import PolicySpec


MODES = ("actuate", "keda")  # who writes the Deployment's scale: the controller, or KEDA from its decision


@dataclass(frozen=True)
class E2EConfig:
    factor: float = 10.0
    tick_s: float = 15.0
    slo_s: float = 2.0
    scrape_s: float = 15.0
    rate_window_s: float = 60.0
    probe_s: float = 1.0
    startup_s: float = 120.0  # pod start-up, jittered U(0.875, 1.25)x like the simulator's
    startup_jitter_ratio: float = 0.25
    node_provisioning_s: float = 300.0  # Karpenter's NodeClaim -> a Ready node
    node_idle_s: float = 600.0  # an empty node is removed after this (Karpenter's consolidateAfter)
    concurrency: int = 8  # slots per replica (vLLM --max-num-seqs)
    drain_delay_s: float = 5.0  # a removed pod leaves the gateway this long before its server drains (preStop)
    max_replicas: int = 24
    gpu_limit: int = 40  # the NodePool's GPUs
    node_shape: NodeShape = ONE_GPU
    server: ServerModel = field(default_factory=lambda: ServerModel(concurrency=8))
    policy: dict = field(default_factory=dict)  # PolicySpec fields over the defaults below, at factor 1
    # Scale to zero: the admission endpoint's max_hold_s at factor 1 (None: the product's default, whose
    # 60-s margin is not compressed), and warm slots kept for the model outside the controller's own warm
    # pool (placeholders pooled for it by the fleet), which scale to zero leaves in place.
    max_hold_s: float | None = None
    pooled_warm_slots: int = 0
    # The model servers serve their queue by class, critical first (vLLM's `--scheduling-policy priority`), and
    # the load generator sends each request's class as vLLM's `priority` (what the gateway would write into the
    # body, docs/priority-scheduling.md); the twin's servers do the same. False: first come first served.
    server_priority: bool = False
    # The twin's gateway: one queue feeding any free slot ("shared"), or a queue per replica ("least-conn",
    # what nginx's least_conn in front of the fake servers does; autoscaler/sim/dispatch.py).
    dispatch: Dispatch = "shared"
    # The twin reads the mean service time of the requests that completed in the window, as the live servers
    # report it (vLLM's inference-time histogram), not of those that started: when traffic stops, the last to
    # complete are the long ones (which the policy does not learn after a drop it takes for an outage,
    # policies/stages/learn.py; before, it kept that high last reading through the silence). Always on
    # with `idle_after_s` (scale to zero); set by a scenario with a silence (`silence`), where it sizes the
    # capacity the outage hold keeps (live: 10 replicas on a reading of 15.5 s, against 6 on 10 s).
    service_by_completion: bool = False
    # "actuate": the controller scales the Deployment; "keda": it publishes over gRPC and KEDA's operator and
    # HPA scale it (`loadtest.e2e.kedamode`)
    mode: str = "actuate"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"E2EConfig.mode {self.mode!r}: choose one of {', '.join(MODES)}")

    def spec(self) -> PolicySpec:
        """The predictive policy at factor 1 (what the simulator runs)."""
        base = dict(
            tick_s=self.tick_s, min_replicas=1, max_replicas=self.max_replicas, replica_concurrency=self.concurrency,
            slo_queue_wait_s=self.slo_s, p99_latency_target_s=self.slo_s, default_startup_s=self.startup_s,
            node_provisioning_s=self.node_provisioning_s, max_warm_slots=8,
            # the live arrival rate is Prometheus' rate over this window: the twin's policy skips the same first
            # window after the first request as the live one (policies/stages/forecast.py)
            rate_window_s=self.rate_window_s,
        )
        return PolicySpec(**{**base, **self.policy})

    @property
    def holding(self) -> bool:
        """Whether the gateway can hold this run's requests: only for a model that scales to zero."""
        return self.spec().idle_after_s is not None

    def live_spec(self) -> dict:
        """The same policy compressed, as the controller's config section."""
        return compress(self.spec(), self.factor)

    def sim_config(self, *, node_idle_extra_s: float = 0.0, gpu_limits: tuple[tuple[float, int], ...] = (),
                   node_waits: tuple[tuple[float, ...], ...] = (),
                   startups: tuple[tuple[float, float], ...] = ()) -> SimConfig:
        """The simulated cluster the live one is compared with. `node_idle_extra_s`: the provisioner's own
        delay in removing an empty node beyond consolidateAfter, as measured live (at factor 1). The NodePool's
        GPU limit in nodes (one GPU per replica, on one-GPU nodes): `gpu_limit` from the start, then each
        (scenario time, GPUs) of `gpu_limits` from its time on. With `idle_after_s` (scale to zero) the gateway's
        hold is modelled, up to `max_hold_s` (unset: the simulator's default, the slowest cold start + 60 s), and
        the service-time signal is read by completion as the live servers report it: after the traffic stops,
        the last readings are of the longest requests (not learned after a drop the policy takes for an outage:
        policies/stages/learn.py). The held requests see a replica Ready at the loop's next tick: it ticks every
        `HELD_TICK_S` of wall clock while requests are held, which is not compressed (`factor` x as long at
        factor 1). `node_waits`, `startups`: the live run's node waits and start-ups, replayed
        (`ClusterModel.node_waits`, `startups`)."""
        limit = ((0.0, self.gpu_limit),) + tuple(gpu_limits)
        cluster = ClusterModel(startup_s=self.startup_s, startup_jitter_ratio=self.startup_jitter_ratio,
                               node_provisioning_s=self.node_provisioning_s, node_jitter_ratio=0.0,
                               node_idle_timeout_s=self.node_idle_s + node_idle_extra_s, node_limit=limit,
                               node_waits=node_waits, startups=startups)
        hold_s = None
        if self.holding:
            hold_s = self.max_hold_s or default_max_hold_s(cluster.worst_cold_start_s)
        held = hold_s is not None
        return SimConfig(tick_s=self.tick_s, slo_s=self.slo_s, cluster=cluster, server=self.server, max_hold_s=hold_s,
                         service_by_completion=held or self.service_by_completion,
                         ready_seen_every_s=HELD_TICK_S * self.factor if held else None,
                         server_priority=self.server_priority, dispatch=self.dispatch)

    def server_args(self) -> list[str]:
        """The fake servers' scheduling policy, as `loadtest.fleet`'s arguments."""
        return ["--scheduling-policy", "priority" if self.server_priority else "fcfs"]

    def loadgen_args(self) -> list[str]:
        """The load generator's arguments for the servers' policy: a `fcfs` server refuses a priority."""
        return ["--priority-in-body"] if self.server_priority else []


def compress(spec: PolicySpec, factor: float) -> dict:
    """Every duration of a policy divided by `factor` (rates per second multiplied), as a config mapping."""
    data = spec.model_dump()
    for name, value in list(data.items()):
        if name.endswith("_s") and isinstance(value, (int, float)):
            data[name] = value / factor
    if data.get("target_tokens_per_s_per_replica") is not None:
        data["target_tokens_per_s_per_replica"] *= factor
    return data
