"""Stage 1, sanitize: turn raw samples into trusted floats or None; without a usable cluster state, hold.

A value that is NaN, negative, from the future or older than `max_signal_age_s` is dropped and named in
`dropped`; it is never replaced by zero. A signal that was reported before and is absent now is dropped as
missing too (a query that suddenly returns nothing); one never reported is simply not configured. A raw request counter that went down was reset (pod restart):
that tick's rate is unknown."""

from __future__ import annotations

import math
from dataclasses import replace

from policies.spec import PolicySpec
from policies.types import SAMPLE_SIGNALS, Clean, Sample, Signals, Tick

# The samples cleaned one by one; the arrival rate and the counter are combined below.
_FIELDS = tuple(name for name in SAMPLE_SIGNALS if name not in ("arrival_rate_per_s", "arrivals_total"))


def _value(
    sample: Sample | None, name: str, now: float, max_age_s: float, dropped: list[str], skew_s: float = 0.0
) -> float | None:
    if sample is None:
        return None
    if not math.isfinite(sample.value) or sample.value < 0:
        dropped.append(f"{name}: not a finite non-negative number ({sample.value!r})")
        return None
    age = now - sample.at_s
    if age > max_age_s:
        dropped.append(f"{name}: stale ({age:.0f} s old > {max_age_s:.0f} s)")
        return None
    if age < -skew_s:
        dropped.append(f"{name}: sampled {-age:.0f} s in the future")
        return None
    return sample.value


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
CRITICAL = ("queue_depth", "in_flight", "arrival_rate_per_s", "arrivals_total", "cluster")


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
    if rate is None:
        rate = derived
    if values["service_time_s"] == 0.0:
        values["service_time_s"] = None  # no completions in the window: unknown, not instant
    headroom = values["gpu_memory_headroom_ratio"]
    if headroom is not None and headroom > 1.0:
        dropped.append(f"gpu_memory_headroom_ratio: {headroom} is above 1")
        values["gpu_memory_headroom_ratio"] = None
    cluster = signals.cluster
    if cluster is not None:
        if min(cluster.spec_replicas, cluster.ready_replicas, cluster.starting_replicas) < 0:
            dropped.append("cluster: negative replica count")
            cluster = None
        elif now - cluster.at_s > age:
            dropped.append(f"cluster: stale ({now - cluster.at_s:.0f} s old)")
            cluster = None
    by_priority = {
        k: v for k, v in signals.arrival_rate_by_priority.items() if math.isfinite(v) and v >= 0
    }
    clean = Clean(
        cluster=cluster,
        arrival_rate_per_s=rate,
        arrival_rate_by_priority=by_priority,
        dropped=tuple(dropped),
        **values,
    )
    return clean, last_counter


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The tick's signals cleaned, the counter and the signals seen remembered; no cluster state: hold."""
    state = tick.state
    clean, counter = sanitize(spec, tick.signals, state.last_counter, tick.now, state.seen)
    state = replace(state, last_counter=counter, seen=state.seen | present(tick.signals))
    current = clean.cluster.spec_replicas if clean.cluster else (state.last_replicas or 0)
    hold = "no usable cluster state" if clean.cluster is None else None
    return replace(tick, state=state, clean=clean, current=current, hold=hold)
