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


# The whole input space: every float (NaN, +-inf, subnormal, near 1e308, negative) and every int, for every
# field of the signals and of the cluster state. A draw picks a few fields to take any value and gives the
# rest plausible ones (or, one draw in eight, lets every field take any value): wholly random signals are
# nearly always held at the first stage, and would leave the later stages untried.
any_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-310, 1e16, 1e300, 1.7976931348623157e308, -1e308]),
)
any_int = st.one_of(st.integers(), st.integers(min_value=-5, max_value=300), st.just(10**400))
COUNTS = ("spec_replicas", "ready_replicas", "starting_replicas", "unschedulable_pods", "no_capacity_pods",
          "warm_slots_ready", "idle_slots", "budget_replicas")
CLUSTER_FLOATS = ("oldest_unschedulable_s", "gpus_held", "gpu_cost_per_hour", "at_s")
SAMPLES = MEASURED + ("arrivals_total",)
WILD = COUNTS + CLUSTER_FLOATS + ("startup_durations_s", "node_waits_s", "arrival_rate_by_priority") + tuple(
    f"{name}.{part}" for name in SAMPLES for part in ("value", "at_s"))


@st.composite
def any_signals(draw, now: float = 0.0):
    wild = set(WILD) if draw(st.integers(0, 7)) == 7 else draw(st.sets(st.sampled_from(WILD), max_size=3))

    def choose(name, plausible, anything):
        return anything if name in wild else plausible

    def pick(name, plausible, anything):
        return draw(choose(name, plausible, anything))

    counts = {name: pick(name, st.integers(0, 64), any_int) for name in COUNTS}
    counts["budget_replicas"] = draw(st.none()) if draw(st.booleans()) else counts["budget_replicas"]
    floats = {name: pick(name, st.floats(0.0, 1e4), any_float) for name in CLUSTER_FLOATS}
    floats["at_s"] = floats["at_s"] if "at_s" in wild else now
    cluster = ClusterState(
        **counts, **floats, no_capacity_reason="x", budget_reason="y",
        startup_durations_s=tuple(draw(st.lists(choose("startup_durations_s", st.floats(1.0, 600.0), any_float),
                                                max_size=3))),
        node_waits_s=tuple(draw(st.lists(st.tuples(st.sampled_from(["a", "b"]),
                                                   choose("node_waits_s", st.floats(1.0, 900.0), any_float)),
                                         max_size=3))),
    )

    def sample(name):
        if draw(st.integers(0, 4)) == 4:
            return None
        value = pick(f"{name}.value", st.floats(0.0, 1e4), any_float)
        return Sample(value, pick(f"{name}.at_s", st.sampled_from([now, now - 5.0, now - 90.0]), any_float))

    classes = st.sampled_from(["critical", "standard", "sheddable", "x"])
    return Signals(
        cluster=None if draw(st.integers(0, 19)) == 19 else cluster,
        **{name: sample(name) for name in SAMPLES},
        arrival_rate_by_priority=draw(st.dictionaries(
            classes, choose("arrival_rate_by_priority", st.floats(0.0, 1e3), any_float), max_size=4)),
    )


def _sound(spec: PolicySpec, d) -> None:
    """What every decision satisfies, whatever went in."""
    if d.valid:
        assert (spec.min_replicas <= d.replicas <= spec.max_replicas
                or (d.capped_by_budget and d.replicas <= spec.max_replicas))
        assert 0 <= d.warm_slots <= spec.max_warm_slots
    assert all(0.0 <= level <= 1.0 for level in d.shed.values())
    for x in (d.forecast_rate_per_s, d.forecast_upper_rate_per_s, d.lead_time_s, d.node_provisioning_s,
              d.saturation_drain_per_s):
        assert x is None or math.isfinite(x)


# The defaults, the suite's spec, and one with every optional signal used and a forecast from the second tick.
TOTAL_SPECS = (PolicySpec(), SPEC, PolicySpec(min_replicas=10, max_replicas=64, p99_latency_target_s=1.0,
                                              target_tokens_per_s_per_replica=1000.0, forecast_bucket_s=15.0))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(TOTAL_SPECS), any_signals())
def test_decide_is_total_over_the_whole_signal_space(spec, sig):
    d, _ = decide(spec, initial_state(), sig, 0.0)
    _sound(spec, d)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(TOTAL_SPECS), st.data())
def test_decide_is_total_over_a_timeline(spec, data):
    state = initial_state()
    for i in range(data.draw(st.integers(min_value=2, max_value=8))):
        now = 15.0 * i
        d, state = decide(spec, state, data.draw(any_signals(now)), now)
        _sound(spec, d)
