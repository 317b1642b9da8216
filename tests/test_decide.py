"""The whole policy as timelines: set signals, advance `now`, expect a decision."""

import math

from policies import ClusterState, Sample, Signals, decide, initial_state

from helpers import signals


def run(spec, steps, state=None):
    state = state or initial_state()
    decisions = []
    for now, sig in steps:
        d, state = decide(spec, state, sig, now)
        decisions.append(d)
    return decisions, state


def test_no_cluster_state_is_an_invalid_hold(spec):
    d, _ = decide(spec, initial_state(), Signals(), 0.0)
    assert not d.valid and "no usable cluster state" in d.reasons[0]


def test_no_demand_signal_is_an_invalid_hold(spec):
    sig = Signals(cluster=ClusterState(spec_replicas=6, ready_replicas=6, at_s=0.0))
    d, _ = decide(spec, initial_state(), sig, 0.0)
    assert not d.valid and d.replicas == 6 and "no demand signal" in d.reasons[0]


def test_steady_load_settles_and_scales_down_after_the_window(spec):
    # 40 req/s x 1 s = 40 busy slots; at 8 slots per replica and a 2 s SLO that needs 6 replicas.
    replicas = 20
    decisions = []
    state = initial_state()
    for i in range(120):
        now = i * 15.0
        d, state = decide(spec, state, signals(now, rate=40.0, service=1.0, spec_replicas=replicas), now)
        replicas = d.replicas
        decisions.append(d)
    assert decisions[0].replicas == 20  # a fresh controller does not scale down at once
    assert decisions[-1].replicas == 6
    assert all(d.valid for d in decisions)
    assert any("holding" in r for r in decisions[5].reasons)


def test_sustained_surge_scales_up_and_sheds_until_capacity_lands(spec):
    state, replicas = initial_state(), 6
    for i in range(40):
        _, state = decide(spec, state, signals(i * 15.0, rate=40.0, service=1.0, spec_replicas=replicas), i * 15.0)
    rates = {"critical": 20.0, "standard": 50.0, "sheddable": 30.0}
    d = None
    for i in range(40, 44):
        now = i * 15.0
        sig = signals(now, rate=100.0, service=1.0, spec_replicas=replicas, ready=6, queue=50.0, by_priority=rates)
        d, state = decide(spec, state, sig, now)
        replicas = max(replicas, d.replicas)
    assert d.replicas > 6
    assert d.shed["sheddable"] > 0
    assert "critical" not in d.shed and d.shed.get("standard", 0.0) == 0.0
    assert d.saturation_queue_depth["sheddable"] < d.saturation_queue_depth["standard"]


def test_stale_data_holds_and_never_scales_down(spec):
    state = initial_state()
    for i in range(10):
        _, state = decide(spec, state, signals(i * 15.0, rate=40.0, service=1.0, spec_replicas=12), i * 15.0)
    later = 1000.0
    d, _ = decide(spec, state, signals(later, rate=1.0, service=1.0, spec_replicas=12, age=600.0), later)
    assert d.replicas == 12
    assert not d.valid or any("stale" in r for r in d.reasons)


def test_nan_latency_when_idle_does_not_block_scale_down(spec):
    state, replicas = initial_state(), 12
    for i in range(80):
        now = i * 15.0
        sig = signals(now, rate=1.0, service=1.0, spec_replicas=replicas, p99=math.nan)
        d, state = decide(spec, state, sig, now)
        replicas = d.replicas
    assert replicas < 12 and any("dropped p99_latency_s" in r for r in d.reasons)


def test_slightly_future_samples_are_clock_skew_not_errors(spec):
    d, _ = decide(spec, initial_state(), signals(100.0, rate=10.0, age=-0.004), 100.0)
    assert d.valid and not any("future" in r for r in d.reasons)
    d, _ = decide(spec, initial_state(), signals(100.0, rate=10.0, age=-60.0), 100.0)
    assert any("future" in r for r in d.reasons)


def test_missing_in_flight_with_a_rate_may_scale_up_but_not_down(spec):
    state = initial_state()
    for i in range(50):
        now = i * 15.0
        sig = signals(now, rate=5.0, service=1.0, spec_replicas=10)
        sig = Signals(**{**{f: getattr(sig, f) for f in sig.__slots__}, "queue_depth": Sample(math.nan, now)})
        d, state = decide(spec, state, sig, now)
        assert d.replicas >= 10
        assert any("dropped queue_depth" in r for r in d.reasons)


def test_learned_startup_extends_the_lead_time(spec):
    state = initial_state()
    d0, state = decide(spec, state, signals(0.0, warm=1), 0.0)
    assert d0.lead_time_s == spec.default_startup_s
    d1, state = decide(spec, state, signals(15.0, warm=1, startups=(400.0, 410.0, 420.0)), 15.0)
    assert d1.lead_time_s >= 400.0
    d2, _ = decide(spec, state, signals(30.0, warm=0), 30.0)
    assert d2.lead_time_s == d1.lead_time_s + spec.node_provisioning_s


def test_learned_node_waits_replace_the_default_node_provisioning(spec):
    state = initial_state()
    d0, state = decide(spec, state, signals(0.0, warm=0), 0.0)
    assert d0.node_provisioning_s == spec.node_provisioning_s
    assert d0.lead_time_s == spec.default_startup_s + spec.node_provisioning_s
    waits = (("p4d.24xlarge", 700.0), ("p4d.24xlarge", 650.0))
    d1, state = decide(spec, state, signals(15.0, warm=0, node_waits=waits), 15.0)
    assert d1.node_provisioning_s == 700.0
    assert d1.lead_time_s == spec.default_startup_s + 700.0
    assert any(r.startswith("lead time:") and "2 pod waits for a new p4d.24xlarge node" in r for r in d1.reasons)
    d2, state = decide(spec, state, signals(30.0, warm=1), 30.0)  # remembered; a free slot needs no node
    assert d2.node_provisioning_s == 700.0 and d2.lead_time_s == spec.default_startup_s
    assert not any(r.startswith("lead time:") for r in d2.reasons)


def test_every_decision_explains_itself(spec):
    decisions, _ = run(spec, [(i * 15.0, signals(i * 15.0, rate=10.0 + i, spec_replicas=4)) for i in range(30)])
    assert all(d.reasons for d in decisions)
    assert any(r.startswith("predictive:") for r in decisions[-1].reasons)


def test_a_signal_that_vanishes_holds_but_one_never_configured_does_not(spec):
    state = initial_state()
    for i in range(10):
        _, state = decide(spec, state, signals(i * 15.0, rate=40.0, service=1.0, spec_replicas=12), i * 15.0)
    gone = signals(150.0, rate=1.0, service=1.0, spec_replicas=12)
    gone = Signals(cluster=gone.cluster, arrival_rate_per_s=gone.arrival_rate_per_s, in_flight=gone.in_flight)
    d, _ = decide(spec, state, gone, 150.0)
    assert d.replicas >= 12 and any("missing (reported before)" in r for r in d.reasons)
    # a deployment that never reported a queue can still scale down once the window has passed
    state, replicas = initial_state(), 12
    for i in range(80):
        sig = signals(i * 15.0, rate=1.0, service=1.0, spec_replicas=replicas)
        sig = Signals(cluster=sig.cluster, arrival_rate_per_s=sig.arrival_rate_per_s, in_flight=sig.in_flight)
        d, state = decide(spec, state, sig, i * 15.0)
        replicas = d.replicas
    assert replicas < 12


def test_warm_pool_insures_the_growth_it_is_told_to_and_explains_each_slot(spec):
    """Steady 40 req/s: the history shows no growth, so no warm slot; told to be ready for a doubling, the
    pool holds the replicas a doubling needs beyond those decided, less idle node slots, within its bound."""
    steps = [(i * 15.0, signals(i * 15.0, rate=40.0, service=1.0, spec_replicas=6)) for i in range(60)]
    quiet, _ = run(spec, steps)
    assert quiet[-1].warm_slots == 0
    insured = spec.model_copy(update={"warm_growth_min_ratio": 1.0, "max_warm_slots": 20})
    decisions, _ = run(insured, steps)
    last = decisions[-1]
    assert last.warm_slots >= last.replicas - 1  # about one more fleet's worth
    assert any("+100%" in r and "warm pool" in r for r in last.reasons)
    idle = [(now, with_idle_slots(sig, 3)) for now, sig in steps]
    d, _ = run(insured, idle)
    assert d[-1].warm_slots == last.warm_slots - 3
    # idle slots appearing later lower nothing held: deleting a placeholder would only leave its node idle
    d, _ = run(insured, steps[:-1] + idle[-1:])
    assert d[-1].warm_slots == last.warm_slots and any("3 idle node slots lower what is created, not what is held"
                                                      in r for r in d[-1].reasons)


def with_idle_slots(sig, idle):
    return Signals(cluster=ClusterState(spec_replicas=6, ready_replicas=6, idle_slots=idle, at_s=sig.cluster.at_s),
                   arrival_rate_per_s=sig.arrival_rate_per_s, in_flight=sig.in_flight,
                   queue_depth=sig.queue_depth, service_time_s=sig.service_time_s)


def test_the_warm_pool_holds_its_slots_for_one_node_provisioning_after_the_need_falls(spec):
    """Insured for a doubling at 40 req/s, then 25 req/s from t = 750 s: the risk falls at once (10 replicas
    and fewer, from 11) but the 5 slots are held until 300 s (the node provisioning a re-created slot would
    wait) after 11 was last asked for, with the reason; then released."""
    insured = spec.model_copy(update={"warm_growth_min_ratio": 1.0, "max_warm_slots": 20})
    steps = [(i * 15.0, signals(i * 15.0, rate=40.0 if i < 50 else 25.0, service=1.0, spec_replicas=6))
             for i in range(75)]
    decisions, _ = run(insured, steps)
    before = decisions[49].warm_slots
    assert before == 5
    assert [d.warm_slots for d in decisions[50:70]] == [before] * 20  # 750 .. 1035 s
    assert any(r.startswith("warm pool: holding 5 slots") and "asked for fewer for 300 s" in r
               for r in decisions[60].reasons)
    assert decisions[70].warm_slots < before  # 1050 s: 300 s after 5 was last asked for


def test_a_restart_holds_the_ready_placeholders_it_finds_for_one_node_provisioning(spec):
    """The same fall to 25 req/s, but the controller restarts at 780 s with a fresh state and finds the 5
    placeholders Ready: they are held as if asked for then, until one node provisioning (300 s) has passed,
    not deleted at once (and re-created when the risk asks again)."""
    insured = spec.model_copy(update={"warm_growth_min_ratio": 1.0, "max_warm_slots": 20})
    steps = [(i * 15.0, signals(i * 15.0, rate=25.0, service=1.0, spec_replicas=6, warm=5)) for i in range(52, 80)]
    decisions, _ = run(insured, steps)
    assert [d.warm_slots for d in decisions[:20]] == [5] * 20  # 780 .. 1065 s
    assert decisions[0].reasons and any(r.startswith("warm pool: holding 5 slots") for r in decisions[0].reasons)
    assert decisions[-1].warm_slots < 5  # 1185 s: released once the hold has passed


def test_unplaceable_replicas_keep_no_warm_slots_and_shed_by_priority(spec):
    insured = spec.model_copy(update={"warm_growth_min_ratio": 1.0, "max_warm_slots": 20})
    steps = [(i * 15.0, signals(i * 15.0, rate=40.0, service=1.0, spec_replicas=6)) for i in range(40)]
    decisions, state = run(insured, steps)
    assert decisions[-1].warm_slots > 0
    now = 40 * 15.0
    capped = Signals(cluster=ClusterState(spec_replicas=10, ready_replicas=5, unschedulable_pods=5, no_capacity_pods=5,
                                          no_capacity_reason="karpenter: exceed limits", at_s=now),
                     arrival_rate_per_s=Sample(60.0, now), in_flight=Sample(40.0, now), queue_depth=Sample(20.0, now),
                     service_time_s=Sample(1.0, now),
                     arrival_rate_by_priority={"critical": 12.0, "standard": 30.0, "sheddable": 18.0})
    d, _ = decide(insured, state, capped, now)
    assert d.unplaceable_replicas == 5 and d.warm_slots == 0
    assert any(r.startswith("capacity: 5 replicas cannot get a node (karpenter: exceed limits)") for r in d.reasons)
    assert d.shed["sheddable"] > 0  # 60 req/s against what 5 ready replicas serve


def test_one_burst_is_sized_for_its_protected_classes_and_a_second_in_full(spec):
    """A 60-s burst to 2.5x, shorter than a start-up: capacity ordered at its first tick would land after
    it, so the envelope covers what shedding cannot absorb (critical and standard, 70 % of it) until a
    second burst shows they recur; then it covers the bursts whole."""
    from policies.engine import replicas_for_rate

    mix = {"critical": 0.2, "standard": 0.5, "sheddable": 0.3}
    state, replicas, now = initial_state(), 6, 0.0

    def tick(rate):
        nonlocal state, replicas, now
        by = {k: v * rate for k, v in mix.items()}
        d, state = decide(spec, state, signals(now, rate=rate, service=1.0, spec_replicas=replicas,
                                               by_priority=by), now)
        replicas, now = d.replicas, now + 15.0
        return d

    for _ in range(40):
        tick(40.0)
    before = replicas
    first = [tick(100.0) for _ in range(4)] + [tick(40.0) for _ in range(20)]
    full = replicas_for_rate(spec, 100.0, 1.0)
    assert max(d.replicas for d in first) <= replicas_for_rate(spec, 70.0, 1.0) < full
    assert max(d.replicas for d in first) > before  # its protected part is still provisioned
    assert any("not yet a pattern" in r for d in first for r in d.reasons)
    second = [tick(100.0) for _ in range(4)] + [tick(40.0) for _ in range(4)]
    assert max(d.replicas for d in second) >= full
    assert not any("not yet a pattern" in r for r in second[-1].reasons)


def test_a_gpu_budget_caps_replicas_and_warm_slots_and_sheds_by_priority(spec):
    """Demand asks for more than the quota allows: the decision stays within it, warm slots get what is left,
    and the lowest priority is shed, with "capped by quota" and the quota's words in the reasons."""
    insured = spec.model_copy(update={"warm_growth_min_ratio": 1.0, "max_warm_slots": 20})
    steps = [(i * 15.0, signals(i * 15.0, rate=40.0, service=1.0, spec_replicas=6)) for i in range(40)]
    decisions, state = run(insured, steps)
    free = decisions[-1]
    assert free.warm_slots > 0 and not free.capped_by_budget
    now = 40 * 15.0
    rates = {"critical": 20.0, "standard": 40.0, "sheddable": 40.0}
    quota = "ClusterQueue team-a: 24 nvidia.com/gpu, 8 used by others"
    sig = Signals(cluster=ClusterState(spec_replicas=6, ready_replicas=4, budget_replicas=4, budget_reason=quota,
                                       at_s=now),
                  arrival_rate_per_s=Sample(100.0, now), in_flight=Sample(40.0, now), queue_depth=Sample(60.0, now),
                  service_time_s=Sample(1.0, now), arrival_rate_by_priority=rates)
    d, _ = decide(insured, state, sig, now)
    assert d.replicas == 4 and d.warm_slots == 0 and d.capped_by_budget
    assert any(r.startswith("capped by quota: 4 replicas") and quota in r for r in d.reasons)
    assert d.shed["sheddable"] > 0 and "critical" not in d.shed
    roomy = Signals(cluster=ClusterState(spec_replicas=6, ready_replicas=6, budget_replicas=8, budget_reason=quota,
                                         at_s=now),
                    arrival_rate_per_s=Sample(40.0, now), in_flight=Sample(30.0, now), queue_depth=Sample(0.0, now),
                    service_time_s=Sample(1.0, now))
    d, _ = decide(insured, state, roomy, now)
    assert not d.capped_by_budget and d.replicas + d.warm_slots <= 8
    assert d.warm_slots == 8 - d.replicas  # the pool wanted more (see `free`), the budget left this much


def test_an_implausible_reading_is_named_and_not_used_never_raised():
    """1e16 req/s (a broken exporter or query) once raised ZeroDivisionError/OverflowError in the sizing."""
    from policies import PolicySpec

    cluster = ClusterState(spec_replicas=8, ready_replicas=8, at_s=0.0)
    for rate in (1e16, 1.7e308):
        for service in (None, Sample(1.0, 0.0)):
            sig = Signals(cluster=cluster, arrival_rate_per_s=Sample(rate, 0.0), service_time_s=service)
            d, _ = decide(PolicySpec(), initial_state(), sig, 0.0)
            assert not d.valid and d.replicas == 8  # nothing else to size on: hold
            assert any(r.startswith("arrival_rate_per_s:") and "implausible" in r for r in d.reasons)
    sig = Signals(cluster=cluster, arrival_rate_per_s=Sample(10.0, 0.0), queue_depth=Sample(1e308, 0.0))
    d, _ = decide(PolicySpec(), initial_state(), sig, 0.0)
    assert d.valid and d.replicas == 8  # a demand signal dropped: never below what runs
    assert any("queue_depth: 1e+308 is implausible" in r for r in d.reasons)
    huge = ClusterState(spec_replicas=10**400, ready_replicas=10**400, at_s=0.0)
    d, _ = decide(PolicySpec(), initial_state(), Signals(cluster=huge, arrival_rate_per_s=Sample(1.0, 0.0)), 0.0)
    assert not d.valid and any("spec_replicas" in r and "not a replica count" in r for r in d.reasons)


def test_replicas_running_above_max_are_brought_to_it_at_once_and_said_so():
    """A controller started beside 100 replicas with max_replicas 64 held 100 for the stabilization window
    (ten minutes) while the actuator clamped to 64: the decision and the action disagreed."""
    from policies import PolicySpec

    # a constant rate is steady traffic, whose window is one lead time: the full window is what is tested here
    spec = PolicySpec(max_replicas=64, steady_burst_ratio=0.0)
    state, replicas = initial_state(), 100
    for i in range(40):  # ten minutes of 15-s ticks
        now = i * 15.0
        d, state = decide(spec, state, signals(now, rate=300.0, service=1.0, spec_replicas=replicas), now)
        assert d.valid and d.replicas == 64
        if i == 0:
            assert any("100 running, above max_replicas: 64" in r for r in d.reasons)
        replicas = d.replicas
    # ...also while a demand signal is missing, which otherwise holds what runs
    d, _ = decide(spec, initial_state(), signals(0.0, rate=300.0, queue=math.nan, spec_replicas=100), 0.0)
    assert d.valid and d.replicas == 64


def test_replicas_running_below_min_are_brought_to_it_at_once():
    from policies import PolicySpec

    spec = PolicySpec(min_replicas=10, max_replicas=64)
    d, _ = decide(spec, initial_state(), signals(0.0, rate=1.0, service=1.0, spec_replicas=0), 0.0)
    assert d.valid and d.replicas == 10  # not 4, the scale-up limit from 0
    assert any("0 running, below min_replicas: 10" in r for r in d.reasons)
