"""The replay benchmark: every policy on the same workload and the same simulated cluster, one process.

    python -m loadtest.bench --trace PATH [--scale K] [--gpus-per-replica N --gpus-per-node M]
                             [--gpu-hour-price P] [--idle-after-s S [--max-hold-s H]] [--json]

Prints per policy: SLO attainment per priority class, p99 queue wait, GPU-hours (serving + warming + warm
pool + idle nodes), GPU-hours / clairvoyant, node GPU-hours (every GPU of every node while it exists, idle
ones on partly used nodes and the M mod N no replica fits in included) and their cost at P per GPU-hour,
shed fraction of sheddable requests, scaling actions, warm placeholders created / deleted / created on a
new node (the pool's churn; `--json` adds those preempted by replicas) and the replay's wall time; then the
predictive policy's decide() time (median, 99th percentile with the scheduled statsmodels refits, and median
excluding them) and whether it met the targets. Every policy runs on the same simulated cluster of N-GPU
replicas on M-GPU nodes.

With `--idle-after-s S` the predictive policy runs twice: as always, and as `predictive-zero` with scale
to zero after S s without demand. Requests arriving while a model has no ready replica are then held
(`autoscaler.sim.hold`), and each policy that held any reports how many, the p50 and p99 of the hold and
how many were dropped after `--max-hold-s`. Without the flag the output is as before.

`--server-priority` (request traces) has the model servers serve their queue by class, highest first, as
vLLM's `--scheduling-policy priority`; `--dispatch least-conn` (request traces) gives each replica its own
queue, as nginx's `least_conn` commits each request to one server on arrival, instead of one queue feeding
any free slot (`autoscaler/sim/dispatch.py`); `--seeds A-B` runs the predictive policy once per seed and prints the
worst seed's verdict (`loadtest.seedbench`).

`--service-by-completion` (request traces) has the service-time signal read the mean of the requests that
completed in the last minute, as vLLM's inference-time histogram reports it and the closed loop's twins read
it, instead of those that arrived and started in it (`autoscaler/sim/request.py`). The two agree on steady
traffic; when traffic stops, the last requests to complete are the long ones, and only the reading by
completion shows it (on `scenario:silence-live`: 15.5 and 26.5 s on the last two ticks with completions after
the stop, against about 10). A rate trace has no requests: its reading is the window's mean, whichever the flag.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pydantic import ValidationError

from autoscaler.config import describe, read_yaml_mapping
from autoscaler.errors import ConfigError, InputError, TraceError
from autoscaler.flags import number
from autoscaler.limits import check_ticks
from autoscaler.progress import bar as progress_bar
from autoscaler.sim.cluster import ClusterModel
from autoscaler.sim.dispatch import DISPATCHES
from autoscaler.sim.hold import default_max_hold_s
from autoscaler.sim.run import PolicyRun, SimConfig, initial_replicas, needed_replicas, run, ticks
from autoscaler.sim.workload import CLASSES, DEFAULT_MIX, RequestWorkload, ServerModel, WorkloadConfig, build
from autoscaler.traces import read_trace
from loadtest import policyset, scenarios
from loadtest.measure import MAX_SHED, TOP_TARGET, billed, figures, floor_gpu_hours, meets, targets
from policies import PolicySpec, decide, initial_state

BUNDLED_TRACE = Path(__file__).parent / "traces" / "azure-llm-2023-code" / "AzureLLMInferenceTrace_code.csv"
ABBREVIATIONS = {"critical": "crit", "standard": "std", "sheddable": "shed"}


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
    time to capacity (order -> Ready of each replica added, median / 95th percentile), scaling actions, warm
    placeholders created / deleted / created on a new node (the pool's churn), wall time. The first line
    names the cluster's shape and the price."""
    names = [ABBREVIATIONS.get(c, c[:6]) + " SLO" for c in classes]
    head = (
        f"{'policy':<18} " + " ".join(f"{n:>9}" for n in names) + f" {'p99 wait':>9} {'GPU-h':>9} "
        f"{'x clairv':>9} {'warm':>6} {'node GPU-h':>10} {'cost':>9} {'shed':>7} {'shed s':>7} {'TTC p50/p95 s':>14} "
        f"{'actions':>8} {'warm +/-/node':>15} {'wall s':>7}"
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
        churn = f"{r['warm_churn']['created']}/{r['warm_churn']['deleted']}/{r['warm_churn']['new_nodes']}"
        lines.append(
            f"{r['policy']:<18} {cells} "
            f"{r['p99_queue_wait_s']:>8.2f}s {r['gpu_hours']:>9.2f} {ratio:>9} {warm:>6.1%} "
            f"{r['node_gpu_hours']:>10.2f} {r['cost']:>9.2f} {shed:>7.2%} {shed_s:>7.0f} {ttc_text:>14} "
            f"{r['scaling_actions']:>8} {churn:>15} {r['wall_s']:>7.1f}"
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


def seed_range(text: str) -> list[int]:
    """"1-10" or "1,3,6" (or both: "1-3,6") as a list of seeds, in order, at least one."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if sep else int(lo)
            if last < first:
                raise ValueError
            seeds += range(first, last + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 1-10 or 1,3,6, got {text!r}") from None
    return seeds


def parse_args(argv: list[str] | None, *, prog: str = "python -m loadtest.bench",
               description: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.splitlines()[0])
    p.add_argument("--trace", default=str(BUNDLED_TRACE),
                   help="trace file, ServeGen folder, or scenario:NAME (loadtest/scenarios.py); default: bundled")
    p.add_argument("--scale", type=number(above=0), default=None,
                   help="explicit load factor (default: size to --peak-replicas)")
    p.add_argument("--peak-replicas", type=number(int, at_least=1), default=40,
                   help="replicas the busiest minute/window needs (default: %(default)s)")
    p.add_argument("--tick-s", type=number(at_least=1, at_most=300), default=15.0,
                   help="control-loop period (default: %(default)s)")
    p.add_argument("--slo-s", type=number(above=0), default=2.0,
                   help="queue-wait SLO per request (default: %(default)s)")
    p.add_argument("--startup-s", type=number(above=0), default=120.0,
                   help="pod creation -> Ready (mean, jittered; default: %(default)s)")
    p.add_argument("--node-provisioning-s", type=number(at_least=0), default=300.0,
                   help="a new node's arrival (jittered; default: %(default)s)")
    p.add_argument("--concurrency", type=number(int, at_least=1), default=16,
                   help="requests one replica serves at once (default: %(default)s)")
    p.add_argument("--gpus-per-replica", type=number(int, at_least=1), default=1,
                   help="GPUs one replica needs, on one node (tensor parallel); GPU-hours are in GPUs (default: "
                        "%(default)s)")
    p.add_argument("--gpus-per-node", type=number(int, at_least=1), default=1,
                   help="GPUs of a node; a node holds gpus-per-node // gpus-per-replica replicas (default: "
                        "%(default)s)")
    p.add_argument("--gpu-hour-price", type=number(at_least=0), default=1.0,
                   help="price of one GPU-hour of the node type: cost = node GPU-hours x this (default: %(default)s)")
    p.add_argument("--priority-mix", default=",".join(f"{x:g}" for x in DEFAULT_MIX),
                   help="shares of the policy's priority classes, highest first (critical,standard,sheddable; "
                        "default: %(default)s)")
    p.add_argument("--seed", type=int, default=None,
                   help="rate traces: seed of each client's per-tick arrivals; request traces: seed of the class draws "
                   "and of the copies a --scale above 1 adds (default: 5 for rate traces, 1 for request traces)")
    p.add_argument("--seeds", type=seed_range, default=None, metavar="A-B",
                   help="run the predictive policy once per seed (A-B or a comma list) and print each seed's row and "
                   "the worst seed's verdict (default: one run at --seed)")
    p.add_argument("--server-priority", action="store_true",
                   help="request traces: model servers serve their queue by class, highest first (vLLM's "
                   "--scheduling-policy priority; default: first come first served)")
    p.add_argument("--dispatch", choices=DISPATCHES, default="shared",
                   help="request traces: one queue feeding any free slot (shared), or a queue per replica, each "
                   "arrival to the replica with the fewest requests (least-conn, nginx's least_conn; default: "
                   "%(default)s)")
    p.add_argument("--service-by-completion", action="store_true",
                   help="request traces: the service-time signal is the mean of the requests completed in the last "
                   "minute, as vLLM reports it (default: of those that arrived and started in it)")
    p.add_argument("--policies", default=",".join(policyset.NAMES),
                   help="comma-separated policies to replay (default: "
                        "%(default)s)")
    p.add_argument("--policy-config", default=None,
                   help="YAML of predictive policy fields, or a controller config (its policy section; default: the "
                        "built-in policy)")
    p.add_argument("--policy-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="one predictive policy field (YAML value), over --policy-config; repeatable (default: none)")
    p.add_argument("--idle-after-s", type=number(above=0), default=None,
                   help="also run the predictive policy with scale to zero after this long idle, as predictive-zero, "
                   "and model requests held while no replica is ready (default: off)")
    p.add_argument("--max-hold-s", type=number(above=0), default=None,
                   help="with --idle-after-s: a request held longer is dropped (503) and counted "
                   "(default: the slowest cold start + 60 s)")
    p.add_argument("--timeline-dir", default=None,
                   help="write one CSV timeline per policy here (default: none "
                        "written)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON document (default: the table)")
    p.add_argument("--frontier", action="store_true",
                   help="sweep each policy's knob: attainment against GPU-hours, and GPU-hours at the targets "
                        "(default: off)")
    p.add_argument("--frontier-png", default=None,
                   help="with --frontier: write the frontier plot here (default: no "
                        "plot)")
    p.add_argument("--workers", type=number(int, at_least=1), default=None,
                   help="with --frontier: processes (default: CPUs)")
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
    zero_spec: PolicySpec | None = None  # --idle-after-s: the predictive policy with scale to zero

    def start(self, name: str) -> int:
        """Replicas a policy starts with: static runs its peak from the start, the others what the first
        cold start needs."""
        return min(int(self.needed.max()), self.bound) if name == "static" else self.initial


def prepare(args: argparse.Namespace) -> Setup:
    """The setup from the flags; InputError (TraceError, ConfigError) or ValueError on bad input."""
    classes = CLASSES
    try:
        mix = tuple(float(x) for x in args.priority_mix.split(","))
        if len(mix) != len(classes) or not all(0 <= x < float("inf") for x in mix) or sum(mix) <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--priority-mix: expected {len(classes)} non-negative shares for {list(classes)} like "
                          f"0.2,0.5,0.3, got {args.priority_mix!r}") from None
    try:
        cluster = ClusterModel(startup_s=args.startup_s, node_provisioning_s=args.node_provisioning_s,
                               gpus_per_replica=args.gpus_per_replica, gpus_per_node=args.gpus_per_node)
    except ValueError as exc:
        raise ConfigError(f"--gpus-per-replica {args.gpus_per_replica}, --gpus-per-node {args.gpus_per_node}: "
                          f"{exc}") from None
    trace = scenarios.read(args.trace) if scenarios.is_scenario(args.trace) else read_trace(args.trace)
    server = ServerModel(concurrency=args.concurrency)
    seeds = {} if args.seed is None else {"arrival_seed": args.seed}
    config = SimConfig(tick_s=args.tick_s, slo_s=args.slo_s, cluster=cluster, server=server,
                       server_priority=args.server_priority, dispatch=args.dispatch,
                       service_by_completion=args.service_by_completion, **seeds)
    workload = build(
        trace, WorkloadConfig(peak_replicas=args.peak_replicas, scale=args.scale, classes=classes, priority_mix=mix,
                              server=server, **({} if args.seed is None else {"seed": args.seed}))
    )
    if args.server_priority and not isinstance(workload, RequestWorkload):
        raise ConfigError("--server-priority: modelled for request traces only (a rate trace has one fluid queue)")
    if args.dispatch != "shared" and not isinstance(workload, RequestWorkload):
        raise ConfigError(f"--dispatch {args.dispatch}: modelled for request traces only (a rate trace has one "
                          "fluid queue)")
    if args.service_by_completion and not isinstance(workload, RequestWorkload):
        raise ConfigError("--service-by-completion: modelled for request traces only (a rate trace has no requests "
                          "to complete)")
    check_ticks(span_s=workload.span_s, tick_s=config.tick_s, source=args.trace, error=TraceError)
    needed = needed_replicas(workload, config)
    bound = policyset.replica_bound(needed)
    try:
        spec = policyset.predictive_spec(config, policy_overrides(args), max_replicas=bound)
    except ValidationError as exc:
        raise ConfigError(describe(exc, args.policy_config or "--policy-set")) from None
    sheddable = tuple(c for c in classes if spec.priorities[c] < spec.shed_priority_below)
    zero_spec = None
    if args.idle_after_s is not None:
        try:
            zero_spec = PolicySpec(**{**spec.model_dump(), "idle_after_s": args.idle_after_s})
        except ValidationError as exc:
            raise ConfigError(describe(exc, "--idle-after-s")) from None
        max_hold_s = args.max_hold_s or default_max_hold_s(cluster.worst_cold_start_s)
        config = replace(config, max_hold_s=max_hold_s)
    elif args.max_hold_s is not None:
        raise ConfigError("--max-hold-s needs --idle-after-s (holds happen only at zero replicas)")
    return Setup(workload, config, needed, initial_replicas(needed, config), bound, spec, classes, sheddable,
                 args.gpu_hour_price, zero_spec)


WAKE_ONTO = {"slot": "a free slot", "node": "a new node"}


def hold_lines(rows: list[dict]) -> list[str]:
    """Per policy that held requests: how many, how long, how many were dropped; and what zero saved."""
    lines = []
    for row in rows:
        h = row.get("hold")
        if h and h["held_requests"]:
            starts = "; ".join(f"{b['held_requests']:g} after a wake onto {WAKE_ONTO[k]} (p50 {b['hold_p50_s']:g} s, "
                               f"p99 {b['hold_p99_s']:g} s)" for k, b in h.get("by_start", {}).items())
            lines.append(f"held ({row['policy']}): {h['held_requests']:g} requests, hold p50 {h['hold_p50_s']:g} s, "
                         f"p99 {h['hold_p99_s']:g} s, dropped after {h['max_hold_s']:g} s: {h['dropped_held']:g}"
                         + (f"; {starts}" if starts else ""))
    on = next((r for r in rows if r["policy"] == "predictive-zero"), None)
    off = next((r for r in rows if r["policy"] == "predictive"), None)
    if on is not None and off is not None and off["gpu_hours"]:
        top = next(iter(on["slo_attainment"]))
        lines.append(f"scale to zero: {on['gpu_hours']:.2f} vs {off['gpu_hours']:.2f} GPU-h "
                     f"({on['gpu_hours'] / off['gpu_hours'] - 1:+.1%}), {top} SLO "
                     f"{on['slo_attainment'][top]:.4%} vs {off['slo_attainment'][top]:.4%}")
    return lines


def replay_rows(setup: Setup, names: tuple[str, ...], *, keep_timeline: bool = False) -> tuple[list[dict], dict]:
    """Replay each named policy (clairvoyant among them) on the setup: a row of figures per policy, in order,
    and the runs by name. ValueError on an unknown policy."""
    runs = policyset.build(setup.config, setup.needed, names, predictive=setup.spec, max_replicas=setup.bound)
    if setup.zero_spec is not None:
        at = next((i + 1 for i, p in enumerate(runs) if p.name == "predictive"), 0)
        runs.insert(at, PolicyRun("predictive-zero", setup.zero_spec, decide, initial_state()))
    results = {}
    for policy in runs:
        bar = progress_bar(total=ticks(setup.workload, setup.config.tick_s), label=policy.name)
        results[policy.name] = run(policy, setup.workload, setup.config, initial_replicas=setup.start(policy.name),
                                   keep_timeline=keep_timeline, progress=bar.update)
        bar.close()
    clairvoyant = results["clairvoyant"].costs.replica_gpu_hours
    return [figures(results[p.name], clairvoyant, gpu_hour_price=setup.gpu_hour_price) for p in runs], results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--fleet" or a.startswith("--fleet=") for a in argv):  # the multi-model benchmark
        from loadtest.fleetbench import main as fleet_main

        return fleet_main(argv)
    args = parse_args(argv)
    try:
        setup = prepare(args)
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.frontier:
        from loadtest.frontier import frontier_main

        return frontier_main(args, setup)
    if args.seeds:
        from loadtest.seedbench import seeds_main

        return seeds_main(args)
    workload, config, needed, classes, sheddable = (setup.workload, setup.config, setup.needed, setup.classes,
                                                    setup.sheddable)
    names = tuple(n.strip() for n in args.policies.split(",") if n.strip())
    if "clairvoyant" not in names:
        names += ("clairvoyant",)
    try:
        rows, results = replay_rows(setup, names, keep_timeline=args.timeline_dir is not None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    for line in hold_lines(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
