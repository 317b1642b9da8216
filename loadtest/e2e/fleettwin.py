"""The simulated twin of a closed-loop fleet scenario: the fleet benchmark's simulator (`loadtest.fleetbench`,
policy `fleet`: every model's own `decide`, then `policies.fleet.allocate` on the shared GPU limit, pooled warm
slots) on the scenario's own requests, policy and cluster shape (the live run's node timings when known).

Each model's requests are the ones the load generator sends (`requests_of`): the scenario's profile for
that model at its base rate, seeded per model, split into classes as in the single-model scenarios.
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.sim.run import needed_replicas, ticks
from autoscaler.sim.workload import WorkloadConfig, build
from loadtest import fleetbench, scenarios
from loadtest.e2e.config import E2EConfig
from loadtest.loadgen import Request


def requests_of(model: scenarios.FleetModel, config: E2EConfig, *, seed: int):
    """The model's workload (for the twin) and its requests (for the load generator)."""
    trace = scenarios.synthetic(model.profile_name, base_rate_per_s=model.base_rate_per_s, seed=seed)
    workload = build(trace, WorkloadConfig(scale=1.0, server=config.server))
    classes = workload.classes
    requests = [Request(i, float(t), classes[int(p)], int(a), int(b)) for i, (t, p, a, b) in
                enumerate(zip(workload.arrival_s, workload.priority, trace.input_tokens, trace.output_tokens))]
    return workload, requests


def _members(models: tuple[scenarios.FleetModel, ...], workloads: dict, sim_config, spec) -> list:
    return [fleetbench.Model(m.key, m.tier, m.weight, workloads[m.key], sim_config,
                             needed_replicas(workloads[m.key], sim_config), spec) for m in models]


def starts(models: tuple[scenarios.FleetModel, ...], workloads: dict, config: E2EConfig) -> dict[str, int]:
    """Each model's replicas at the start, as the twin starts them: what its first cold start needs, as the
    fleet decision allocates that need under the GPU limit (the live run starts from the same)."""
    members = _members(models, workloads, config.sim_config(), config.spec())
    return fleetbench.starts(members, "fleet", limit=config.gpu_limit)


def simulate(models: tuple[scenarios.FleetModel, ...], workloads: dict, config: E2EConfig, *,
             starts: dict[str, int], node_provisioning_s: float | None = None, node_learned_s: float | None = None,
             node_idle_extra_s: float = 0.0) -> dict:
    """The fleet policy on the simulated cluster: fleetbench's figures (`gpu_hours`, `models`: per model
    `slo_attainment`, `shed_by_class`, `gpu_hours`, `peak_gpus`). `node_provisioning_s`: the node wait the live
    cluster showed (the twin's cluster); `node_learned_s`: what the live controller learned from it (the
    policy's `node_provisioning_s`); `node_idle_extra_s`: the provisioner's delay beyond consolidateAfter.
    `starts`: the replicas the live run started from (`starts`; on the live node timings the twin would size
    a longer first cold start and start elsewhere)."""
    twin = replace(config, node_provisioning_s=node_provisioning_s or config.node_provisioning_s)
    sim_config = twin.sim_config(node_idle_extra_s=node_idle_extra_s)
    spec = config.spec()
    if node_learned_s is not None:
        spec = spec.model_copy(update={"node_provisioning_s": node_learned_s})
    n = min(ticks(w, sim_config.tick_s) for w in workloads.values())
    return fleetbench.simulate("fleet", _members(models, workloads, sim_config, spec), limit=config.gpu_limit, n=n,
                               starts=starts)
