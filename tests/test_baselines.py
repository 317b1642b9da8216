"""Baselines against the numbers their documentation gives."""

from policies import ClusterState, Sample, Signals
from policies.baselines import hpa, keda_prometheus, kpa, oracle


def sig(now, *, total, ready, starting=0, spec=None):
    spec = ready + starting if spec is None else spec
    return Signals(
        cluster=ClusterState(spec_replicas=spec, ready_replicas=ready, starting_replicas=starting, at_s=now),
        in_flight=Sample(total, now),
        queue_depth=Sample(0.0, now),
    )


# Kubernetes docs, "Algorithm details": current 200m vs desired 100m doubles; 50m halves.
def test_hpa_doubles_at_twice_the_target():
    spec = hpa.HpaSpec(target_per_pod=100.0)
    d, _ = hpa.decide(spec, hpa.initial_state(), sig(0.0, total=4 * 200.0, ready=4), 0.0)
    assert d.replicas == 8


def test_hpa_halves_only_after_the_stabilization_window():
    spec = hpa.HpaSpec(target_per_pod=100.0)
    state = hpa.initial_state()
    _, state = hpa.decide(spec, state, sig(0.0, total=4 * 100.0, ready=4), 0.0)
    d, state = hpa.decide(spec, state, sig(15.0, total=4 * 50.0, ready=4), 15.0)
    assert d.replicas == 4  # the recommendation of 4 at t=0 is inside the 300 s window
    for t in range(30, 330, 15):
        d, state = hpa.decide(spec, state, sig(float(t), total=4 * 50.0, ready=4), float(t))
    assert d.replicas == 2


def test_hpa_tolerance_and_sync_period():
    spec = hpa.HpaSpec(target_per_pod=100.0)
    d, state = hpa.decide(spec, hpa.initial_state(), sig(0.0, total=4 * 108.0, ready=4), 0.0)
    assert d.replicas == 4  # ratio 1.08 is within the 0.1 tolerance
    d, _ = hpa.decide(spec, state, sig(5.0, total=4 * 500.0, ready=4), 5.0)
    assert d.replicas == 4 and "between syncs" in d.reasons[0]


def test_hpa_scale_up_policies_take_the_larger_of_100_percent_and_4_pods():
    spec = hpa.HpaSpec(target_per_pod=10.0)
    d, _ = hpa.decide(spec, hpa.initial_state(), sig(0.0, total=1000.0, ready=2), 0.0)
    assert d.replicas == 6  # max(2 x 2, 2 + 4)
    d, _ = hpa.decide(spec, hpa.initial_state(), sig(0.0, total=5000.0, ready=10), 0.0)
    assert d.replicas == 20  # max(10 x 2, 10 + 4)


def test_hpa_counts_unready_pods_as_idle_when_scaling_up():
    spec = hpa.HpaSpec(target_per_pod=10.0)
    # 4 ready pods at 30 each, 2 starting: ratio over 6 pods = 120 / 60 = 2 -> 12
    d, _ = hpa.decide(spec, hpa.initial_state(), sig(0.0, total=120.0, ready=4, starting=2), 0.0)
    assert d.replicas == 12
    # 4 ready at 12 each with 2 starting: 48 / 60 < 1 flips direction -> no change
    d, _ = hpa.decide(spec, hpa.initial_state(), sig(0.0, total=48.0, ready=4, starting=2), 0.0)
    assert d.replicas == 6


def test_keda_average_value_is_ceil_of_value_over_threshold():
    spec = keda_prometheus.keda_spec(10.0)
    d, _ = keda_prometheus.decide(spec, keda_prometheus.initial_state(), sig(0.0, total=95.0, ready=5, spec=5), 0.0)
    assert d.replicas == 10 and d.reasons[0].startswith("keda:")
    # External metric ratio uses spec replicas: 5 ready of 8 wanted, value 80 -> exactly on target
    d, _ = keda_prometheus.decide(spec, keda_prometheus.initial_state(), sig(0.0, total=80.0, ready=5, starting=3), 0.0)
    assert d.replicas == 8


def test_kpa_panics_at_twice_capacity_and_keeps_the_panic_peak():
    spec = kpa.KpaSpec(container_concurrency=16.0, target_utilization_ratio=0.7)  # target 11.2
    state = kpa.initial_state()
    for t in range(0, 60, 15):
        _, state = kpa.decide(spec, state, sig(float(t), total=100.0, ready=10), float(t))
    d, state = kpa.decide(spec, state, sig(60.0, total=300.0, ready=10), 60.0)
    assert d.replicas == 27 and "panic" in d.reasons[0]  # ceil(300 / 11.2); 27 / 10 >= 2
    d, state = kpa.decide(spec, state, sig(75.0, total=50.0, ready=10), 75.0)
    assert d.replicas == 27  # no scale-down while panicking


def test_kpa_scale_down_rate_halves_at_most():
    spec = kpa.KpaSpec()
    d, _ = kpa.decide(spec, kpa.initial_state(), sig(0.0, total=0.0, ready=10), 0.0)
    assert d.replicas == 5


def test_clairvoyant_orders_a_cold_start_ahead_and_static_holds_the_peak():
    spec = oracle.OracleSpec(needed=(2, 2, 2, 9, 3, 3, 3, 3), start_s=0.0, tick_s=15.0, lead_s=30.0)
    got = [oracle.decide(spec, None, Signals(), t * 15.0)[0].replicas for t in range(8)]
    assert got == [2, 9, 9, 9, 3, 3, 3, 3]
    static = spec.model_copy(update={"static": True})
    d, peak = oracle.decide(static, None, Signals(), 0.0)
    assert d.replicas == 9 and peak == 9
