"""Values that flow through the decision core.

Design: `decide(spec, state, signals, now)` is a pure function. Everything it needs arrives as one of the
values below and everything it remembers leaves as a new `PolicyState`; nothing here reads a clock or does I/O.

Invariants:
- Every measured value is a `Sample` carrying the time it was taken, so staleness is judged against the `now`
  passed in, never against a wall clock.
- A missing value is `None`, never zero: "no data" and "no demand" are different facts.
- All values are frozen: a decision can be replayed and compared bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, TypeVar


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured value and the time (seconds, same clock as `now`) it was sampled."""

    value: float
    at_s: float

    def usable(self, now: float, max_age_s: float) -> bool:
        return math.isfinite(self.value) and self.value >= 0.0 and 0.0 <= now - self.at_s <= max_age_s


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What the Kubernetes API says about the target and its warm pool."""

    spec_replicas: int
    ready_replicas: int
    starting_replicas: int = 0
    unschedulable_pods: int = 0  # waiting for a node (normal while one is provisioned)
    # ...of which the node provisioner said it cannot place them (e.g. a GPU limit), and its words
    no_capacity_pods: int = 0
    no_capacity_reason: str = ""
    oldest_unschedulable_s: float = 0.0  # how long the longest-waiting pod has waited for a node
    warm_slots_ready: int = 0
    # Free replica-shaped capacity on nodes that exist (idle nodes, room on partly used ones): lands a
    # replica after its start-up only, like a warm slot, at no extra cost.
    idle_slots: int = 0
    # Replicas the GPU budget allows in all (config caps, a Kueue ClusterQueue's quota), in the replica's shape,
    # and what sets it (see stages/budget.py); None: no budget applies.
    budget_replicas: int | None = None
    budget_reason: str = ""
    # GPUs the target holds on nodes (replicas and warm placeholders) and their price per hour, if known:
    # reported with the decision, not used to size it.
    gpus_held: float = 0.0
    gpu_cost_per_hour: float | None = None
    # Placement -> Ready durations of pods that became Ready since the previous tick.
    startup_durations_s: tuple[float, ...] = ()
    # (node type, creation -> placement) of pods placed since the previous tick on a node created after them:
    # what waiting for a new node cost a replica (see stages/leadtime.py).
    node_waits_s: tuple[tuple[str, float], ...] = ()
    at_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Signals:
    """One snapshot per tick. Demand signals (arrival, tokens) do not depend on the replica count; symptoms
    (queue, in-flight, latency, memory) do."""

    cluster: ClusterState | None = None
    queue_depth: Sample | None = None
    in_flight: Sample | None = None
    p99_latency_s: Sample | None = None
    gpu_memory_headroom_ratio: Sample | None = None
    token_rate_per_s: Sample | None = None
    arrival_rate_per_s: Sample | None = None
    # Mean time a request occupies a slot (prefill + decode, no queueing), e.g.
    # rate(vllm:request_inference_time_seconds_sum[1m]) / rate(vllm:request_inference_time_seconds_count[1m]).
    service_time_s: Sample | None = None
    # Alternative to arrival_rate_per_s: a raw monotonic request counter; its rate is derived here and a
    # decrease is treated as a counter reset (that tick's rate is unknown, not negative).
    arrivals_total: Sample | None = None
    # Per-priority arrival rates as the admission endpoint counts them (name -> req/s), for shedding.
    arrival_rate_by_priority: Mapping[str, float] = field(default_factory=dict)
    # Requests held at the gateway waiting for a replica while the model is at zero (llm-d's flow-control
    # queue, the admission endpoint's holds): demand that wakes a model scaled to zero (stages/idle.py).
    held_requests: Sample | None = None


# The measured signals, in field order: every reader of samples (the loop, recordings, sanitizing) uses this list.
SAMPLE_SIGNALS: tuple[str, ...] = tuple(f.name for f in fields(Signals) if f.type == "Sample | None")


@dataclass(frozen=True, slots=True)
class Clean:
    """Signals after sanitizing: plain floats or None, plus what was dropped and why."""

    cluster: ClusterState | None
    queue_depth: float | None
    in_flight: float | None
    p99_latency_s: float | None
    gpu_memory_headroom_ratio: float | None
    token_rate_per_s: float | None
    arrival_rate_per_s: float | None
    service_time_s: float | None
    arrival_rate_by_priority: Mapping[str, float]
    dropped: tuple[str, ...]
    held_requests: float | None = None


@dataclass(frozen=True)  # no __slots__: `changed` copies its __dict__, as PolicyState's does
class ForecastState:
    """Bucketed demand history and the fitted exponential-smoothing model.

    The model is refitted by statsmodels on a schedule; between refits each closed bucket updates level,
    trend and season with the Holt-Winters recursion using the fitted smoothing parameters (cheap, exact
    continuation of the fitted filter). The forecaster copies it two to three times a tick, with `changed`:
    `dataclasses.replace` runs the frozen `__init__`, one guarded assignment for each of its 29 fields."""

    bucket_start_s: float | None = None  # None: the history has not begun (see forecast.py, "Before the first request")
    # When the model's first request was read (its first non-zero arrival rate) while the history had not begun.
    first_demand_s: float | None = None
    bucket_sum: float = 0.0
    bucket_n: int = 0
    history: tuple[float, ...] = ()
    kind: str = "none"  # none | level | holt | holt-winters
    fitted_at_s: float | None = None
    fitted_buckets: int = 0  # history length at the last fit
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0
    phi: float = 1.0
    level: float = 0.0
    trend: float = 0.0
    season: tuple[float, ...] = ()
    season_pos: int = 0  # index into `season` of the next bucket
    # Recent per-tick ratios observed rate / model's expected rate: the within-bucket burst envelope.
    ratios: tuple[float, ...] = ()
    # Recent per-tick observed rates (same window): the absolute burst envelope.
    rates: tuple[float, ...] = ()
    # The same two windows in ascending order, kept in step with them (forecast.py, `_slide`), so that the
    # envelope's quantiles are an index, not a sort of the window every tick. Empty or of another length
    # than its window (a state built by hand): the quantile sorts the window.
    ratios_sorted: tuple[float, ...] = ()
    rates_sorted: tuple[float, ...] = ()
    # The classes never shed, per tick, in step with `rates`: the tick's rate times its share of them (the whole
    # rate when a tick's classes were not measured: an unknown mix counts as protected, which cuts nothing): a
    # burst's own protected share is read from it (forecast.py, `recurring_only`). Of another length than
    # `rates` (a state built by hand): no share, no cut.
    protected_rates: tuple[float, ...] = ()
    # Start of an abrupt drop to (near) zero that the model finds implausible: an ingress outage.
    outage_since_s: float | None = None
    # What such a drop interrupted (the rate the model expected when it began), remembered through the
    # silence however long, and when traffic came back after it (see forecast.py, "Silence").
    interrupted_per_s: float | None = None
    returned_at_s: float | None = None
    interrupted_at_s: float | None = None  # when that silence began
    # The share of arrivals in the classes that are never shed, last measured, and its value when the
    # silence began: the capacity kept through the silence for those classes (forecast.py, "Silence").
    protected_share_ratio: float | None = None
    interrupted_protected_ratio: float | None = None
    # Conformal calibration of the upper bound at the lead time (see forecast.py, "Calibration"): the bounds
    # issued and not yet due, as (due time, upper bound), and the scores observed rate / bound of those due.
    issued: tuple[tuple[float, float], ...] = ()
    scores: tuple[float, ...] = ()
    # Why the refit that is due could not run (its process crashed, hung, did not start: forecast.Fitter), while
    # the previous parameters stand in; None once a refit ran.
    unfitted: str | None = None

    def changed(self, **changes: Any) -> "ForecastState":
        """This state with `changes`, in one copy (none if every change is what its field holds): the same
        value `dataclasses.replace` gives (ForecastState has no `__post_init__`)."""
        return _copy(self, changes, names=_FORECAST_STATE_FIELDS)


@dataclass(frozen=True)  # no __slots__: `changed` copies its __dict__, as Tick.then does
class PolicyState:
    """Everything the policy remembers between ticks. Returned by every decision, fed to the next.

    The stages copy it with `changed` (six to seven copies a tick), not `dataclasses.replace`."""

    last_replicas: int | None = None
    # (time, replicas recommended before stabilization) within the scale-down stabilization window.
    recommendations: tuple[tuple[float, int], ...] = ()
    # (time, reactive replicas) within the burst-confirmation window.
    reactive_recent: tuple[tuple[float, int], ...] = ()
    last_counter: tuple[float, float] | None = None  # (value, at_s) of arrivals_total
    startup_samples_s: tuple[float, ...] = ()
    node_wait_samples_s: tuple[tuple[str, float], ...] = ()  # (node type, seconds), the most recent
    service_time_s: float | None = None
    # The service time learned by each of the last ticks, oldest first, a rate window and a tick of them: what
    # a silence sets it back to, learned before the drain (stages/learn.py).
    recent_service_s: tuple[float, ...] = ()
    forecast: ForecastState = field(default_factory=ForecastState)
    shed: Mapping[str, float] = field(default_factory=dict)
    headroom_ratio: float = 1.0  # learned by SLO feedback, multiplies the rate capacity is sized for
    # Signals reported at least once: one that vanishes afterwards is missing data, not "not configured".
    seen: frozenset[str] = frozenset()
    # Growth risk for the warm pool (ratio, why), computed once per forecast bucket (the bucket start it is for).
    growth_risk: tuple[float, str] | None = None
    growth_risk_for_s: float | None = None
    # Warm-pool hysteresis (stages/warmpool.py): the replicas the risk asked for (replicas + warm slots) within
    # the hold, as (time, replicas), only those no later one matched or exceeded (replicas fall and times rise
    # along it; the first is the most asked for within the hold).
    warm_needs: tuple[tuple[float, int], ...] = ()
    warm_held: int = 0  # the slots the pool kept last tick (before a budget or placement took them)
    # Since when every demand signal has read zero, present and fresh (stages/idle.py); None: not idle.
    idle_since_s: float | None = None
    # When the last wake from zero ordered replicas, until they are all Ready or the queue is drained.
    woke_at_s: float | None = None
    # Where that wake's first replica lands: "slot" (a free warm or idle slot) or "node" (a new node).
    woke_onto: str | None = None
    # When the hard guard after a cold return first guarded (stages/shedding.py): its bound runs from then.
    hard_guard_since_s: float | None = None

    def changed(self, **changes: Any) -> "PolicyState":
        """This state with `changes`, in one copy (none if every change is what its field holds): the same
        value `dataclasses.replace` gives (PolicyState has no `__post_init__`), without its frozen `__init__`
        of one guarded assignment per field."""
        return _copy(self, changes, names=_POLICY_STATE_FIELDS)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now and why. `valid=False` means: leave the cluster as it is."""

    replicas: int
    warm_slots: int = 0
    shed: Mapping[str, float] = field(default_factory=dict)
    # Saturation guard for the admission endpoint, per priority name: while the live queue is at least this
    # deep, requests of that priority are rejected. Acts per request, between ticks; never for the highest.
    saturation_queue_depth: Mapping[str, int] = field(default_factory=dict)
    # What the guard's queue reading is carried forward with between probe readings: the ready slots and
    # the requests/s they complete (slots / mean service time).
    saturation_slots: int = 0
    saturation_drain_per_s: float = 0.0
    # Slots kept free for the highest priority (per-replica gateway queues, policies/reserve.py): a guarded
    # priority is also rejected while the requests in the servers number at least saturation_slots less this.
    saturation_reserve: int = 0
    forecast_rate_per_s: float | None = None
    forecast_upper_rate_per_s: float | None = None
    lead_time_s: float | None = None
    # Node provisioning time the lead time counts when no slot is free (learned, or the configured default).
    node_provisioning_s: float | None = None
    # True on the tick the forecaster was refitted by statsmodels (the expensive tick), for profiling.
    refitted: bool = False
    # Ordered replicas the node provisioner cannot place (see stages/placement.py).
    unplaceable_replicas: int = 0
    # The GPU budget held the replicas below what demand asked for (see stages/budget.py).
    capped_by_budget: bool = False
    # Scale to zero, while a wake is in progress (stages/idle.py): where its first replica lands, "slot" (a
    # free warm or idle slot: a pod start-up) or "node" (no slot free: a new node, then a pod start-up).
    wake_start: str | None = None
    valid: bool = True
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)  # no __slots__: Tick.then copies its __dict__
class Tick:
    """One call of `decide` as it passes through the stages (`policies.engine.STAGES`): each stage takes
    the tick and returns a new one with its findings added, in stage order.

    `state` starts as what the previous call returned and collects what this tick learns; `hold` set by a
    stage ends the pipeline with a decision nobody acts on (`valid=False`). Fields a stage has not reached
    yet keep their defaults; the stage that sets a field is named beside it."""

    signals: Signals
    now: float
    state: PolicyState
    hold: str | None = None
    fit: Any = None  # decide's caller: where a due refit runs (a forecast.Fitter; None: in this process)
    clean: Clean | None = None  # sanitize
    current: int = 0  # sanitize: the replicas the target runs (spec), or the last decided without a cluster
    service_s: float = 0.0  # learn: the service time sized with (learned, else the initial one)
    startup_s: float = 0.0  # leadtime
    node_s: float = 0.0  # leadtime
    lead_s: float = 0.0  # leadtime
    rising: float | None = None  # demand: the rate a steady climb reaches within one start-up
    held: float | None = None  # demand: the level a rise held (no steady climb), demand but no growth
    sizing: float = 1.0  # feedback: the multiple of a rate that capacity is sized for
    reactive: int | None = None  # reactive
    quantiles: tuple[float | None, float | None] = (None, None)  # predictive: the burst envelope used
    predicted: tuple[float, float] | None = None  # predictive: (point, upper) forecast at the lead time
    predictive: int | None = None  # predictive
    replicas: int = 0  # combine, then bounds and budget
    unplaceable: int = 0  # placement
    warm: int = 0  # warmpool, then budget
    capped: bool = False  # budget
    shed: Mapping[str, float] = field(default_factory=dict)  # shedding
    saturation_depths: Mapping[str, int] = field(default_factory=dict)  # shedding
    saturation_reserve: int = 0  # shedding: slots kept for the top class
    reasons: tuple[str, ...] = ()

    def then(self, lines: Iterable[str] = (), **changes: Any) -> "Tick":
        """This tick with `changes` and more reason lines, in one copy (none if there is nothing to add).

        Why not `dataclasses.replace`: it runs the frozen `__init__`, one guarded `object.__setattr__` per
        field, about 4.3 us for Tick's fields when it had 25; fifteen stages copy the tick each call, so that was a
        quarter of `decide`'s CPU. Tick keeps its fields in an instance dict (no `__slots__`), so the copy
        is two C-level dict updates on a new object, a third of the time of filling as many slots through their
        descriptors (1.0 us against 3.3 us with `timeit`; `Tick` has no `__post_init__` to skip). The result
        is an ordinary frozen Tick: nothing can change it afterwards."""
        lines = tuple(lines)
        if lines:
            changes["reasons"] = self.reasons + lines
        return _copy(self, changes, names=_TICK_FIELDS)


_Frozen = TypeVar("_Frozen")


def _copy(value: _Frozen, changes: dict[str, Any], *, names: frozenset[str]) -> _Frozen:
    """A new frozen dataclass of `value`'s class with its fields and `changes`, by two C-level updates of the
    instance dict; a name outside `names` (the class's fields) is a TypeError, as in `dataclasses.replace`.
    A subclass may add fields or a `__post_init__` this copy would skip: it takes `dataclasses.replace`.

    A copy in which every change is the very object its field holds would equal the original in every field, bit
    for bit, and a frozen value cannot tell a copy from itself, so the original is returned. About a quarter of a
    steady tick's copies change nothing (a stage that found nothing to add, a state whose learned ratio stayed,
    the last replicas decided again); identity, not `==`, since 0.0 == -0.0.

    A decide() makes about twenty of these copies, so the checks are the cheapest that say the same: the names
    as a subset test (no set built unless one is unknown) and the identity loop inline (no call)."""
    if type(value) not in _DICT_COPIED:
        return replace(value, **changes)  # type: ignore[type-var]
    if not changes.keys() <= names:
        raise TypeError(f"{type(value).__name__} has no field(s) {sorted(changes.keys() - names)}")
    current = value.__dict__
    for name, change in changes.items():
        if current[name] is not change:
            break
    else:
        return value  # every change is what its field holds (no changes at all included)
    new = object.__new__(type(value))
    values = new.__dict__
    values.update(current)
    values.update(changes)
    return new


# The names a copy may change.
_TICK_FIELDS = frozenset(f.name for f in fields(Tick))
_POLICY_STATE_FIELDS = frozenset(f.name for f in fields(PolicyState))
_FORECAST_STATE_FIELDS = frozenset(f.name for f in fields(ForecastState))
# The classes copied through their instance dict: none has a `__post_init__` (tests/test_pipeline.py).
_DICT_COPIED = (Tick, PolicyState, ForecastState)
