"""Scale to zero (policies/stages/idle.py): idle for idle_after_s -> 0 replicas and 0 warm slots; any demand at
zero -> at least one replica at once; missing data is never idle; off by default."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from policies import ClusterState, PolicySpec, Sample, Signals, decide, initial_state

TICK_S = 15.0
SPEC = PolicySpec(idle_after_s=300.0, max_warm_slots=4, warm_growth_min_ratio=1.0)


def signals(now, *, replicas, rate=0.0, in_flight=0.0, queue=0.0, held=None):
    cluster = ClusterState(spec_replicas=replicas, ready_replicas=replicas, at_s=now)
    sample = lambda v: None if v is None else Sample(v, now)  # noqa: E731
    return Signals(cluster=cluster, arrival_rate_per_s=sample(rate), in_flight=sample(in_flight),
                   queue_depth=sample(queue), held_requests=sample(held))


def run(spec, ticks, *, replicas=2, state=None, start=0.0):
    """Fold decide over `ticks` (keyword dicts for `signals`), applying each valid decision."""
    state = state or initial_state()
    out = []
    for i, kw in enumerate(ticks):
        now = start + i * TICK_S
        d, state = decide(spec, state, signals(now, replicas=replicas, **kw), now)
        if d.valid:
            replicas = d.replicas
        out.append(d)
    return out, state, replicas


def busy_then_quiet(quiet_ticks):
    return [dict(rate=5.0, in_flight=8.0)] * 10 + [{}] * quiet_ticks


def test_idle_for_idle_after_s_goes_to_zero_replicas_and_warm_slots_with_a_reason():
    decisions, _, replicas = run(SPEC, busy_then_quiet(25))
    assert replicas == 0 and decisions[-1].warm_slots == 0
    first_zero = next(i for i, d in enumerate(decisions) if d.replicas == 0)
    assert (first_zero - 10) * TICK_S == 300.0  # exactly idle_after_s after the first quiet tick
    assert any("idle for 300 s: scaling to zero" in r for r in decisions[first_zero].reasons)
    assert all(d.replicas >= 1 for d in decisions[:first_zero])


def test_off_by_default_the_decisions_are_unchanged():
    spec = PolicySpec(min_replicas=0, max_warm_slots=4)
    with_field = spec.model_copy(update={"idle_after_s": None})
    a, _, _ = run(spec, busy_then_quiet(30))
    b, _, _ = run(with_field, busy_then_quiet(30))
    assert a == b


@pytest.mark.parametrize("missing", ["rate", "in_flight", "queue"])
def test_missing_data_never_counts_as_idle(missing):
    quiet = [{}] * 10 + [{missing: None}] + [{}] * 18  # one tick without the signal restarts the clock
    decisions, _, replicas = run(SPEC, [dict(rate=5.0, in_flight=8.0)] * 10 + quiet)
    assert replicas >= 1, [d.reasons for d in decisions[-3:]]
    decisions, _, replicas = run(SPEC, [dict(rate=5.0, in_flight=8.0)] * 10 + quiet + [{}] * 3)
    assert replicas == 0  # 20 quiet ticks after the gap: idle again


@pytest.mark.parametrize("demand", [dict(rate=0.1), dict(queue=1.0), dict(held=3.0), dict(in_flight=1.0)])
def test_any_demand_at_zero_wakes_to_one_at_once(demand):
    _, state, replicas = run(SPEC, busy_then_quiet(25))
    assert replicas == 0
    decisions, _, replicas = run(SPEC, [demand], replicas=0, state=state, start=35 * TICK_S)
    assert decisions[0].valid and decisions[0].replicas >= 1
    assert any(r.startswith("wake: ") for r in decisions[0].reasons), decisions[0].reasons


def test_at_zero_without_demand_it_stays_at_zero_even_when_data_goes_missing():
    _, state, _ = run(SPEC, busy_then_quiet(25))
    decisions, _, replicas = run(SPEC, [{}, dict(rate=None), dict(queue=None, in_flight=None), {}], replicas=0,
                                 state=state, start=35 * TICK_S)
    assert replicas == 0 and all(d.replicas == 0 or not d.valid for d in decisions)


def test_a_held_request_signal_that_reads_zero_is_still_idle_and_one_above_zero_is_not():
    decisions, _, replicas = run(SPEC, [dict(rate=5.0, in_flight=8.0)] * 10 + [dict(held=0.0)] * 25)
    assert replicas == 0
    decisions, _, replicas = run(SPEC, [dict(rate=5.0, in_flight=8.0)] * 10 + [dict(held=1.0)] * 25)
    assert replicas >= 1


def test_min_replicas_zero_without_idle_after_s_is_as_before_and_with_it_never_zero_under_demand():
    spec = SPEC.model_copy(update={"min_replicas": 0})
    decisions, _, _ = run(spec, [dict(rate=0.05, in_flight=0.0)] * 60)
    assert all(d.replicas >= 1 for d in decisions)


def test_idle_after_s_must_span_a_few_ticks():
    with pytest.raises(ValidationError, match=r"idle_after_s \(30\) must be at least 4 ticks \(60 s\)"):
        PolicySpec(idle_after_s=30.0)
    with pytest.raises(ValidationError):
        PolicySpec(idle_after_s=0.0)
    assert PolicySpec(idle_after_s=60.0).idle_after_s == 60.0


def starting(i, *, spec_replicas, ready):
    """The i-th tick after a quiet run (`busy_then_quiet(25)`) and a cluster with `spec_replicas - ready` starting."""
    now = 40 * TICK_S + i * TICK_S
    return now, ClusterState(spec_replicas=spec_replicas, ready_replicas=ready, starting_replicas=spec_replicas - ready,
                             at_s=now)


def test_while_waking_the_held_queue_does_not_order_replicas_beyond_the_rate():
    """Woken at 2 req/s, the queue grows while the first replicas start: a few replicas for the rate, not dozens
    to drain the queue within the SLO (they would land after the same cold start); until all are Ready."""
    spec = SPEC.model_copy(update={"burst_confirm_s": 0.0})  # the queue counts at once
    _, state, _ = run(spec, busy_then_quiet(25))

    def tick(state, i, *, spec_replicas, ready, queue):
        now, cluster = starting(i, spec_replicas=spec_replicas, ready=ready)
        sig = Signals(cluster=cluster, arrival_rate_per_s=Sample(2.0, now), in_flight=Sample(ready * 16.0, now),
                      queue_depth=Sample(queue, now))
        return decide(spec, state, sig, now), decide(spec.model_copy(update={"idle_after_s": None}), state, sig, now)

    (d, state), _ = tick(state, 0, spec_replicas=0, ready=0, queue=5.0)
    assert d.replicas >= 1 and any(r.startswith("wake: ") for r in d.reasons)
    (d, state), (unchecked, _) = tick(state, 1, spec_replicas=d.replicas, ready=0, queue=200.0)
    assert unchecked.replicas > 4  # the queue-drain sizing alone asks for more
    assert 1 <= d.replicas <= 3 and any(r.startswith("wake: ") and "at once" in r for r in d.reasons), d.reasons
    (d, state), _ = tick(state, 2, spec_replicas=3, ready=1, queue=150.0)  # one of three Ready: still waking
    assert d.replicas <= 3
    (d, state), (unchecked, _) = tick(state, 3, spec_replicas=3, ready=3, queue=100.0)  # all Ready: over
    assert state.woke_at_s is None and d.replicas == unchecked.replicas


def test_the_whole_wake_is_ordered_on_its_first_tick_with_the_held_backlog():
    """At zero, 40 req/s arrive and 300 requests are held. The first tick orders the rate plus the backlog the
    replicas will find when they land (300 + 40 req/s x one lead time, served within one lead time): about twice
    the rate's replicas at once, past the scale-up limit (4 a tick) and the burst confirmation, and never fewer
    while the wake lasts; the wake lasts while requests are held, also with every replica Ready. Before, the
    first tick ordered 4 and the order grew tick by tick, each step a cold start of its own."""
    from policies.sizing import replicas_for_rate
    from policies.stages.idle import wake_rate

    _, state, _ = run(SPEC, busy_then_quiet(25))

    def tick(state, i, *, spec_replicas, ready, held, rate=40.0):
        now, cluster = starting(i, spec_replicas=spec_replicas, ready=ready)
        sig = Signals(cluster=cluster, arrival_rate_per_s=Sample(rate, now), in_flight=Sample(ready * 16.0, now),
                      queue_depth=Sample(0.0, now), held_requests=Sample(held, now))
        return decide(SPEC, state, sig, now)

    d, state = tick(state, 0, spec_replicas=0, ready=0, held=300.0)
    lead_s = d.lead_time_s
    wanted = wake_rate(rate_per_s=40.0, held=300.0, lead_s=lead_s, left_s=lead_s)
    assert wanted == pytest.approx(80.0 + 300.0 / lead_s)
    service_s = 8.0 / 5.0  # learned from the busy ticks: 8 in flight at 5 req/s
    rate_only = replicas_for_rate(SPEC, 40.0, service_s)
    assert d.replicas == replicas_for_rate(SPEC, wanted, service_s) > max(4, rate_only), d.reasons
    first = d.replicas
    d, state = tick(state, 1, spec_replicas=first, ready=0, held=900.0, rate=5.0)  # a lull: not fewer
    assert d.replicas == first
    d, state = tick(state, 2, spec_replicas=first, ready=first, held=500.0)  # all Ready, backlog held: waking
    assert state.woke_at_s is not None and d.replicas >= first
    d, state = tick(state, 3, spec_replicas=first, ready=first, held=0.0)  # released: over
    assert state.woke_at_s is None


def test_at_zero_the_pods_signals_are_gone_and_the_held_requests_still_make_a_valid_decision():
    """In a cluster whose metrics come from the pods, at zero the rate, in-flight and queue series vanish with the
    pods. With the gateway's held_requests reported the decision stays valid: 0 without a held request, a wake
    on one, and valid through the cold start (the admission endpoint holds only on a valid decision; before,
    every one of these held at valid=False, the waking request was admitted to no server and the model
    stayed at zero). Not while serving: all replicas unready holds on the missing signals, as before."""
    _, state, _ = run(SPEC, busy_then_quiet(25))

    def tick(state, i, *, spec_replicas, ready, held):
        now, cluster = starting(i, spec_replicas=spec_replicas, ready=ready)
        sig = Signals(cluster=cluster, held_requests=None if held is None else Sample(held, now))
        return decide(SPEC, state, sig, now)

    d, state = tick(state, 0, spec_replicas=0, ready=0, held=0.0)
    assert d.valid and d.replicas == 0, d.reasons
    d, state = tick(state, 1, spec_replicas=0, ready=0, held=2.0)
    assert d.valid and d.replicas == 1 and "wake: held_requests 2 at zero replicas" in d.reasons, d.reasons
    for i in (2, 3):  # the replica starting, nothing Ready: still valid, still 1
        d, state = tick(state, i, spec_replicas=1, ready=0, held=3.0)
        assert d.valid and d.replicas == 1, d.reasons
    assert not tick(state, 4, spec_replicas=0, ready=0, held=None)[0].valid  # no held count reported: as before
    _, serving, _ = run(SPEC, [dict(rate=5.0, in_flight=8.0)] * 10)
    d, _ = tick(serving, 5, spec_replicas=3, ready=0, held=4.0)
    assert not d.valid and d.replicas == 3


KINDS = ("quiet", "demand", "missing")


@st.composite
def idle_ticks(draw):
    """Runs of quiet, demanding and data-missing ticks over random replica counts."""
    out = []
    for kind in draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=30)):
        replicas = draw(st.integers(min_value=0, max_value=6))
        kw = {}
        if kind == "demand":
            name = draw(st.sampled_from(["rate", "in_flight", "queue", "held"]))
            kw[name] = draw(st.floats(min_value=0.01, max_value=500.0))
        elif kind == "missing":
            kw[draw(st.sampled_from(["rate", "in_flight", "queue"]))] = None
        out.append((kind, replicas, kw))
    return out


@settings(max_examples=150, deadline=None)
@given(idle_ticks())
def test_zero_only_after_a_quiet_window_or_at_zero_without_demand_and_never_under_demand(ticks):
    spec = PolicySpec(idle_after_s=60.0, min_replicas=2, max_replicas=40)
    window = int(spec.idle_after_s // TICK_S)
    state = initial_state()
    for i, (kind, replicas, kw) in enumerate(ticks):
        now = i * TICK_S
        d, state = decide(spec, state, signals(now, replicas=replicas, **kw), now)
        if not d.valid:
            continue
        if kind == "demand":
            assert d.replicas >= 1, (i, kw, d.reasons)
        if d.replicas == 0:
            quiet_window = i >= window and all(k == "quiet" for k, _, _ in ticks[i - window:i + 1])
            assert kind != "demand" and (replicas == 0 or quiet_window), (i, ticks[max(0, i - window):i + 1])


@pytest.mark.parametrize("free, onto, line", [
    (dict(idle_slots=1), "slot", "wake: onto a free warm or idle slot: 120 s start-up"),
    (dict(warm_slots_ready=1), "slot", "wake: onto a free warm or idle slot: 120 s start-up"),
    ({}, "node", "wake: no warm or idle slot free: a new node, 120 s start-up + 300 s node provisioning"),
])
def test_the_wake_says_where_its_first_replica_lands(free, onto, line):
    """A wake from zero lands on a free warm or idle slot (a pod start-up) or waits for a new node: its line
    says which, and the decision's `wake_start` says it while the wake lasts (none before it, none at rest)."""
    _, state, _ = run(SPEC, busy_then_quiet(25))
    at_zero = Signals(cluster=ClusterState(spec_replicas=0, ready_replicas=0, at_s=0.0, **free),
                      arrival_rate_per_s=Sample(0.0, 0.0), in_flight=Sample(0.0, 0.0), queue_depth=Sample(0.0, 0.0),
                      held_requests=Sample(0.0, 0.0))
    rest, state = decide(SPEC, state, at_zero, 600.0)
    assert rest.replicas == 0 and rest.wake_start is None
    held = Signals(cluster=ClusterState(spec_replicas=0, ready_replicas=0, at_s=615.0, **free),
                   arrival_rate_per_s=Sample(0.0, 615.0), in_flight=Sample(0.0, 615.0),
                   queue_depth=Sample(0.0, 615.0), held_requests=Sample(3.0, 615.0))
    woke, state = decide(SPEC, state, held, 615.0)
    assert woke.replicas >= 1 and woke.wake_start == onto and line in woke.reasons, woke.reasons
    starting = Signals(cluster=ClusterState(spec_replicas=woke.replicas, ready_replicas=0, at_s=630.0, **free),
                       held_requests=Sample(3.0, 630.0))  # at zero the pods' signals are gone
    still, state = decide(SPEC, state, starting, 630.0)
    assert still.valid and still.wake_start == onto, still.reasons
