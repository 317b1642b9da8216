"""The multi-model benchmark: several traces on one simulated GPU limit, decided together or per model.

    python -m loadtest.bench --fleet PATH[:tier[:weight]],... [--gpu-limit N | P%] [--hours H]
                             [--policies fleet,predictive,hpa,keda,clairvoyant] [--peak-replicas R]
                             [--warm-hold-s S] [--levels tier-major|class-major] [--json]

Every trace is replayed from t = 0, all cut at H hours or at the end of the shortest, whichever is first,
each scaled so that its busiest minute (window) needs `--peak-replicas` replicas, split 20/50/30 % into
critical / standard / sheddable as in the single-model benchmark. A model is named by its trace's folder.
`--gpu-limit 0`: no limit; `85%`: 85 % of the summed clairvoyant peaks (the clairvoyant run fixes the
number, printed).

Policies, each on the same workloads and the same simulated cluster model (1-GPU replicas on 1-GPU nodes,
start-up and node provisioning as in the single-model benchmark):
- `fleet`: every model's own `decide` (unchanged), then `policies.fleet.allocate` on the shared limit:
  levels (tier, class) in order, weighted fair share, pooled warm slots (apportioned back to the models);
  `--levels class-major` serves every tier's critical class before any tier's standard (default tier-major:
  all of tier 0's classes before tier 1's);
- `predictive`: `decide` per model with a fixed share of the limit in proportion to its peak need (its
  budget, as a config cap reaches `decide`), each with its own warm pool;
- `hpa`, `keda`: per model; pods beyond the limit wait for a node, first come first served;
- `clairvoyant`: per model, knowing the future, without a limit.

One node pool: a replica a model adds beyond its own free slots lands on another model's idle node (freed,
not yet removed) and, for `fleet`, on another model's ready placeholder (the pooled warm slots are kept
apportioned to the models, and taken by whichever scales first); a node that must be made costs node
provisioning. The limit counts the GPUs held by replicas and warm placeholders (an idle node is not
charged against it, the next pending pod takes it; its idle time is billed in GPU-hours).

Figures: GPU-hours (all held: warming, serving, warm pool, idle nodes), warm-pool GPU-hours, the most GPUs
held at once (for `clairvoyant` the sum of its models' peaks), and priority inversions: ticks in which a
model of a lower tier holds GPUs beyond its guaranteed share (its peak-proportional share of the limit)
while a higher tier's critical class misses its SLO (under 99.9 % of that tick's critical requests within
the queue-wait SLO). Without a limit there are no guaranteed shares and no inversions are counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from autoscaler.errors import ConfigError, InputError
from autoscaler.sim.cluster import ClusterModel, SimCluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.rate import RateSim
from autoscaler.sim.request import RequestSim
from autoscaler.sim.run import SimConfig, initial_replicas, needed_replicas, ticks, traffic_sim
from autoscaler.sim.workload import CLASSES, DEFAULT_MIX, ServerModel, WorkloadConfig, build
from autoscaler.traces import RateTrace, RequestTrace, read_trace
from loadtest import policyset
from loadtest.measure import MAX_SHED, TOP_TARGET, targets
from policies import Decision, decide, initial_state
from policies.fleet import Budgets, FleetSpec, FleetState, ModelDemand, allocate, class_demand

POLICIES = ("fleet", "predictive", "hpa", "keda", "clairvoyant")
SHEDDABLE = ("sheddable",)


@dataclass(frozen=True)
class Member:
    """One entry of SPEC: a trace, its tier (0 highest) and weight."""

    path: str
    tier: int = 0
    weight: float = 1.0


def parse_spec(text: str) -> list[Member]:
    """`PATH[:tier[:weight]],...`; ConfigError naming the entry on anything else."""
    members = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) > 3:
            raise ConfigError(f"--fleet entry {entry!r}: expected PATH[:tier[:weight]]")
        try:
            tier = int(parts[1]) if len(parts) > 1 else 0
            weight = float(parts[2]) if len(parts) > 2 else 1.0
        except ValueError:
            raise ConfigError(f"--fleet entry {entry!r}: tier must be a whole number, weight a number") from None
        if tier < 0 or not weight > 0 or not math.isfinite(weight):
            raise ConfigError(f"--fleet entry {entry!r}: tier must be >= 0 and weight > 0")
        members.append(Member(parts[0], tier, weight))
    if not members:
        raise ConfigError("--fleet: no trace given; expected PATH[:tier[:weight]],...")
    return members


def model_name(path: str) -> str:
    p = Path(path)
    return p.name if p.is_dir() else p.parent.name or p.stem


def cut(trace: RequestTrace | RateTrace, hours: float | None) -> RequestTrace | RateTrace:
    """The trace's first `hours` (all of it if None)."""
    if hours is None:
        return trace
    end_s = hours * 3600.0
    if isinstance(trace, RequestTrace):
        keep = trace.arrival_s < end_s
        return replace(trace, arrival_s=trace.arrival_s[keep], input_tokens=trace.input_tokens[keep],
                       output_tokens=trace.output_tokens[keep])
    n = max(1, math.ceil(end_s / trace.window_s))
    return replace(trace, rate_per_s=trace.rate_per_s[:n], client_rate_per_s=trace.client_rate_per_s[:, :n],
                   client_cv2=trace.client_cv2[:, :n], input_tokens=trace.input_tokens[:n],
                   output_tokens=trace.output_tokens[:n])


@dataclass
class Model:
    """One model's world: its workload on its own simulated cluster, and what the policy keeps for it."""

    name: str
    tier: int
    weight: float
    workload: object
    config: SimConfig
    needed: np.ndarray
    spec: object
    sim: object = None
    cluster: SimCluster | None = None
    state: object = None
    run: object = None
    shed: dict = field(default_factory=dict)
    guard: Guard = field(default_factory=Guard)
    held: list[int] = field(default_factory=list)  # GPUs held per tick (replicas placed + warm slots)
    top_missed: list[bool] = field(default_factory=list)  # per tick: the critical class missed its SLO
    waiting_since_s: float = math.inf  # first come first served: since when its pods wait for the limit

    def holding(self) -> int:
        c = self.cluster
        return (c.placed + c.warm_slots) * c.model.gpus_per_replica


def load(members: list[Member], *, hours: float | None, peak_replicas: int, tick_s: float, slo_s: float,
         seed: int) -> list[Model]:
    """The fleet's models; InputError (a bad trace) or ConfigError."""
    server = ServerModel()
    config = SimConfig(tick_s=tick_s, slo_s=slo_s, arrival_seed=seed, cluster=ClusterModel(), server=server)
    traces = [read_trace(m.path) for m in members]
    # aligned at t = 0 and cut together, so no model has arrivals after the run ends
    common_s = min([t.span_s for t in traces] + ([hours * 3600.0] if hours is not None else []))
    common_h = max(1, math.floor(common_s / tick_s)) * tick_s / 3600.0  # whole ticks: every arrival is served
    models, seen = [], {}
    for m, whole in zip(members, traces):
        trace = cut(whole, common_h)
        workload = build(trace, WorkloadConfig(peak_replicas=peak_replicas, classes=CLASSES,
                                               priority_mix=DEFAULT_MIX, server=server))
        needed = needed_replicas(workload, config)
        name = model_name(m.path)
        seen[name] = seen.get(name, 0) + 1
        name = name if seen[name] == 1 else f"{name}#{seen[name]}"
        spec = policyset.predictive_spec(config, max_replicas=policyset.replica_bound(needed))
        models.append(Model(name, m.tier, m.weight, workload, config, needed, spec))
    return models


def run_ticks(models: list[Model]) -> int:
    """The ticks every model's (cut) trace spans: `load` cut them all at the same whole tick."""
    return min(ticks(m.workload, m.config.tick_s) for m in models)


def shares(models: list[Model], limit: int) -> dict[str, int]:
    """Each model's fixed share of the limit, in proportion to its peak need (whole GPUs, largest remainder)."""
    peaks = {m.name: int(m.needed.max()) for m in models}
    total = sum(peaks.values()) or 1
    exact = {n: limit * p / total for n, p in peaks.items()}
    out = {n: math.floor(x) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: -(exact[n] - out[n]))[: limit - sum(out.values())]:
        out[n] += 1
    return out


def fleet_spec(models: list[Model], *, levels: str = "tier-major", warm_hold_s: float = 0.0) -> FleetSpec:
    """The fleet decision's spec: `levels` tier-major (the default order) or class-major."""
    tiers = sorted({m.tier for m in models})
    order = tuple((t, c) for c in CLASSES for t in tiers) if levels == "class-major" else ()
    return FleetSpec(classes=CLASSES, levels=order, warm_stabilization_s=warm_hold_s)


def _starts(models: list[Model], policy: str, limit: int, fixed: dict[str, int], spec: FleetSpec
            ) -> dict[str, int]:
    """Replicas each model starts with, ready: what its first cold start needs; under a limit, what the policy
    would give that need (the fleet decision for `fleet`, the peak-proportional share for the others)."""
    need = {m.name: initial_replicas(m.needed, m.config) for m in models}
    if not limit:
        return need
    if policy != "fleet":
        return {n: min(x, fixed[n]) for n, x in need.items()}
    mix = dict(zip(CLASSES, DEFAULT_MIX))
    demands = [ModelDemand(m.name, class_demand(Decision(replicas=need[m.name]), mix, CLASSES), tier=m.tier,
                           weight=m.weight) for m in models]
    allocation, _ = allocate(spec, demands, Budgets(fleet_gpus=limit), FleetState(), 0.0)
    return {n: a.replicas for n, a in allocation.models.items()}


def _reset(models: list[Model], policy: str, starts: dict[str, int]) -> None:
    for m in models:
        m.sim = traffic_sim(m.workload, m.config)
        m.cluster = SimCluster.started(m.config.cluster, replicas=starts[m.name], now=0.0)
        m.run = None if policy in ("fleet", "predictive") else policyset.policy(policy, m.config, m.needed)
        m.state = initial_state() if m.run is None else m.run.state
        m.shed, m.guard, m.held, m.top_missed, m.waiting_since_s = {}, Guard(), [], [], math.inf


def _decide(m: Model, signals, now: float) -> Decision:
    if m.run is None:
        decision, m.state = decide(m.spec, m.state, signals, now)
    else:
        decision, m.state = m.run.decide(m.run.spec, m.state, signals, now)
    return decision


def _demand(m: Model, decision: Decision, signals) -> ModelDemand:
    held = decision if decision.valid else Decision(replicas=m.cluster.replicas, shed=m.shed)
    return ModelDemand(name=m.name, demand_replicas=class_demand(held, signals.arrival_rate_by_priority, CLASSES),
                       tier=m.tier, weight=m.weight, warm_slots=decision.warm_slots if decision.valid else 0,
                       lead_time_s=decision.lead_time_s, sheddable=SHEDDABLE, shed=dict(held.shed))


def _tick_top_missed(m: Model, before: tuple[float, float]) -> None:
    if isinstance(m.sim, RateSim):
        met, total = float(m.sim.met[0]) - before[0], float(m.sim.total[0]) - before[1]
        m.top_missed.append(total > 0 and met / total < TOP_TARGET)


def _request_top_missed(m: Model, n: int) -> None:
    """Request-level: per arrival tick, whether under 99.9 % of its critical requests met the SLO."""
    if not isinstance(m.sim, RequestSim):
        return
    w, sim = m.workload, m.sim
    top = w.priority == 0
    index = np.minimum((w.arrival_s[top] // m.config.tick_s).astype(int), n - 1)
    met = ((sim.wait[top] <= sim.slo_s) & ~sim.shed[top]).astype(float)
    count = np.bincount(index, minlength=n)[:n]
    ok = np.bincount(index, weights=met, minlength=n)[:n]
    m.top_missed = list((count > 0) & (ok < TOP_TARGET * count))


@dataclass(frozen=True)
class _Rules:
    """What differs between the policies in one run: the limit, each model's fixed share, how it is enforced."""

    policy: str
    limit: int
    fixed: dict[str, int]

    @property
    def first_come(self) -> bool:
        return bool(self.limit) and self.policy in ("hpa", "keda")


def _signals(m: Model, rules: _Rules, now: float, reclaimable: int = 0):
    """What the model's controller reads; under a fixed share, the share as its budget (as a config cap); for
    `fleet`, lower tiers' GPUs the last fleet decision would reclaim for it at once as idle slots, as the fleet
    controller's readers count them (`policies.fleet.reclaimable`)."""
    s = m.sim.signals(now, m.cluster)
    if reclaimable and s.cluster is not None:
        s = replace(s, cluster=replace(s.cluster, idle_slots=s.cluster.idle_slots + reclaimable))
    if rules.policy == "predictive" and rules.limit and s.cluster is not None:
        share = rules.fixed[m.name]
        why = f"a fixed {share}-GPU share of the {rules.limit}-GPU limit"
        s = replace(s, cluster=replace(s.cluster, budget_replicas=share, budget_reason=why))
    return s


def _targets(models: list[Model], decisions: dict[str, Decision], allocation) -> dict[str, tuple]:
    """Per model (replicas, warm slots, shed levels) to apply; a model whose decision is invalid is left alone."""
    out = {}
    for m in models:
        d = decisions[m.name]
        if allocation is not None:
            a = allocation.models[m.name]
            out[m.name] = (a.replicas, a.warm_slots, dict(a.shed))
        elif d.valid:
            out[m.name] = (d.replicas, d.warm_slots, dict(d.shed))
    return out


def _apply(models: list[Model], targets: dict[str, tuple], decisions: dict[str, Decision], rules: _Rules,
           now: float) -> None:
    # scale-downs first (they free nodes), then first come first served: the model whose pods have waited
    # longest for the limit goes first
    def order(m: Model) -> tuple:
        wanted = targets[m.name][0] if m.name in targets else m.cluster.replicas
        return wanted >= m.cluster.replicas, m.waiting_since_s, m.name

    for m in sorted(models, key=order):
        if m.name not in targets:
            continue
        replicas, warm, shed = targets[m.name]
        if rules.first_come:
            replicas = _first_come(m, replicas, rules.limit - sum(x.holding() for x in models), now)
        _share_free_nodes(m, replicas, models, warm_too=rules.policy == "fleet")
        m.cluster.scale_to(replicas)
        m.cluster.warm_to(warm)
        m.shed = shed
        if decisions[m.name].valid:
            m.guard = Guard.of(decisions[m.name])


def _serve(m: Model, now: float, tick_s: float) -> None:
    m.held.append(m.holding())
    before = (float(m.sim.met[0]), float(m.sim.total[0])) if isinstance(m.sim, RateSim) else (0.0, 0.0)
    m.sim.serve(now, now + tick_s, m.cluster, m.shed, m.guard)
    _tick_top_missed(m, before)


def starts(models: list[Model], policy: str, *, limit: int, spec: FleetSpec | None = None) -> dict[str, int]:
    """Replicas each model starts with under `policy` (see `_starts`): what a live run starts from to match."""
    return _starts(models, policy, limit, shares(models, limit) if limit else {}, spec or fleet_spec(models))


def simulate(policy: str, models: list[Model], *, limit: int, n: int, spec: FleetSpec | None = None,
             starts: dict[str, int] | None = None) -> dict:
    """One policy over `n` ticks on the shared limit (0: none); its figures (see `figures`). `spec`: the fleet
    decision's (`fleet_spec`: tier-major, no warm hold, by default). `starts`: each model's replicas at t = 0
    (default: `_starts`; a live run's twin starts where the live run did)."""
    rules = _Rules(policy, limit, shares(models, limit) if limit else {})
    spec = spec or fleet_spec(models)
    _reset(models, policy, starts or _starts(models, policy, limit, rules.fixed, spec))
    fleet_state = FleetState()
    tick_s = models[0].config.tick_s
    reclaim: dict[str, int] = {}
    for tick in range(n):
        now = tick * tick_s
        for m in models:
            m.cluster.advance(now)
        signals = {m.name: _signals(m, rules, now, reclaim.get(m.name, 0)) for m in models}
        decisions = {m.name: _decide(m, signals[m.name], now) for m in models}
        allocation = None
        if policy == "fleet":
            allocation, fleet_state = allocate(
                spec, [_demand(m, decisions[m.name], signals[m.name]) for m in models],
                Budgets(fleet_gpus=limit or None), fleet_state, now)
            reclaim = {name: a.reclaimable_replicas for name, a in allocation.models.items()}
        _apply(models, _targets(models, decisions, allocation), decisions, rules, now)
        for m in models:
            _serve(m, now, tick_s)
    end = n * tick_s
    for m in models:
        m.cluster.advance(end)
        m.sim.finish(end)
        _request_top_missed(m, n)
    return figures(policy, models, limit=limit, guaranteed=rules.fixed)


def _share_free_nodes(m: Model, replicas: int, models: list[Model], *, warm_too: bool) -> None:
    """One node pool for the fleet: replicas `m` adds beyond its own free slots land on another model's idle
    node (freed, not yet removed) and, when warm capacity is pooled, on another model's ready placeholder,
    as the scheduler would place a pending pod; the pool is refilled behind it by the next decision. Each
    model has its own simulated cluster, so the node moves to `m`'s (`SimCluster.borrow`, with its times:
    the donor's idle or warm time is billed to `m`; the fleet's totals are exact)."""
    c = m.cluster
    short = replicas - c.replicas - c.ready_room()
    for other in models:
        if short <= 0:
            return
        if other is m or other.cluster.model.shape != c.model.shape:
            continue
        for warm in (False, True) if warm_too else (False,):
            while short > 0 and (slots := c.borrow(other.cluster, warm=warm)):
                short -= slots


def _first_come(m: Model, replicas: int, free_gpus: int, now: float) -> int:
    """The replicas a per-model policy gets under the limit: what it holds plus what is free; the rest wait
    (not created: a pod over the limit would hold nothing) and go first once GPUs free up."""
    held = m.cluster.replicas
    allowed = held + max(0, free_gpus) // m.cluster.model.gpus_per_replica
    if replicas <= allowed:
        m.waiting_since_s = math.inf
        return replicas
    m.waiting_since_s = min(m.waiting_since_s, now)
    return allowed


def inversions(models: list[Model], guaranteed: dict[str, int]) -> int:
    """Ticks where a lower tier holds more than its guaranteed share while a higher tier's critical misses."""
    if not guaranteed:
        return 0
    count = 0
    for t in range(len(models[0].held)):
        missed = [m.tier for m in models if t < len(m.top_missed) and m.top_missed[t]]
        if missed and any(m.tier > min(missed) and m.held[t] > guaranteed[m.name] for m in models):
            count += 1
    return count


def figures(policy: str, models: list[Model], *, limit: int, guaranteed: dict[str, int]) -> dict:
    rows = {}
    for m in models:
        costs = m.cluster.finish()
        outcome = m.sim.outcome()
        rows[m.name] = {
            "tier": m.tier,
            "slo_attainment": {c: round(v, 5) for c, v in outcome["slo_attainment"].items()},
            "shed_by_class": {c: round(v, 5) for c, v in outcome["shed_by_class"].items()},
            "gpu_hours": round(costs.replica_gpu_hours, 3),
            "warm_gpu_hours": round(costs.warm_pool_s * costs.gpus_per_replica / 3600.0, 3),
            "peak_gpus": max(m.held, default=0),
        }
    together = int(np.max(np.sum([m.held for m in models], axis=0))) if models[0].held else 0
    return {
        "policy": policy,
        "gpu_hours": round(sum(r["gpu_hours"] for r in rows.values()), 3),
        "warm_gpu_hours": round(sum(r["warm_gpu_hours"] for r in rows.values()), 3),
        "peak_gpus": sum(r["peak_gpus"] for r in rows.values()) if policy == "clairvoyant" else together,
        "priority_inversions": inversions(models, guaranteed) if limit else 0,
        "models": rows,
    }


def meets(row: dict) -> bool:
    a, s = row["slo_attainment"], row["shed_by_class"]
    return (all(a[c] >= t for c, t in targets(CLASSES, SHEDDABLE).items())
            and all(s[c] <= MAX_SHED for c in SHEDDABLE))


def table(result: dict) -> str:
    head = (f"{'policy':<12} {'model':<26} {'tier':>4} " + " ".join(f"{c[:4] + ' SLO':>9}" for c in CLASSES)
            + f" {'shed':>7} {'GPU-h':>8} {'warm GPU-h':>10} {'peak GPUs':>9} {'targets':>8}")
    lines = [head, "-" * len(head)]
    for p in result["policies"]:
        for name, r in p["models"].items():
            a = r["slo_attainment"]
            cells = " ".join(f"{a[c]:>9.3%}" for c in CLASSES)
            lines.append(f"{p['policy']:<12} {name[:26]:<26} {r['tier']:>4} {cells} "
                         f"{r['shed_by_class']['sheddable']:>7.2%} {r['gpu_hours']:>8.2f} {r['warm_gpu_hours']:>10.2f} "
                         f"{r['peak_gpus']:>9} {'met' if meets(r) else 'NOT met':>8}")
        lines.append(f"{p['policy']:<12} {'total':<26} {'':>4} {'':>{10 * len(CLASSES) - 1}} {'':>7} "
                     f"{p['gpu_hours']:>8.2f} {p['warm_gpu_hours']:>10.2f} {p['peak_gpus']:>9}   "
                     f"inversions {p['priority_inversions']}")
        lines.append("")
    return "\n".join(lines)


def goals(result: dict) -> list[str]:
    """The issue's goals, checked on this run's figures (each line says met or NOT met)."""
    rows = {p["policy"]: p for p in result["policies"]}
    fleet = rows.get("fleet")
    if fleet is None:
        return []
    lines = []
    all_met = all(meets(r) for r in fleet["models"].values())
    if not result["gpu_limit"]:
        if "predictive" in rows:
            fewer = fleet["gpu_hours"] < rows["predictive"]["gpu_hours"]
            lines.append(f"no limit: fleet meets every model's targets: {'met' if all_met else 'NOT met'}; "
                         f"GPU-hours {fleet['gpu_hours']:.2f} vs predictive {rows['predictive']['gpu_hours']:.2f}: "
                         f"{'fewer' if fewer else 'NOT fewer'}")
        return lines
    top = min(r["tier"] for r in fleet["models"].values())

    def top_met(p: dict) -> bool:
        return all(meets(r) for r in p["models"].values() if r["tier"] == top)

    lines.append(f"limit {result['gpu_limit']} GPUs: fleet keeps tier {top} at its targets: "
                 f"{'met' if top_met(fleet) else 'NOT met'}, {fleet['priority_inversions']} priority inversions "
                 f"(peak {fleet['peak_gpus']} GPUs held)")
    for name in ("predictive", "hpa", "keda"):
        if name in rows:
            p = rows[name]
            lines.append(f"  {name}: tier {top} {'met' if top_met(p) else 'NOT met'}, "
                         f"{p['priority_inversions']} inversions")
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench --fleet", description=__doc__.splitlines()[0])
    p.add_argument("--fleet", required=True, metavar="SPEC", help="PATH[:tier[:weight]],... (tier 0 highest)")
    p.add_argument("--gpu-limit", default="0", help="GPUs for the whole fleet; 0: no limit; P%%: P %% of the "
                   "summed clairvoyant peaks")
    p.add_argument("--hours", type=float, default=None, help="cut every trace at this many hours")
    p.add_argument("--policies", default="fleet,predictive,clairvoyant", help=f"from {','.join(POLICIES)}")
    p.add_argument("--peak-replicas", type=int, default=20, help="replicas each trace's busiest minute needs")
    p.add_argument("--tick-s", type=float, default=15.0)
    p.add_argument("--slo-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--warm-hold-s", type=float, default=0.0,
                   help="fleet: the pooled warm slots shrink only to their largest size within this window")
    p.add_argument("--levels", choices=("tier-major", "class-major"), default="tier-major",
                   help="fleet: the order of the (tier, class) levels")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def _limit(text: str) -> tuple[int | None, float | None]:
    """(GPUs, None) or (None, ratio of the clairvoyant peaks)."""
    try:
        if text.endswith("%"):
            ratio = float(text[:-1]) / 100.0
            if not 0 < ratio <= 10:
                raise ValueError
            return None, ratio
        gpus = int(text)
        if gpus < 0:
            raise ValueError
        return gpus, None
    except ValueError:
        raise ConfigError(f"--gpu-limit {text!r}: expected a whole number of GPUs >= 0, or a percentage "
                          f"like 85%") from None


def run_fleet(args: argparse.Namespace) -> dict:
    members = parse_spec(args.fleet)
    names = tuple(n.strip() for n in args.policies.split(",") if n.strip())
    unknown = set(names) - set(POLICIES)
    if unknown:
        raise ConfigError(f"--policies: unknown {sorted(unknown)}; choose from {list(POLICIES)}")
    if args.hours is not None and not args.hours > 0:
        raise ConfigError(f"--hours {args.hours:g}: expected a positive number of hours")
    gpus, ratio = _limit(args.gpu_limit)
    models = load(members, hours=args.hours, peak_replicas=args.peak_replicas, tick_s=args.tick_s,
                  slo_s=args.slo_s, seed=args.seed)
    n = run_ticks(models)
    rows = []
    if ratio is not None or "clairvoyant" in names:
        clairvoyant = simulate("clairvoyant", models, limit=0, n=n)
        if "clairvoyant" in names:
            rows.append(clairvoyant)
        if ratio is not None:
            gpus = max(1, math.floor(ratio * clairvoyant["peak_gpus"]))
    if not args.warm_hold_s >= 0:
        raise ConfigError(f"--warm-hold-s {args.warm_hold_s:g}: expected seconds >= 0")
    spec = fleet_spec(models, levels=args.levels, warm_hold_s=args.warm_hold_s)
    rows = [simulate(p, models, limit=gpus, n=n, spec=spec)
            for p in names if p != "clairvoyant"] + rows
    return {"gpu_limit": gpus, "hours": round(n * args.tick_s / 3600.0, 3), "ticks": n, "policies": rows}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        result = run_fleet(args)
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    limit = f"{result['gpu_limit']} GPUs" if result["gpu_limit"] else "none"
    print(f"fleet of {len(result['policies'][0]['models'])} models, {result['hours']:g} h ({result['ticks']} ticks), "
          f"GPU limit: {limit}")
    print(table(result))
    for line in goals(result):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
