"""Properties of `decide` over random signal sequences (hypothesis)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import ClusterState, PolicySpec, Sample, Signals, decide, initial_state

SPEC = PolicySpec(min_replicas=2, max_replicas=40, replica_concurrency=8)

values = st.one_of(
    st.none(),
    st.just(math.nan),
    st.just(math.inf),
    st.floats(min_value=-5.0, max_value=5000.0, allow_nan=False, allow_infinity=False),
)
ages = st.sampled_from([0.0, 5.0, 30.0, 600.0, -20.0])


@st.composite
def tick(draw):
    replicas = draw(st.integers(min_value=0, max_value=60))
    ready = draw(st.integers(min_value=0, max_value=replicas))
    age = draw(ages)

    def sample():
        v = draw(values)
        return None if v is None else Sample(v, -age)

    cluster = draw(st.one_of(st.none(), st.just(ClusterState(spec_replicas=replicas, ready_replicas=ready,
                                                             starting_replicas=replicas - ready, at_s=0.0))))
    return Signals(
        cluster=cluster,
        queue_depth=sample(),
        in_flight=sample(),
        p99_latency_s=sample(),
        gpu_memory_headroom_ratio=sample(),
        token_rate_per_s=sample(),
        arrival_rate_per_s=sample(),
        service_time_s=sample(),
        arrival_rate_by_priority={"sheddable": draw(st.floats(0, 100)), "standard": draw(st.floats(0, 100))},
    )


def _shift(sig: Signals, now: float) -> Signals:
    """Re-time a tick's samples relative to `now`."""
    def move(s):
        return None if s is None else Sample(s.value, s.at_s + now)

    cluster = sig.cluster
    if cluster is not None:
        cluster = ClusterState(spec_replicas=cluster.spec_replicas, ready_replicas=cluster.ready_replicas,
                               starting_replicas=cluster.starting_replicas, at_s=now)
    fields = {f: move(getattr(sig, f)) for f in ("queue_depth", "in_flight", "p99_latency_s",
                                                 "gpu_memory_headroom_ratio", "token_rate_per_s",
                                                 "arrival_rate_per_s", "service_time_s")}
    return Signals(cluster=cluster, arrival_rate_by_priority=sig.arrival_rate_by_priority, **fields)


def _fold(ticks):
    """(signals, decision, names reported in an earlier tick) per tick."""
    state, out, seen = initial_state(), [], set()
    for i, sig in enumerate(ticks):
        now = 1000.0 + 15.0 * i
        d, state = decide(SPEC, state, _shift(sig, now), now)
        out.append((sig, d, frozenset(seen)))
        seen |= {f for f in MEASURED if getattr(sig, f) is not None}
    return out


MEASURED = ("queue_depth", "in_flight", "p99_latency_s", "gpu_memory_headroom_ratio", "token_rate_per_s",
            "arrival_rate_per_s", "service_time_s")
DEMAND = ("queue_depth", "in_flight", "arrival_rate_per_s")


@settings(max_examples=150, deadline=None)
@given(st.lists(tick(), min_size=1, max_size=25))
def test_bounds_no_nan_and_valid_shed_levels(ticks):
    for sig, d, _ in _fold(ticks):
        if d.valid:
            current = sig.cluster.spec_replicas
            assert SPEC.min_replicas <= d.replicas <= SPEC.max_replicas or d.replicas == current
            assert 0 <= d.warm_slots <= SPEC.max_warm_slots
        for level in d.shed.values():
            assert 0.0 <= level <= 1.0
        for x in (d.forecast_rate_per_s, d.forecast_upper_rate_per_s, d.lead_time_s):
            assert x is None or math.isfinite(x)
        assert "critical" not in d.shed and "critical" not in d.saturation_queue_depth


@settings(max_examples=60, deadline=None)
@given(st.lists(tick(), min_size=1, max_size=20))
def test_deterministic(ticks):
    first = [d for _, d, _ in _fold(ticks)]
    second = [d for _, d, _ in _fold(ticks)]
    assert first == second


@settings(max_examples=150, deadline=None)
@given(st.lists(tick(), min_size=1, max_size=25))
def test_never_scales_down_on_missing_nan_or_stale_data(ticks):
    for sig, d, seen in _fold(ticks):
        if sig.cluster is None:
            assert not d.valid
            continue
        broken = []
        for name in DEMAND:
            s = getattr(sig, name)
            if s is None:
                if name in seen:
                    broken.append(name)  # reported before, vanished now
            elif (not math.isfinite(s.value) or s.value < 0 or s.at_s > SPEC.max_clock_skew_s
                  or s.at_s < -SPEC.max_signal_age_s):
                broken.append(name)
        if broken and d.valid:
            # below min_replicas the bounds stage scales up; otherwise never below what runs
            assert d.replicas >= min(sig.cluster.spec_replicas, SPEC.max_replicas)
