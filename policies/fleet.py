"""`allocate(spec, models, budgets, state, now) -> (FleetDecision, FleetState)`: the fleet's decision of a tick.

Every model decides alone first (`decide`, unchanged): how many replicas it wants and how many warm slots
its own growth risk asks for. This module decides the fleet together, on one GPU budget. Pure: no clock,
no I/O; the previous allocation comes in as a `FleetState` and the new one goes out.

Demand. A model's replicas are split over its priority classes in proportion to their arrival rates
(`class_demand`): e.g. 10 replicas at 20 % critical, 50 % standard, 30 % sheddable are 2, 5 and 3
replicas, by cumulative rounding up (critical needs ceil(10 x 0.2) = 2, critical + standard ceil(10 x 0.7)
= 7, so standard is the next 5). Queueing is not linear in the rate, so this split is an approximation
that sums exactly to what the model's own decision asked for.

Levels. A level is (tier, class); tier 0 is the highest. Levels are served strictly in order, by default
tier-major (tier 0 critical, tier 0 standard, tier 0 sheddable, tier 1 critical, ...), configurable as an
explicit list (`FleetSpec.levels`, e.g. class-major: every tier's critical before any standard). Before
the levels, each model's `nominal_gpus` (a Kueue-style guaranteed quota, 0 by default) is served, quotas
that together exceed a cap in level order and by weighted fair share within a level (never by list order):
the stretch towards cohort semantics (nominal guaranteed, the rest borrowed while nobody with a claim needs
it, up to `borrowing_limit_gpus` beyond the nominal, reclaimed when they do).

Reclaim cost. Taking a borrowed GPU back costs the borrower a drain (its replica stops serving, its
in-flight requests finish: `drain_s`) and gives the lender a replica only after its start-up (`lead_time_s`).
A claim that ends sooner than that serves nobody and costs the borrower its replica. So a nominal claim
is served first from GPUs nobody held last tick, in the fleet and in its namespace when that is capped
(and from the claimant's own replicas). It takes GPUs that another model held last tick and still wants
only once the claim has gone unserved for its reclaim horizon: the claimant's lead time plus the longest
drain of the other models. This is the rule that bursts shorter than the cold start are queued or shed, not
provisioned for, applied to reclaims. With both
at 0 (the defaults) a reclaim is immediate. Once due, the allocation is the immediate one (a hypothesis
property): the delay only postpones. Priority between levels is never delayed: a higher level's claim
takes a lower level's GPUs at once.

Fair share within a level: weighted max-min in whole replicas, by progressive filling. The next replica
goes to the model with unmet demand at this level whose GPUs at this level divided by its weight are
smallest and whose replica still fits the fleet cap and its namespace's cap; a model whose replica does
not fit is passed over, so smaller shapes take what is left (work conserving: a level ends only when no
model with unmet demand has a replica that fits).

Hysteresis: a model keeps a tie while it is within what it held last tick (its key is lowered by half a
replica), so two equal claims on an odd last replica do not swap it tick to tick, and equal-weight models
at equal demand still end within one replica of each other. Demand itself is already stabilised by each
model's scale-down window, and each model's warm need by its growth risk, computed once per forecast
bucket. The pooled warm capacity can also be held: it shrinks only to the largest size of the last
`warm_stabilization_s` (0 by default: on the fleet benchmark a 600-s hold changed no attainment and cost
GPU-hours, docs/fleet.md).

Pooled warm capacity, per replica shape: the models' own warm needs are their growth risk in replicas
(what their demand may rise above their decision within a node provisioning time). Insured one by one they
sum; insured together, with independent risks, the quantile of the sum is about sqrt(sum of squares):
e.g. four models each needing 4 warm slots need 16 alone but ceil(sqrt(4 x 16)) = 8 pooled. Correlated
surges (one event hitting every model) break the independence; `warm_correlation_ratio` (0: independent,
1: fully correlated, the sum) blends the two. Placeholders are the fleet's: namespace caps do not apply to
them; within a budget, smallest shape first. Each model's part is apportioned by its share of the squared
risk, never above its own need, for actuators that keep placeholders per model (and its metrics).

Where warm slots rank when the budget binds. A model's warm need is its growth risk over its lead time,
start-up plus node provisioning. When the fleet is at its budget and a lower tier holds GPUs, a higher
tier's growth is served by reclaiming one: the node is there, so the wait is the lower tier's drain plus
the start-up, against the start-up alone from a warm slot. A slot held for the higher tier saves it that
drain and costs the lower tier a replica for as long as it is held. So the part of a tier's warm need that
ranks before lower tiers' replicas is its risk over that drain, the longest `drain_s` among the lower
tiers' models, taken as linear in time (a ramp): ceil(warm x drain / window) (`early_warm_slots`), the
window being the time its warm need covers growth over (`warm_window_s`, node provisioning; else its lead
time), the whole need when the drain is not shorter. It is reserved right after the tier's own
replicas when `FleetSpec.warm_after` is "tier" (a class name puts it right after that class of the tier;
"last", the default, ranks every warm slot after every replica: see FleetSpec), pooled over the tiers
insured so far, and given to that tier's models; the reasons say "1 warm slot for tier 0 before tier 2's
replicas". The rest of the pool (the fleet's whole need, as above) gets what the budget leaves after all
replicas. Without drains (the benchmark's simulator, where a reclaimed GPU is free at once) no warm slot
ranks early: ranking the whole need early there cost the lower tiers much and bought the top tier nothing
(docs/fleet.md).

Scale to zero. A model at zero (no replica wanted) has given its own warm slots back (policies/stages/idle.py).
Its wake still needs one replica at once, and a cold start from zero lands on a warm slot (a pod start-up)
or waits for a node. So the fleet counts, for each model at zero, a risk of `zero_wake_slots` (1) in the
pooled need of its shape: pooled, N idle models' wakes need about sqrt(N) slots (with independent wakes),
not N; the model's share of the pool is what covers it, within the budget left after every replica.

Invariants (tests/test_fleet_policy.py, hypothesis): never above the fleet cap or a namespace cap; a
level's allocation does not depend on any lower level's demand; equal weights at equal demand are within
one replica; more GPUs never lower any model's replicas when all models share one replica shape and no
nominal claim waits for its reclaim horizon (with
mixed shapes whole replicas make that impossible together with work conservation: with 5 GPUs a 4-GPU
replica that does not fit at its turn leaves them to a 1-GPU model, with 7 it fits and the 1-GPU model
gets less); no GPU left idle (replicas and warm slots count as held) while a model's replica with unmet
demand fits; only sheddable classes are shed, never below the model's own level; with one replica shape, a
lower tier holds a replica only once the early warm slots of every tier above it are reserved in full.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from policies.spec import PRIORITY_CLASSES
from policies.types import Decision

DEFAULT_CLASSES: tuple[str, ...] = tuple(sorted(PRIORITY_CLASSES, key=lambda c: -PRIORITY_CLASSES[c]))
NOMINAL = "nominal"  # the pseudo-class of the guaranteed (nominal) level, served before every other


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """How the fleet is ordered and smoothed. `levels`: (tier, class) pairs, highest first; empty: every
    tier present, tier-major over `classes` (highest class first); levels not named come after the named
    ones, in that default order."""

    classes: tuple[str, ...] = DEFAULT_CLASSES
    levels: tuple[tuple[int, str], ...] = ()
    warm_stabilization_s: float = 0.0
    warm_correlation_ratio: float = 0.0
    # where a tier's pooled warm slots rank: "last" (after every replica), "tier" (after the tier's own
    # replicas, before any lower tier's), or a class (right after the tier's level of that class). "last" by
    # default: in the one live fleet run with "tier" the lowest tier's critical class fell to 80.4 % (96-97 %
    # in the runs before) and the top tier's was not better (docs/closed-loop.md, "A fleet", run 10)
    warm_after: str = "last"
    # A model at zero (no replica wanted: scaled to zero) gives its own warm slots back, and its wake's first
    # replica is insured by the pooled warm capacity instead: a risk of this many slots in the pool (0: none).
    zero_wake_slots: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.zero_wake_slots, int) or self.zero_wake_slots < 0:
            raise ValueError(f"zero_wake_slots = {self.zero_wake_slots!r}: expected a whole number >= 0")
        unknown = sorted({c for _, c in self.levels} - set(self.classes))
        if unknown:
            raise ValueError(f"levels name classes {unknown}: expected classes among {self.classes}")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"levels = {self.levels!r}: a (tier, class) pair is named twice")
        if self.warm_after not in ("tier", "last", *self.classes):
            raise ValueError(f"warm_after = {self.warm_after!r}: expected 'tier', 'last' or one of {self.classes}")


@dataclass(frozen=True, slots=True)
class Budgets:
    """GPU caps: the fleet's (None: no cap) and per namespace (a namespace not named: no cap)."""

    fleet_gpus: int | None = None
    namespace_gpus: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """One model's own decision of the tick, as the fleet reads it. `demand_replicas`: per class, the
    replicas that class needs beyond the higher classes (see `class_demand`). `warm_slots`: its own warm
    need (growth risk in replicas). `sheddable`: classes the fleet may shed when it cannot serve them."""

    name: str
    demand_replicas: Mapping[str, int]
    gpus_per_replica: int = 1
    tier: int = 0
    weight: float = 1.0
    namespace: str = ""
    warm_slots: int = 0
    lead_time_s: float | None = None
    nominal_gpus: int = 0
    # Kueue's borrowingLimit: at most this many GPUs beyond `nominal_gpus` (None: no limit)
    borrowing_limit_gpus: int | None = None
    sheddable: tuple[str, ...] = ("sheddable",)
    shed: Mapping[str, float] = field(default_factory=dict)  # the model's own shed levels, kept as a floor
    drain_s: float = 0.0  # how long one of its replicas takes to drain when its GPUs are reclaimed
    # the time `warm_slots` covers growth over (its node provisioning time); None: its lead time
    warm_window_s: float | None = None

    def __post_init__(self) -> None:
        bad = [f"{c} = {n!r}" for c, n in self.demand_replicas.items() if not isinstance(n, int) or n < 0]
        if bad:
            raise ValueError(f"model {self.name!r}: demand_replicas must be whole numbers >= 0, got {', '.join(bad)}")
        if not isinstance(self.gpus_per_replica, int) or self.gpus_per_replica < 1:
            raise ValueError(f"model {self.name!r}: gpus_per_replica = {self.gpus_per_replica!r}, must be >= 1")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"model {self.name!r}: weight = {self.weight!r}, must be a finite number > 0")
        if not (self.drain_s >= 0 and math.isfinite(self.drain_s)) or not all(
                t is None or (t >= 0 and math.isfinite(t)) for t in (self.lead_time_s, self.warm_window_s)):
            raise ValueError(f"model {self.name!r}: drain_s = {self.drain_s!r}, lead_time_s = {self.lead_time_s!r} "
                             f"and warm_window_s = {self.warm_window_s!r} must be finite seconds >= 0")
        if self.nominal_gpus < 0 or self.warm_slots < 0 or (self.borrowing_limit_gpus or 0) < 0:
            raise ValueError(f"model {self.name!r}: nominal_gpus ({self.nominal_gpus}), borrowing_limit_gpus "
                             f"({self.borrowing_limit_gpus}) and warm_slots ({self.warm_slots}) must be >= 0")

    @property
    def max_gpus(self) -> float:
        """What the model may hold at most: its nominal quota plus its borrowing limit (inf: no limit)."""
        return math.inf if self.borrowing_limit_gpus is None else self.nominal_gpus + self.borrowing_limit_gpus

    @property
    def replicas_wanted(self) -> int:
        return sum(self.demand_replicas.values())


@dataclass(frozen=True, slots=True)
class Allocation:
    replicas: int
    warm_slots: int
    shed: Mapping[str, float]
    replicas_by_class: Mapping[str, int]
    reasons: tuple[str, ...] = ()
    # replicas of its shape it would get at once from GPUs lower tiers hold, the fleet cap binding (`reclaimable`)
    reclaimable_replicas: int = 0


@dataclass(frozen=True, slots=True)
class FleetDecision:
    models: Mapping[str, Allocation]
    warm_by_shape: Mapping[int, int]  # GPUs per replica -> pooled warm slots of that shape
    gpus_used: int
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FleetState:
    replicas: Mapping[str, int] = field(default_factory=dict)
    # per shape, (time, pooled need) within the warm stabilization window
    warm_recent: Mapping[int, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    # per model, since when its nominal claim has gone unserved (for the reclaim horizon)
    claim_since: Mapping[str, float] = field(default_factory=dict)


def class_demand(decision: Decision, rates_by_class: Mapping[str, float],
                 classes: tuple[str, ...] = DEFAULT_CLASSES) -> dict[str, int]:
    """A model's decided replicas split per class, highest first, by cumulative rounding up of the classes'
    arrival shares (module docstring). Without per-class rates every replica is the highest class's."""
    replicas = max(0, decision.replicas)
    # a rate that is not a finite number >= 0 (a broken counter) counts as no arrivals of that class
    rates = {c: float(r) if math.isfinite(r := rates_by_class.get(c, 0.0)) and r > 0 else 0.0 for c in classes}
    total = sum(rates.values())
    if total <= 0:
        return {c: (replicas if i == 0 else 0) for i, c in enumerate(classes)}
    out, cumulative_rate, given = {}, 0.0, 0
    for c in classes:
        cumulative_rate += rates[c]
        # round before ceil: 10 x 0.7 must be 7, not 8 from 7.000000000001
        upto = min(replicas, math.ceil(round(replicas * cumulative_rate / total, 9)))
        out[c] = upto - given
        given = upto
    out[classes[-1]] += replicas - given
    return out


def level_order(spec: FleetSpec, models: list[ModelDemand]) -> list[tuple[int, str]]:
    """`spec.levels` first, then every level of a present tier they do not name, tier-major: an explicit order
    that forgets a tier or a class serves it last, never not at all (its demand would get no replica)."""
    tiers = sorted({m.tier for m in models})
    default = [(t, c) for t in tiers for c in spec.classes]
    named = set(spec.levels)
    return list(spec.levels) + [lv for lv in default if lv not in named]


@dataclass
class _Fill:
    """The mutable tally of one allocation pass (local to `allocate`, never escapes it)."""

    free_gpus: float
    ns_free: dict[str, float]
    replicas: dict[str, int]
    by_class: dict[str, dict[str, int]]

    held_by: dict[str, str] = field(default_factory=dict)  # model -> the budget that last passed it over

    def fits(self, m: ModelDemand) -> bool:
        if (self.replicas[m.name] + 1) * m.gpus_per_replica > m.max_gpus:
            self.held_by[m.name] = "borrowing"
            return False
        if m.gpus_per_replica > self.free_gpus:
            self.held_by[m.name] = "fleet"
            return False
        if m.gpus_per_replica > self.ns_free.get(m.namespace, math.inf):
            self.held_by[m.name] = "namespace"
            return False
        return True

    def give(self, m: ModelDemand, cls: str) -> None:
        self.free_gpus -= m.gpus_per_replica
        if m.namespace in self.ns_free:
            self.ns_free[m.namespace] -= m.gpus_per_replica
        self.replicas[m.name] += 1
        self.by_class[m.name][cls] = self.by_class[m.name].get(cls, 0) + 1


def _fill_level(fill: _Fill, claims: list[tuple[ModelDemand, int, str]], previous: Mapping[str, int],
                admit: Callable[[ModelDemand], bool] | None = None) -> None:
    """Weighted max-min of whole replicas among `claims` (model, replicas wanted, class to book them to);
    `admit`, when given, may refuse a model's next replica that fits (it is then passed over, as when it
    does not fit)."""
    level_gpus = {m.name: 0.0 for m, _, _ in claims}
    wanted = {m.name: n for m, n, _ in claims}
    heap: list[tuple[float, str, int, ModelDemand, str]] = []

    def push(m: ModelDemand, cls: str) -> None:
        # half a replica of credit while within last tick's replicas: ties go to the incumbent (hysteresis)
        credit = 0.5 * m.gpus_per_replica if fill.replicas[m.name] < previous.get(m.name, 0) else 0.0
        key = (level_gpus[m.name] + m.gpus_per_replica - credit) / m.weight
        heapq.heappush(heap, (key, m.name, id(m), m, cls))

    for m, n, cls in claims:
        if n > 0:
            push(m, cls)
    while heap:
        _, _, _, m, cls = heapq.heappop(heap)
        if not fill.fits(m) or (admit is not None and not admit(m)):
            continue  # passed over: smaller replicas may still use what is left
        fill.give(m, cls)
        level_gpus[m.name] += m.gpus_per_replica
        wanted[m.name] -= 1
        if wanted[m.name] > 0:
            push(m, cls)


def _level_name(tier: int, cls: str) -> str:
    return f"tier {tier} {cls}"


def _pool_need(models: list[ModelDemand], correlation: float) -> dict[int, int]:
    shapes: dict[int, list[int]] = {}
    for m in models:
        if m.warm_slots > 0:
            shapes.setdefault(m.gpus_per_replica, []).append(m.warm_slots)
    need = {}
    for g, risks in shapes.items():
        independent = math.sqrt(sum(r * r for r in risks))
        need[g] = math.ceil(round(independent + correlation * (sum(risks) - independent), 9))
    return need


def _stabilize_warm(spec: FleetSpec, state: FleetState, need: dict[int, int], now: float
                    ) -> tuple[dict[int, int], dict[int, tuple[tuple[float, int], ...]]]:
    held, recent = {}, {}
    for g in set(need) | set(state.warm_recent):
        window = tuple((t, n) for t, n in state.warm_recent.get(g, ()) if now - t < spec.warm_stabilization_s)
        window += ((now, need.get(g, 0)),)
        recent[g] = window
        held[g] = max(n for _, n in window)
    return held, {g: w for g, w in recent.items() if any(n for _, n in w)}


def _apportion(total: int, risks: dict[str, int]) -> dict[str, int]:
    """`total` slots over models by their squared risk, none above its own risk, largest remainder first
    (deterministic by name)."""
    weights = {n: r * r for n, r in risks.items() if r > 0}
    out = {n: 0 for n in risks}
    if not weights or total <= 0:
        return out
    s = sum(weights.values())
    exact = {n: total * w / s for n, w in weights.items()}
    for n, x in exact.items():
        out[n] = min(risks[n], math.floor(x))
    left = min(total, sum(risks[n] for n in weights)) - sum(out.values())
    while left > 0:
        open_ = sorted((n for n in weights if out[n] < risks[n]), key=lambda n: (-(exact[n] - out[n]), n))
        for n in open_[:left]:
            out[n] += 1
        left -= len(open_[:left])
    return out


def _model_reasons(m: ModelDemand, fill: _Fill, budgets: Budgets, levels_unmet: list[str],
                   shed: Mapping[str, float], borrowed: float, lent_to: list[str]) -> list[str]:
    got, want = fill.replicas[m.name], m.replicas_wanted
    reasons = []
    if got < want:
        what, cap = {
            "fleet": ("fleet budget", budgets.fleet_gpus),
            "namespace": (f"namespace {m.namespace!r} budget", budgets.namespace_gpus.get(m.namespace)),
            "borrowing": (f"its nominal {m.nominal_gpus} + borrowing limit {m.borrowing_limit_gpus}", m.max_gpus),
        }[fill.held_by.get(m.name, "fleet")]
        reasons.append(f"capped by {what} ({cap} GPUs): {got} of {want} replicas, levels served in order "
                       f"(tier 0 critical first); {', '.join(levels_unmet) or 'its levels'} not fully served")
        for cls, fraction in shed.items():
            if fraction > m.shed.get(cls, 0.0):
                reasons.append(f"shedding {fraction:.0%} of {cls}: its replicas are beyond the fleet budget")
        kept = [c for c in m.demand_replicas if c not in m.sheddable
                and fill.by_class[m.name].get(c, 0) < m.demand_replicas[c]]
        if kept:
            reasons.append(f"{', '.join(kept)} under-served and never shed: requests queue")
    if borrowed > 0:
        reasons.append(f"{borrowed:g} GPUs beyond its nominal {m.nominal_gpus} borrowed from the fleet, "
                       f"reclaimed when a model with a claim needs them")
    if lent_to:
        reasons.append(f"{', '.join(lent_to)} until {m.name} needs them")
    return reasons


@dataclass(frozen=True)
class _Reclaim:
    """Which nominal claims may reclaim GPUs others held last tick (`due`), and what nobody held: in the fleet
    (`room_gpus`) and in each capped namespace (`ns_room_gpus`)."""

    due: frozenset[str]
    room_gpus: float
    wait_s: dict[str, float]  # per claim not yet due, how long until it is
    ns_room_gpus: dict[str, float] = field(default_factory=dict)


def horizon_s(m: ModelDemand, models: list[ModelDemand]) -> float:
    """What reclaiming for `m` costs in time: its start-up plus the longest drain among the others."""
    return (m.lead_time_s or 0.0) + max((o.drain_s for o in models if o is not m), default=0.0)


def _reclaim(models: list[ModelDemand], budgets: Budgets, state: FleetState, now: float) -> _Reclaim:
    def held(ms: list[ModelDemand]) -> int:
        return sum(min(state.replicas.get(m.name, 0), m.replicas_wanted) * m.gpus_per_replica for m in ms)

    room = math.inf if budgets.fleet_gpus is None else max(0.0, budgets.fleet_gpus - held(models))
    # a namespace's cap binds as the fleet's does: GPUs its other models held last tick are not free room
    ns_room = {ns: max(0.0, cap - held([m for m in models if m.namespace == ns]))
               for ns, cap in budgets.namespace_gpus.items()}
    due, wait = set(), {}
    for m in models:
        left = horizon_s(m, models) - (now - state.claim_since.get(m.name, now))
        if left <= 0:
            due.add(m.name)
        else:
            wait[m.name] = left
    return _Reclaim(frozenset(due), room, wait, ns_room)


def _serve_nominal(spec: FleetSpec, models: list[ModelDemand], fill: _Fill, remaining: dict[str, dict[str, int]],
                   reclaim: _Reclaim, previous: Mapping[str, int]) -> None:
    """The guaranteed level: each model up to its nominal quota, booked to its highest classes. Quotas that
    together exceed a cap are served as the levels are (level order, weighted fair share within a level), not
    in the models' list order. A claim not yet due gets only its own last replicas plus what nobody held last
    tick, in the fleet and in its namespace."""
    room, ns_room = reclaim.room_gpus, dict(reclaim.ns_room_gpus)
    quota = {m.name: m.nominal_gpus // m.gpus_per_replica for m in models}

    def admit(m: ModelDemand) -> bool:
        nonlocal room
        if fill.replicas[m.name] < previous.get(m.name, 0) or m.name in reclaim.due:
            return True
        if min(room, ns_room.get(m.namespace, math.inf)) < m.gpus_per_replica:
            return False  # beyond its own replicas: only from the room
        room -= m.gpus_per_replica
        if m.namespace in ns_room:
            ns_room[m.namespace] -= m.gpus_per_replica
        return True

    for tier, cls in level_order(spec, models):
        claims = [(m, min(quota[m.name], remaining[m.name].get(cls, 0)), cls) for m in models if m.tier == tier]
        before = {m.name: fill.replicas[m.name] for m, _, _ in claims}
        _fill_level(fill, claims, previous, admit)
        for m, _, _ in claims:
            given = fill.replicas[m.name] - before[m.name]
            remaining[m.name][cls] -= given
            quota[m.name] -= given


def _claims_unserved(models: list[ModelDemand], fill: _Fill, state: FleetState, now: float) -> dict[str, float]:
    """Since when each model's nominal claim (its nominal quota, at most its demand) has gone unserved."""
    out = {}
    for m in models:
        claim = min(m.nominal_gpus // m.gpus_per_replica, m.replicas_wanted)
        if fill.replicas[m.name] < claim:
            out[m.name] = state.claim_since.get(m.name, now)
    return out


def early_warm_slots(m: ModelDemand, models: list[ModelDemand]) -> int:
    """The part of `m`'s warm need that ranks before lower tiers' replicas: its growth risk over what a reclaim
    of a lower tier adds to its start-up, the longest drain among them. Its warm need is its risk over its
    warm window (node provisioning; its lead time when not given); when the limit binds, the node is there,
    held by a lower tier, and a slot saves only that drain. Taken as linear in time (a ramp):
    ceil(warm x drain / window). No drain (a reclaim that frees the GPU at once): 0, every warm slot ranks
    after every replica. Not the lead time when the window is known: it drops to the start-up while a
    pooled slot is free, which would inflate this."""
    drain_s = max((o.drain_s for o in models if o.tier > m.tier), default=0.0)
    window_s = m.warm_window_s if m.warm_window_s is not None else m.lead_time_s
    if drain_s <= 0 or m.warm_slots == 0:
        return 0
    if not window_s or window_s <= drain_s:
        return m.warm_slots
    return math.ceil(round(m.warm_slots * drain_s / window_s, 9))


def warm_points(spec: FleetSpec, models: list[ModelDemand]) -> dict[tuple[int, str], list[int]]:
    """After which level each tier's warm slots are reserved (`FleetSpec.warm_after`); a tier not named here
    (warm_after "last", or a tier without a level in an explicit order) gets its warm slots after every level."""
    if spec.warm_after == "last":
        return {}
    order = level_order(spec, models)
    points: dict[tuple[int, str], list[int]] = {}
    for tier in sorted({m.tier for m in models}):
        own = [lv for lv in order if lv[0] == tier]
        named = [lv for lv in own if lv[1] == spec.warm_after]
        if own:
            points.setdefault((named or own)[-1], []).append(tier)
    return points


@dataclass
class _Warm:
    """The pooled warm slots reserved so far (per shape), each model's share, and for the reasons which tier's
    slots were reserved before which level."""

    correlation: float
    reserved: dict[int, int] = field(default_factory=dict)
    shares: dict[str, int] = field(default_factory=dict)
    insured: list[ModelDemand] = field(default_factory=list)
    early: list[tuple[int, int, int]] = field(default_factory=list)  # (tier, shape, slots) reserved early

    def reserve(self, fill: "_Fill", models: list[ModelDemand], need: dict[int, int]) -> dict[int, int]:
        """Up to `need` per shape in all (what is already reserved counts), within what the budget leaves,
        smallest shape first; the new slots are apportioned to `models`. Returns the new slots per shape."""
        added = {}
        for g in sorted(need):
            want = max(0, need[g] - self.reserved.get(g, 0))
            n = want if fill.free_gpus == math.inf else min(want, int(fill.free_gpus // g))
            fill.free_gpus -= n * g
            self.reserved[g] = self.reserved.get(g, 0) + n
            added[g] = n
            left = {m.name: m.warm_slots - self.shares.get(m.name, 0) for m in models if m.gpus_per_replica == g}
            for name, k in _apportion(n, left).items():
                self.shares[name] = self.shares.get(name, 0) + k
        return added

    def tiers(self, fill: "_Fill", models: list[ModelDemand], tiers: list[int]) -> None:
        """The pooled early need (`early_warm_slots`) of every tier insured so far plus `tiers`, reserved for
        `tiers`' models."""
        new = [replace(m, warm_slots=early_warm_slots(m, models)) for m in models if m.tier in tiers]
        self.insured += new
        for g, n in self.reserve(fill, new, _pool_need(self.insured, self.correlation)).items():
            if n:
                self.early.extend((t, g, n) for t in tiers)


def _serve_levels(spec: FleetSpec, models: list[ModelDemand], fill: _Fill, remaining: dict[str, dict[str, int]],
                  previous: Mapping[str, int], warm: _Warm) -> dict[str, list[str]]:
    """Every level in order, each tier's warm slots after its point (`warm_points`); per model, the levels it
    was not fully served at."""
    unmet: dict[str, list[str]] = {m.name: [] for m in models}
    points = warm_points(spec, models)
    for tier, cls in level_order(spec, models):
        claims = [(m, remaining[m.name].get(cls, 0), cls) for m in models if m.tier == tier]
        before = {m.name: fill.replicas[m.name] for m, _, _ in claims}
        _fill_level(fill, claims, previous)
        for m, n, _ in claims:
            if fill.replicas[m.name] - before[m.name] < n:
                unmet[m.name].append(_level_name(tier, cls))
        if (tier, cls) in points:
            warm.tiers(fill, models, points[(tier, cls)])
    return unmet


@dataclass(frozen=True)
class _Pool:
    slots: dict[int, int]  # per shape, kept
    held: dict[int, int]  # per shape, wanted (after the hold window)
    recent: dict[int, tuple[tuple[float, int], ...]]
    shares: dict[str, int]  # per model, its part of its shape's pool


def _pool(spec: FleetSpec, models: list[ModelDemand], fill: _Fill, state: FleetState, now: float,
          warm: _Warm) -> _Pool:
    """The rest of the pooled warm capacity, after every level: the fleet's whole pooled need (held for the
    stabilization window) beyond what the tiers reserved at their points, within what the budget leaves."""
    held, recent = _stabilize_warm(spec, state, _pool_need(models, spec.warm_correlation_ratio), now)
    warm.reserve(fill, models, held)
    slots = {g: warm.reserved.get(g, 0) for g in held}
    return _Pool(slots, held, recent, {m.name: warm.shares.get(m.name, 0) for m in models})


def _shed(m: ModelDemand, by_class: Mapping[str, int]) -> dict[str, float]:
    """The model's own shed levels, raised for sheddable classes by the fraction the budget leaves uncovered."""
    shed = dict(m.shed)
    for cls in m.sheddable:
        want = m.demand_replicas.get(cls, 0)
        if want > 0 and by_class.get(cls, 0) < want:
            shed[cls] = max(shed.get(cls, 0.0), round(1.0 - by_class.get(cls, 0) / want, 3))
    return shed


def _lending(models: list[ModelDemand], fill: _Fill) -> tuple[dict[str, float], dict[str, str]]:
    """GPUs each model holds beyond its nominal quota, and for each model under its quota what it lends."""
    held = {m.name: fill.replicas[m.name] * m.gpus_per_replica for m in models}
    borrowed = {m.name: float(max(0, held[m.name] - m.nominal_gpus)) if m.nominal_gpus else 0.0 for m in models}
    takers = ", ".join(n for n, b in borrowed.items() if b > 0)
    lent = {m.name: f"{m.nominal_gpus - held[m.name]:g} GPUs of its nominal lent to {takers}" for m in models
            if takers and m.nominal_gpus and held[m.name] < m.nominal_gpus}
    return borrowed, lent


def _pool_reasons(spec: FleetSpec, models: list[ModelDemand], pool: _Pool) -> list[str]:
    reasons = []
    for g in sorted(pool.slots):
        if not pool.held[g]:
            continue
        risks = sorted(m.warm_slots for m in models if m.gpus_per_replica == g and m.warm_slots)
        capped = "; capped by the budget" if pool.slots[g] < pool.held[g] else ""
        reasons.append(f"warm pool {g}-GPU: {pool.slots[g]} slots pooled for risks {risks} (alone {sum(risks)}; "
                       f"held for {spec.warm_stabilization_s:.0f} s{capped})")
    return reasons


def _short_of_fleet(m: ModelDemand, fill: _Fill) -> bool:
    """`m` got fewer replicas than it wanted because of the fleet budget (not its namespace or borrowing)."""
    return fill.replicas[m.name] < m.replicas_wanted and fill.held_by.get(m.name, "fleet") == "fleet"


def _warm_ahead(models: list[ModelDemand], fill: _Fill, warm: _Warm) -> list[tuple[int, str]]:
    """Per tier whose warm slots were reserved before a lower tier left short: (tier, "1 warm slot for tier 0
    before tier 2's replicas")."""
    out = []
    for tier, g, n in warm.early:
        short = sorted({m.tier for m in models if m.tier > tier and _short_of_fleet(m, fill)})
        if short:
            lower = " and ".join(f"tier {t}" for t in short)
            out.append((tier, f"{n} warm slot{'s' if n != 1 else ''} for tier {tier} before {lower}'s replicas "
                              f"({g} GPU each: tier {tier}'s growth risk, served from a slot without a lower "
                              f"tier's drain)"))
    return out


def _shed_first(spec: FleetSpec, models: list[ModelDemand], fill: _Fill) -> list[tuple[int, dict[str, int]]]:
    """The GPUs the fleet would take back first, as (tier, GPUs per model) per level from the last one: the
    trailing levels whose class is sheddable for every model holding GPUs there (levels holding none are
    passed over; the first that holds GPUs of a class never shed ends the run)."""
    out = []
    for tier, cls in reversed(level_order(spec, models)):
        held = {m.name: fill.by_class[m.name].get(cls, 0) * m.gpus_per_replica for m in models if m.tier == tier}
        if not any(held.values()):
            continue
        if any(n and cls not in m.sheddable for m in models if m.tier == tier and (n := held[m.name])):
            break
        out.append((tier, held))
    return out


def reclaimable(spec: FleetSpec, models: list[ModelDemand], fill: _Fill, budgets: Budgets) -> dict[str, int]:
    """Per model, the replicas of its shape it would be given at once, without a new node, from what lower
    tiers hold for their sheddable classes (and what the cap leaves over), when the fleet cap binds: 0 without
    a cap or while a replica of its shape still fits under it (a new node comes then, not a reclaim), and
    within its own borrowing and namespace limits. Its own decision counts them as idle slots
    (autoscaler/fleet/model.py; the benchmark's `fleet` policy likewise): such a GPU is paid for already and
    serves it after a drain and a start-up, with no node to provision, so its lead time drops the node
    provisioning and a burst it has not yet confirmed is ordered onto it, as onto a free warm slot
    (stages/combine.py). Only the trailing sheddable levels (`_shed_first`): if the burst ends, what it cost is
    sheddable requests shed for a scale-down window, the first thing the fleet sheds anyway; a lower tier's
    critical or standard replicas are never counted (on the benchmark, counting every lower-tier GPU cost tier
    2's critical class 26 points at 85 % of fleet A's peaks and bought tier 0 nothing, docs/fleet.md). A
    lower tier's nominal quota is guaranteed before every level, so it is not counted either."""
    out = {m.name: 0 for m in models}
    if budgets.fleet_gpus is None:
        return out
    trailing = _shed_first(spec, models, fill)
    held = {m.name: fill.replicas[m.name] * m.gpus_per_replica for m in models}
    by_name = {m.name: m for m in models}
    for m in models:
        g = m.gpus_per_replica
        if fill.free_gpus >= g:
            continue
        spare: dict[str, int] = {}
        for tier, gpus_at in trailing:
            if tier > m.tier:
                for name, n in gpus_at.items():
                    spare[name] = spare.get(name, 0) + n
        # a lower tier's nominal quota is guaranteed before every level: not reclaimable by priority
        spare = {name: min(n, max(0, held[name] - by_name[name].nominal_gpus)) for name, n in spare.items()}
        gpus = sum(spare.values()) + max(0.0, fill.free_gpus)
        if m.namespace in fill.ns_free:
            same = sum(n for name, n in spare.items() if by_name[name].namespace == m.namespace)
            gpus = min(gpus, fill.ns_free[m.namespace] + same)
        gpus = min(gpus, m.max_gpus - held[m.name])
        out[m.name] = int(gpus // g)
    return out


def allocate(spec: FleetSpec, models: list[ModelDemand], budgets: Budgets, state: FleetState, now: float
             ) -> tuple[FleetDecision, FleetState]:
    """One tick of the fleet decision (module docstring). `now`: the tick's time, for the warm pool's
    stabilization window only. Model names must be unique."""
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    fill = _Fill(
        free_gpus=math.inf if budgets.fleet_gpus is None else max(0, budgets.fleet_gpus),
        ns_free={ns: float(max(0, cap)) for ns, cap in budgets.namespace_gpus.items()},
        replicas={m.name: 0 for m in models},
        by_class={m.name: {} for m in models},
    )
    at_zero = {m.name for m in models if m.replicas_wanted == 0 and m.warm_slots == 0 and spec.zero_wake_slots}
    models = [replace(m, warm_slots=spec.zero_wake_slots) if m.name in at_zero else m for m in models]
    remaining = {m.name: dict(m.demand_replicas) for m in models}
    reclaim = _reclaim(models, budgets, state, now)
    _serve_nominal(spec, models, fill, remaining, reclaim, state.replicas)
    warm = _Warm(spec.warm_correlation_ratio)
    unmet = _serve_levels(spec, models, fill, remaining, state.replicas, warm)
    replica_gpus = sum(fill.replicas[m.name] * m.gpus_per_replica for m in models)
    pool = _pool(spec, models, fill, state, now, warm)
    reclaim_to = reclaimable(spec, models, fill, budgets)
    ahead = _warm_ahead(models, fill, warm)
    borrowed, lent = _lending(models, fill)
    unserved = _claims_unserved(models, fill, state, now)
    out = {}
    for m in models:
        shed = _shed(m, fill.by_class[m.name])
        lent_to = [lent[m.name]] if m.name in lent else []
        reasons = _model_reasons(m, fill, budgets, unmet[m.name], shed, borrowed[m.name], lent_to)
        if m.name in unserved and m.name in reclaim.wait_s:
            reasons.append(f"nominal claim waits {reclaim.wait_s[m.name]:.0f} s more before reclaiming GPUs others "
                           f"hold (a reclaim costs {horizon_s(m, models):.0f} s: its start-up and their drain)")
        share = pool.shares.get(m.name, 0)
        if share:
            reasons.append(f"warm pool: {share} of the {pool.slots[m.gpus_per_replica]} pooled "
                           f"{m.gpus_per_replica}-GPU slots (its own risk alone: {m.warm_slots})"
                           + (": at zero, for its wake's first replica" if m.name in at_zero else ""))
        elif m.name in at_zero:
            reasons.append("at zero: no pooled warm slot for its wake within the budget (a wake waits for a node)")
        if _short_of_fleet(m, fill):
            reasons.extend(r for t, r in ahead if t < m.tier)
        if reclaim_to[m.name]:
            reasons.append(f"{reclaim_to[m.name]} replicas' GPUs reclaimable at once from lower tiers' sheddable "
                           f"classes (the fleet budget binds): its next tick counts them as idle slots (a drain "
                           f"and a start-up, no node to provision)")
        out[m.name] = Allocation(replicas=fill.replicas[m.name], warm_slots=share, shed=shed,
                                 replicas_by_class=dict(fill.by_class[m.name]), reasons=tuple(reasons),
                                 reclaimable_replicas=reclaim_to[m.name])
    used = replica_gpus + sum(g * n for g, n in pool.slots.items())
    decision = FleetDecision(models=out, warm_by_shape=pool.slots, gpus_used=int(used),
                             reasons=tuple(_pool_reasons(spec, models, pool) + [r for _, r in ahead]))
    return decision, FleetState(replicas=dict(fill.replicas), warm_recent=pool.recent, claim_since=unserved)
