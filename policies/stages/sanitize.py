"""Stage 1, sanitize: turn raw samples into trusted floats or None; without a usable cluster state, hold.

A value that is NaN, negative, from the future or older than `max_signal_age_s` is dropped and named in
`dropped`; it is never replaced by zero. A signal that was reported before and is absent now is dropped as
missing too (a query that suddenly returns nothing); one never reported is simply not configured. A raw request
counter that went down was reset (pod restart): that tick's rate is unknown.

Implausible magnitudes are dropped and named the same way (`PLAUSIBLE_MAX`): a reading beyond what any
single model deployment could see is a broken exporter, query or unit, not demand, and sizing on it
would only order `max_replicas` (or, at 1e16 req/s, overflow the queueing model). The cluster state is
dropped (the decision holds) when a replica count is negative or over `MAX_REPLICA_COUNT`, or its sample
time is not a finite time; its auxiliary floats (how long a pod has waited, GPUs held and their price)
that are not finite and non-negative are named and read as unknown. With these bounds every later stage
works on finite numbers of bounded size: `decide` is total (tests/test_properties.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from policies.spec import PolicySpec
from policies.types import SAMPLE_SIGNALS, Clean, ClusterState, Sample, Signals, Tick

# The samples cleaned one by one; the arrival rate and the counter are combined below.
_FIELDS = tuple(name for name in SAMPLE_SIGNALS if name not in ("arrival_rate_per_s", "arrivals_total"))
# The largest plausible reading of each signal. 10 million requests/s (and 100 million waiting or running)
# is about ten times what the largest public inference fleets serve in all; a day is longer than any request
# or latency a controller sizes for; headroom is a ratio. Rates per priority class share the rate's bound.
MAX_RATE_PER_S = 1e7
PLAUSIBLE_MAX = {
    "queue_depth": 1e8,
    "in_flight": 1e8,
    "p99_latency_s": 86400.0,
    "gpu_memory_headroom_ratio": 1.0,
    "token_rate_per_s": 1e10,
    "arrival_rate_per_s": MAX_RATE_PER_S,
    "service_time_s": 86400.0,
    "held_requests": 1e8,
}
MAX_REPLICA_COUNT = 1_000_000  # replicas, pods or slots of one target
_COUNTS = ("spec_replicas", "ready_replicas", "starting_replicas", "unschedulable_pods", "no_capacity_pods",
           "warm_slots_ready", "idle_slots")


def _value(
    sample: Sample | None, name: str, now: float, max_age_s: float, dropped: list[str], skew_s: float = 0.0
) -> float | None:
    if sample is None:
        return None
    if not math.isfinite(sample.value) or sample.value < 0:
        dropped.append(f"{name}: not a finite non-negative number ({sample.value!r})")
        return None
    if sample.value > PLAUSIBLE_MAX[name]:
        dropped.append(f"{name}: {sample.value:g} is implausible (above {PLAUSIBLE_MAX[name]:g})")
        return None
    too_old = _too_old(name, sample.at_s, now, max_age_s)
    if too_old:
        dropped.append(too_old)
        return None
    age = now - sample.at_s
    if age < -skew_s:
        dropped.append(f"{name}: sampled {-age:.0f} s in the future")
        return None
    return sample.value


def _too_old(name: str, at_s: float, now: float, max_age_s: float) -> str | None:
    """Why a sample taken at `at_s` is not usable at `now` for its age (None: it is)."""
    age = now - at_s
    if not math.isfinite(age):
        return f"{name}: sample time {at_s!r} is not a time"
    if age > max_age_s:
        return f"{name}: stale ({age:.0f} s old > {max_age_s:.0f} s)"
    return None


def counter_rate(
    counter: Sample | None, last: tuple[float, float] | None, dropped: list[str]
) -> tuple[float | None, tuple[float, float] | None]:
    """Rate from two readings of a monotonic counter, and the reading to remember."""
    if counter is None or not math.isfinite(counter.value):
        return None, last
    current = (counter.value, counter.at_s)
    if last is None or counter.at_s <= last[1]:
        return None, current if last is None else last
    if counter.value < last[0]:
        dropped.append(f"arrivals_total: counter reset ({last[0]:.0f} -> {counter.value:.0f})")
        return None, current
    return (counter.value - last[0]) / (counter.at_s - last[1]), current


TRACKED = SAMPLE_SIGNALS + ("cluster",)
# Signals whose loss hides demand: while one of them is dropped the policy never scales down. The others
# (p99, memory headroom, tokens, service time) are dropped and named but do not block: a latency histogram
# is legitimately NaN when nothing completed in the window, i.e. whenever traffic is idle.
CRITICAL = ("queue_depth", "in_flight", "arrival_rate_per_s", "arrivals_total", "held_requests", "cluster")


def blocks_scale_down(dropped: tuple[str, ...]) -> bool:
    return any(d.split(":", 1)[0] in CRITICAL for d in dropped)


def present(signals: Signals) -> frozenset[str]:
    return frozenset(name for name in TRACKED if getattr(signals, name) is not None)


def sanitize(
    spec: PolicySpec,
    signals: Signals,
    last_counter: tuple[float, float] | None,
    now: float,
    seen: frozenset[str] = frozenset(),
) -> tuple[Clean, tuple[float, float] | None]:
    dropped: list[str] = [f"{name}: missing (reported before)" for name in sorted(seen - present(signals))]
    # (NaN latency or service time with no completions in the window is normal when idle; see CRITICAL.)
    age = spec.max_signal_age_s
    skew = spec.max_clock_skew_s
    values = {name: _value(getattr(signals, name), name, now, age, dropped, skew) for name in _FIELDS}
    rate = _value(signals.arrival_rate_per_s, "arrival_rate_per_s", now, age, dropped, skew)
    counter = signals.arrivals_total
    if counter is not None and not counter.usable(now + skew, age + skew):
        dropped.append("arrivals_total: stale or not finite")
        counter = None
    derived, last_counter = counter_rate(counter, last_counter, dropped)
    if derived is not None and not derived <= MAX_RATE_PER_S:
        dropped.append(f"arrivals_total: its rate {derived:g} req/s is implausible (above {MAX_RATE_PER_S:g})")
        derived = None
    if rate is None:
        rate = derived
    if values["service_time_s"] == 0.0:
        values["service_time_s"] = None  # no completions in the window: unknown, not instant
    by_priority = {}
    for name, value in signals.arrival_rate_by_priority.items():
        if math.isfinite(value) and 0 <= value <= MAX_RATE_PER_S:
            by_priority[name] = value
        elif not math.isnan(value):  # NaN: no arrivals of the class in the window
            dropped.append(f"arrival_rate_by_priority[{name}]: {value!r} is not a plausible rate")
    cluster = _cluster(signals.cluster, now, age, dropped)
    clean = Clean(
        cluster=cluster,
        arrival_rate_per_s=rate,
        arrival_rate_by_priority=by_priority,
        dropped=tuple(dropped),
        **values,
    )
    return clean, last_counter


def _cluster(cluster: ClusterState | None, now: float, max_age_s: float, dropped: list[str]) -> ClusterState | None:
    """The cluster state if its counts and time are usable (None otherwise), its auxiliary floats checked."""
    if cluster is None:
        return None
    for name in _COUNTS:
        count = getattr(cluster, name)
        if not 0 <= count <= MAX_REPLICA_COUNT:
            dropped.append(f"cluster: {name} {count} is not a replica count (0 .. {MAX_REPLICA_COUNT})")
            return None
    too_old = _too_old("cluster", cluster.at_s, now, max_age_s)
    if too_old:
        dropped.append(too_old)
        return None
    unknown = {"oldest_unschedulable_s": 0.0, "gpus_held": 0.0, "gpu_cost_per_hour": None}
    bad: dict[str, Any] = {name: default for name, default in unknown.items()
           if (value := getattr(cluster, name)) is not None and not (math.isfinite(value) and value >= 0)}
    for name in bad:
        dropped.append(f"cluster.{name}: {getattr(cluster, name)!r} is not a finite non-negative number")
    return replace(cluster, **bad) if bad else cluster


def nothing_serving(spec: PolicySpec, clean: Clean, woke_at_s: float | None) -> Clean:
    """Scale to zero: with no Ready replica, at zero or waking, and the gateway's `held_requests` reported,
    in-flight requests read 0. No pod serves, so none reports (in a cluster whose metrics come from the pods
    they are missing, not late): nothing is in flight at a server, and the held requests are the demand.
    Without this the decision held (`valid=False`) at zero: the admission endpoint, which holds only on a
    valid decision, admitted the waking request to no server, and nothing woke the model. Not while serving:
    a model whose replicas all went unready keeps holding on the missing signal (no scale-down on it)."""
    cluster = clean.cluster
    if (spec.idle_after_s is None or cluster is None or clean.held_requests is None or clean.in_flight is not None
            or cluster.ready_replicas > 0 or (cluster.spec_replicas > 0 and woke_at_s is None)):
        return clean
    return replace(clean, in_flight=0.0)


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The tick's signals cleaned, the counter and the signals seen remembered; no cluster state: hold."""
    state = tick.state
    clean, counter = sanitize(spec, tick.signals, state.last_counter, tick.now, state.seen)
    clean = nothing_serving(spec, clean, state.woke_at_s)
    reported = present(tick.signals)
    # The same set kept while nothing new is reported (every tick once all are): a state copy spared.
    seen = state.seen if reported <= state.seen else state.seen | reported
    state = state.changed(last_counter=counter, seen=seen)
    current = clean.cluster.spec_replicas if clean.cluster else (state.last_replicas or 0)
    hold = "no usable cluster state" if clean.cluster is None else None
    return tick.then(state=state, clean=clean, current=current, hold=hold)
