"""The replay benchmark: every policy on the same workload and the same simulated cluster, one process.

    python -m loadtest.bench --trace PATH [--scale K] [--gpus-per-replica N --gpus-per-node M]
                             [--gpu-hour-price P] [--json]

Prints per policy: SLO attainment per priority class, p99 queue wait, GPU-hours (serving + warming + warm
pool + idle nodes), GPU-hours / clairvoyant, node GPU-hours (every GPU of every node while it exists, idle
ones on partly used nodes and the M mod N no replica fits in included) and their cost at P per GPU-hour,
shed fraction of sheddable requests, scaling actions, and the replay's wall time; then the predictive
policy's decide() time (median, 99th percentile with the scheduled statsmodels refits, and median excluding
them) and whether it met the targets. Every policy runs on the same simulated cluster of N-GPU replicas on M-GPU nodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pydantic import ValidationError

from autoscaler.config import describe, read_yaml_mapping
from autoscaler.errors import ConfigError, InputError
from autoscaler.sim.cluster import ClusterModel
from autoscaler.sim.rate import tick_arrivals
from autoscaler.sim.run import RunResult, SimConfig, initial_replicas, needed_replicas, run, ticks
from autoscaler.sim.workload import RequestWorkload
from policies.queueing import servers_for
from autoscaler.sim.workload import CLASSES, DEFAULT_MIX, ServerModel, WorkloadConfig, build
from autoscaler.traces import read_trace
from loadtest import policyset, scenarios

BUNDLED_TRACE = Path(__file__).parent / "traces" / "azure-llm-2023-code" / "AzureLLMInferenceTrace_code.csv"
# The targets: the highest class meets its SLO for 99.9 % of requests, the other classes that are never
# shed for 99 %, and at most 5 % of a sheddable class is shed.
TOP_TARGET, OTHER_TARGET, MAX_SHED = 0.999, 0.99, 0.05
ABBREVIATIONS = {"critical": "crit", "standard": "std", "sheddable": "shed"}


def targets(classes: tuple[str, ...], sheddable: tuple[str, ...]) -> dict[str, float]:
    """Attainment target per class that is never shed (highest first)."""
    kept = [c for c in classes if c not in sheddable]
    return {c: TOP_TARGET if i == 0 else OTHER_TARGET for i, c in enumerate(kept)}


def floor_gpu_hours(workload, config: SimConfig) -> float:
    """A lower bound on GPU-hours: every tick's demand served at the SLO (the Erlang C slots its arrival
    rate needs at its mean service time), with no start-up, provisioning or rounding waste: fractional
    replicas, ready the instant they are needed, of `gpus_per_replica` GPUs each. What perfect, instant
    scaling would cost (in replica GPU-hours: no node is ever partly used)."""
    n = ticks(workload, config.tick_s)
    k = config.server.concurrency
    if isinstance(workload, RequestWorkload):
        index = np.minimum((workload.arrival_s // config.tick_s).astype(int), n - 1)
        counts = np.bincount(index, minlength=n)
        work = np.bincount(index, weights=workload.service_s, minlength=n)
        rates = counts / config.tick_s
        services = np.where(counts > 0, work / np.maximum(counts, 1), 1.0)
    else:
        t = np.arange(n) * config.tick_s
        win = np.minimum((t // workload.window_s).astype(int), len(workload.rate_per_s) - 1)
        rates = tick_arrivals(workload, config.tick_s, config.arrival_seed) / config.tick_s
        services = workload.service_s[win]
    cache: dict[tuple[float, float], int] = {}
    slots = 0.0
    for rate, service in zip(rates, services):
        key = (round(float(rate), 3), round(float(service), 3))
        if key not in cache:
            cache[key] = servers_for(rate_per_s=key[0], service_s=key[1], wait_s=config.slo_s,
                                     miss_ratio=config.miss_ratio)
        slots += cache[key]
    return slots / k * config.tick_s / 3600.0 * config.cluster.gpus_per_replica


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def figures(result: RunResult, clairvoyant_gpu_hours: float | None, *, gpu_hour_price: float = 1.0) -> dict:
    costs = result.costs
    gpu = costs.total_gpu_hours
    return {
        "policy": result.policy,
        "slo_attainment": {c: round(v, 5) for c, v in result.outcome["slo_attainment"].items()},
        "p99_queue_wait_s": round(result.outcome["p99_queue_wait_s"], 3),
        "gpu_hours": round(gpu, 3),
        "gpu_hours_vs_clairvoyant": round(gpu / clairvoyant_gpu_hours, 3) if clairvoyant_gpu_hours else None,
        "shed_fraction": round(result.outcome["shed_fraction"], 5),
        "shed_by_class": {c: round(v, 5) for c, v in result.outcome["shed_by_class"].items()},
        "shed_time_s": result.outcome["shed_time_s"],
        "warm_pool_gpu_hours": round(costs.warm_pool_s * costs.gpus_per_replica / 3600.0, 3),
        "node_hours": round(costs.node_hours, 3),
        "node_gpu_hours": round(costs.node_gpu_hours, 3),
        "cost": round(costs.node_gpu_hours * gpu_hour_price, 3),
        "time_to_capacity_s": {"p50": _percentile(result.capacity_lags_s, 50),
                               "p95": _percentile(result.capacity_lags_s, 95)},
        "scaling_actions": result.scaling_actions,
        "wall_s": round(result.wall_s, 2),
    }


def meets(row: dict, classes: tuple[str, ...], sheddable: tuple[str, ...]) -> bool:
    a = row["slo_attainment"]
    return (all(a[c] >= t for c, t in targets(classes, sheddable).items())
            and all(row["shed_by_class"][c] <= MAX_SHED for c in sheddable))


def billed(cluster: ClusterModel) -> tuple[str, str]:
    """What policies are compared on (a row's key) and its unit: GPU-hours of the replicas on one-GPU nodes,
    else node GPU-hours (a node is paid for all its GPUs, used or not, until it is removed)."""
    return ("node_gpu_hours", "node GPU-h") if cluster.gpus_per_node > 1 else ("gpu_hours", "GPU-h")


def verdict(rows: list[dict], classes: tuple[str, ...], sheddable: tuple[str, ...], *,
            cluster: ClusterModel | None = None) -> list[str]:
    ours = next((r for r in rows if r["policy"] == "predictive"), None)
    if ours is None:
        return []
    key, unit = billed(cluster or ClusterModel())
    lines = []
    a = ours["slo_attainment"]
    wanted = targets(classes, sheddable)
    parts = [f"{c} {a[c]:{'.4%' if t == TOP_TARGET else '.3%'}} (>= {t:.1%})".replace(".0%)", "%)")
             for c, t in wanted.items()]
    parts += [f"{c} shed {ours['shed_by_class'][c]:.2%} (<= {MAX_SHED:.0%})" for c in sheddable]
    lines.append(f"targets: {', '.join(parts)}: {'met' if meets(ours, classes, sheddable) else 'NOT met'}")
    for row in rows:
        if row["policy"].startswith("predictive") or row["policy"] == "clairvoyant":
            continue
        same = all(row["slo_attainment"][c] >= ours["slo_attainment"][c] for c in wanted)
        if same:
            cheaper = ours[key] < row[key]
            lines.append(
                f"vs {row['policy']} (reaches our attainment): {ours[key]:.1f} vs {row[key]:.1f} "
                f"{unit} -> {'fewer' if cheaper else 'NOT fewer'}"
            )
        else:
            lines.append(f"vs {row['policy']}: does not reach our attainment")
    clairvoyant = next((r for r in rows if r["policy"] == "clairvoyant"), None)
    ratio = ours["gpu_hours_vs_clairvoyant"] if key == "gpu_hours" else (
        round(ours[key] / clairvoyant[key], 3) if clairvoyant is not None and clairvoyant[key] else None)
    if ratio is not None:
        lines.append(f"{unit.replace('GPU-h', 'GPU-hours')} vs clairvoyant: {ratio:.3f}x (aim <= 1.25x)")
    return lines


def shape(cluster: ClusterModel, gpu_hour_price: float) -> str:
    """The cluster's shape and the price, e.g. "4-GPU replicas on 8-GPU nodes (2 per node); cost = node
    GPU-hours x 1 per GPU-hour"."""
    k = cluster.replicas_per_node
    unusable = cluster.gpus_per_node - k * cluster.gpus_per_replica
    left = f", {unusable} GPUs of each unusable" if unusable else ""
    return (f"{cluster.gpus_per_replica}-GPU replicas on {cluster.gpus_per_node}-GPU nodes ({k} per node{left}); "
            f"cost = node GPU-hours x {gpu_hour_price:g} per GPU-hour")


def table(rows: list[dict], classes: tuple[str, ...], sheddable: tuple[str, ...], *,
          cluster: ClusterModel | None = None, gpu_hour_price: float = 1.0) -> str:
    """One row per policy: attainment per class (highest first), p99 wait, GPU-hours (and the warm pool's
    share of them), node GPU-hours and their cost, shed share and shedding time of the sheddable classes,
    time to capacity (order -> Ready of each replica added, median / 95th percentile), scaling actions, wall
    time. The first line names the cluster's shape and the price."""
    names = [ABBREVIATIONS.get(c, c[:6]) + " SLO" for c in classes]
    head = (
        f"{'policy':<18} " + " ".join(f"{n:>9}" for n in names) + f" {'p99 wait':>9} {'GPU-h':>9} "
        f"{'x clairv':>9} {'warm':>6} {'node GPU-h':>10} {'cost':>9} {'shed':>7} {'shed s':>7} {'TTC p50/p95 s':>14} "
        f"{'actions':>8} {'wall s':>7}"
    )
    lines = [shape(cluster or ClusterModel(), gpu_hour_price), head, "-" * len(head)]
    for r in rows:
        a = r["slo_attainment"]
        ratio = f"{r['gpu_hours_vs_clairvoyant']:.3f}" if r["gpu_hours_vs_clairvoyant"] is not None else "-"
        shed = sum(r["shed_by_class"][c] * 1.0 for c in sheddable) / max(1, len(sheddable))
        cells = " ".join(f"{a[c]:>9.4%}" if i == 0 else f"{a[c]:>9.3%}" for i, c in enumerate(classes))
        warm = r["warm_pool_gpu_hours"] / r["gpu_hours"] if r["gpu_hours"] else 0.0
        shed_s = max((r["shed_time_s"][c] for c in sheddable), default=0.0)
        ttc = r["time_to_capacity_s"]
        ttc_text = f"{ttc['p50']:.0f}/{ttc['p95']:.0f}" if ttc["p50"] is not None else "-"
        lines.append(
            f"{r['policy']:<18} {cells} "
            f"{r['p99_queue_wait_s']:>8.2f}s {r['gpu_hours']:>9.2f} {ratio:>9} {warm:>6.1%} "
            f"{r['node_gpu_hours']:>10.2f} {r['cost']:>9.2f} {shed:>7.2%} {shed_s:>7.0f} {ttc_text:>14} "
            f"{r['scaling_actions']:>8} {r['wall_s']:>7.1f}"
        )
    return "\n".join(lines)


def policy_overrides(args: argparse.Namespace) -> dict:
    """Fields of the predictive policy from --policy-config, then --policy-set."""
    import yaml

    data: dict = {}
    if args.policy_config:
        data = read_yaml_mapping(args.policy_config)
        if isinstance(data.get("policy"), dict):
            data = data["policy"]
    for item in args.policy_set:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--policy-set {item!r}: expected FIELD=VALUE")
        data[name.strip()] = yaml.safe_load(value)
    return data


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(BUNDLED_TRACE),
                   help="trace file, ServeGen folder, or scenario:NAME (loadtest/scenarios.py); default: bundled")
    p.add_argument("--scale", type=float, default=None, help="explicit load factor (default: size to --peak-replicas)")
    p.add_argument("--peak-replicas", type=int, default=40, help="replicas the busiest minute/window needs")
    p.add_argument("--tick-s", type=float, default=15.0)
    p.add_argument("--slo-s", type=float, default=2.0, help="queue-wait SLO per request")
    p.add_argument("--startup-s", type=float, default=120.0, help="pod creation -> Ready (mean, jittered)")
    p.add_argument("--node-provisioning-s", type=float, default=300.0)
    p.add_argument("--concurrency", type=int, default=16, help="requests one replica serves at once")
    p.add_argument("--gpus-per-replica", type=int, default=1,
                   help="GPUs one replica needs, on one node (tensor parallel); GPU-hours are in GPUs")
    p.add_argument("--gpus-per-node", type=int, default=1,
                   help="GPUs of a node; a node holds gpus-per-node // gpus-per-replica replicas")
    p.add_argument("--gpu-hour-price", type=float, default=1.0,
                   help="price of one GPU-hour of the node type: cost = node GPU-hours x this")
    p.add_argument("--priority-mix", default=",".join(f"{x:g}" for x in DEFAULT_MIX),
                   help="shares of the policy's priority classes, highest first (critical,standard,sheddable)")
    p.add_argument("--seed", type=int, default=5, help="rate traces: seed of each client's per-tick arrivals")
    p.add_argument("--policies", default=",".join(policyset.NAMES))
    p.add_argument("--policy-config", default=None,
                   help="YAML of predictive policy fields, or a controller config (its policy section)")
    p.add_argument("--policy-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="one predictive policy field (YAML value), over --policy-config; repeatable")
    p.add_argument("--timeline-dir", default=None, help="write one CSV timeline per policy here")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    p.add_argument("--frontier", action="store_true",
                   help="sweep each policy's knob: attainment against GPU-hours, and GPU-hours at the targets")
    p.add_argument("--frontier-png", default=None, help="with --frontier: write the frontier plot here")
    p.add_argument("--workers", type=int, default=None, help="with --frontier: processes (default: CPUs)")
    return p.parse_args(argv)


@dataclass
class Setup:
    """One benchmark's world: the workload on the simulated cluster, what each tick truly needs, the shared
    replica bound and the predictive policy's spec."""

    workload: object
    config: SimConfig
    needed: np.ndarray
    initial: int
    bound: int
    spec: object
    classes: tuple[str, ...]
    sheddable: tuple[str, ...]
    gpu_hour_price: float = 1.0

    def start(self, name: str) -> int:
        """Replicas a policy starts with: static runs its peak from the start, the others what the first
        cold start needs."""
        return min(int(self.needed.max()), self.bound) if name == "static" else self.initial


def prepare(args: argparse.Namespace) -> Setup:
    """The setup from the flags; InputError (TraceError, ConfigError) or ValueError on bad input."""
    classes = CLASSES
    try:
        mix = tuple(float(x) for x in args.priority_mix.split(","))
        if len(mix) != len(classes) or min(mix) < 0 or sum(mix) <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--priority-mix: expected {len(classes)} non-negative shares for {list(classes)} like "
                          f"0.2,0.5,0.3, got {args.priority_mix!r}") from None
    if not args.gpu_hour_price >= 0:
        raise ConfigError(f"--gpu-hour-price: expected a price >= 0, got {args.gpu_hour_price:g}")
    try:
        cluster = ClusterModel(startup_s=args.startup_s, node_provisioning_s=args.node_provisioning_s,
                               gpus_per_replica=args.gpus_per_replica, gpus_per_node=args.gpus_per_node)
    except ValueError as exc:
        raise ConfigError(f"--gpus-per-replica {args.gpus_per_replica}, --gpus-per-node {args.gpus_per_node}: "
                          f"{exc}") from None
    trace = scenarios.read(args.trace) if scenarios.is_scenario(args.trace) else read_trace(args.trace)
    server = ServerModel(concurrency=args.concurrency)
    config = SimConfig(tick_s=args.tick_s, slo_s=args.slo_s, arrival_seed=args.seed, cluster=cluster, server=server)
    workload = build(
        trace, WorkloadConfig(peak_replicas=args.peak_replicas, scale=args.scale, classes=classes, priority_mix=mix,
                              server=server)
    )
    needed = needed_replicas(workload, config)
    bound = policyset.replica_bound(needed)
    try:
        spec = policyset.predictive_spec(config, policy_overrides(args), max_replicas=bound)
    except ValidationError as exc:
        raise ConfigError(describe(exc, args.policy_config or "--policy-set")) from None
    sheddable = tuple(c for c in classes if spec.priorities[c] < spec.shed_priority_below)
    return Setup(workload, config, needed, initial_replicas(needed, config), bound, spec, classes, sheddable,
                 args.gpu_hour_price)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        setup = prepare(args)
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.frontier:
        from loadtest.frontier import frontier_main

        return frontier_main(args, setup)
    workload, config, needed, classes, sheddable = (setup.workload, setup.config, setup.needed, setup.classes,
                                                    setup.sheddable)
    names = tuple(n.strip() for n in args.policies.split(",") if n.strip())
    if "clairvoyant" not in names:
        names += ("clairvoyant",)
    try:
        runs = policyset.build(config, needed, names, predictive=setup.spec, max_replicas=setup.bound)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = {}
    for policy in runs:
        results[policy.name] = run(
            policy, workload, config, initial_replicas=setup.start(policy.name),
            keep_timeline=args.timeline_dir is not None,
        )
    clairvoyant = results["clairvoyant"].costs.total_gpu_hours
    rows = [figures(results[p.name], clairvoyant, gpu_hour_price=setup.gpu_hour_price) for p in runs]
    floor = floor_gpu_hours(workload, config)
    for row in rows:
        row["gpu_hours_vs_floor"] = round(row["gpu_hours"] / floor, 3) if floor else None
    if args.timeline_dir:
        from autoscaler.replay.output import write_csv

        out = Path(args.timeline_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, result in results.items():
            write_csv(out / f"{name}.csv", result.timeline)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"trace {workload.name}: {workload.span_s / 3600:.1f} h, scale x{workload.scale:.3g}, "
        f"{ticks(workload, config.tick_s)} ticks of {config.tick_s:.0f} s, peak need {needed.max()} replicas "
        f"(replica bound {setup.bound}), SLO queue wait <= {config.slo_s:.1f} s, floor {floor:.2f} GPU-h"
    )
    if setup.spec.max_replicas < needed.max():
        print(f"note: the policy's max_replicas ({setup.spec.max_replicas}) is below the trace's peak need "
              f"({needed.max()}); {int((needed > setup.spec.max_replicas).sum())} ticks need more")
    print(table(rows, classes, sheddable, cluster=config.cluster, gpu_hour_price=setup.gpu_hour_price))
    if "predictive" in results:
        ours = results["predictive"]
        steady = [t for t, refit in zip(ours.decide_s, ours.refit) if not refit] or [0.0]
        p99 = float(np.percentile(ours.decide_s, 99))
        print(
            f"predictive decide(): median {statistics.median(ours.decide_s) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms "
            f"(scheduled refits included) over {len(ours.decide_s)} ticks; median excluding {sum(ours.refit)} "
            f"scheduled refits {statistics.median(steady) * 1e3:.3f} ms"
        )
        for line in verdict(rows, classes, sheddable, cluster=config.cluster):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
