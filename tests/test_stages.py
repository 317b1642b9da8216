"""Each stage of the predictive policy on its own: set inputs, expect a result."""

import math

import numpy as np
import pytest
from types import SimpleNamespace

from policies import PolicySpec, Sample, Signals
from policies.stages import forecast as fc
from policies.stages.bounds import bound
from policies.stages.combine import combine, confirm_window_s, remember_reactive
from policies.stages.feedback import slo_feedback
from policies.stages.growth import growth_risk, growth_samples
from policies.stages.leadtime import lead_time_s, remember_startups, startup_s
from policies.stages.reactive import learn_service_time, reactive
from policies.stages.sanitize import sanitize
from policies.stages.shedding import saturation_depths, shed_levels
from policies.stages.warmpool import keep_slots, warm_slots
from policies.types import ForecastState

from helpers import signals


# -- sanitize ---------------------------------------------------------------------------------------------
def test_sanitize_drops_nan_negative_stale_and_future_values(spec):
    raw = Signals(
        cluster=signals(100.0).cluster,
        queue_depth=Sample(math.nan, 100.0),
        in_flight=Sample(-1.0, 100.0),
        p99_latency_s=Sample(1.0, 100.0 - spec.max_signal_age_s - 1),
        token_rate_per_s=Sample(5.0, 130.0),
        arrival_rate_per_s=Sample(3.0, 99.0),
    )
    clean, _ = sanitize(spec, raw, None, 100.0)
    assert (clean.queue_depth, clean.in_flight, clean.p99_latency_s, clean.token_rate_per_s) == (None,) * 4
    assert clean.arrival_rate_per_s == 3.0
    assert len(clean.dropped) == 4
    assert any("stale" in d for d in clean.dropped) and any("future" in d for d in clean.dropped)


def test_counter_rate_and_reset(spec):
    first = Signals(cluster=signals(0.0).cluster, arrivals_total=Sample(1000.0, 0.0))
    clean, last = sanitize(spec, first, None, 0.0)
    assert clean.arrival_rate_per_s is None and last == (1000.0, 0.0)
    second = Signals(cluster=signals(15.0).cluster, arrivals_total=Sample(1150.0, 15.0))
    clean, last = sanitize(spec, second, last, 15.0)
    assert clean.arrival_rate_per_s == pytest.approx(10.0)
    reset = Signals(cluster=signals(30.0).cluster, arrivals_total=Sample(20.0, 30.0))
    clean, last = sanitize(spec, reset, last, 30.0)
    assert clean.arrival_rate_per_s is None
    assert any("counter reset" in d for d in clean.dropped)
    assert last == (20.0, 30.0)


# -- reactive ---------------------------------------------------------------------------------------------
def test_reactive_worked_example_from_docstring():
    spec = PolicySpec(replica_concurrency=16, slo_queue_wait_s=2.0)
    clean, _ = sanitize(spec, signals(0.0, rate=30.0, service=2.0, queue=0.0), None, 0.0)
    n, _ = reactive(spec, clean, 2.0)
    assert n == 5
    clean, _ = sanitize(spec, signals(0.0, rate=30.0, service=2.0, queue=40.0), None, 0.0)
    n, reasons = reactive(spec, clean, 2.0)
    assert n == 7 and "queue 40" in reasons[0]


def test_reactive_pressure_from_latency_and_memory(spec):
    spec = spec.model_copy(update={"p99_latency_target_s": 1.0})
    clean, _ = sanitize(spec, signals(0.0, rate=1.0, p99=3.0, spec_replicas=10), None, 0.0)
    n, reasons = reactive(spec, clean, 1.0)
    assert n == 11 and "p99" in reasons[0]
    clean, _ = sanitize(spec, signals(0.0, rate=1.0, headroom=0.01, spec_replicas=10), None, 0.0)
    n, reasons = reactive(spec, clean, 1.0)
    assert n == math.ceil(10 * 0.99 / 0.95) and "memory" in reasons[0]


def test_service_time_prefers_the_measured_value_and_falls_back_to_littles_law(spec):
    clean, _ = sanitize(spec, signals(0.0, rate=10.0, service=3.0, in_flight=50.0), None, 0.0)
    assert learn_service_time(spec, None, clean) == 3.0
    no_measure = signals(0.0, rate=10.0, service=None, in_flight=50.0)
    clean, _ = sanitize(spec, no_measure, None, 0.0)
    assert learn_service_time(spec, None, clean) == pytest.approx(5.0)
    busy_queue = signals(0.0, rate=10.0, service=None, in_flight=50.0, queue=100.0)
    clean, _ = sanitize(spec, busy_queue, None, 0.0)
    assert learn_service_time(spec, 2.0, clean) == 2.0  # saturated: Little's law on arrivals is wrong


def test_service_time_is_not_learned_by_littles_law_while_the_gateway_holds_requests(spec):
    """Scale to zero: while the gateway holds requests, the replicas serve a released backlog that arrived before
    the rate's window (368 in flight against 8 req/s of new arrivals read 46 s for a 0.7-s service on the Azure
    code trace). Before, that was learned."""
    from dataclasses import replace

    releasing = replace(signals(0.0, rate=8.0, service=None, in_flight=368.0), held_requests=Sample(5000.0, 0.0))
    clean, _ = sanitize(spec, releasing, None, 0.0)
    assert learn_service_time(spec, 0.7, clean) == 0.7
    released = replace(releasing, held_requests=Sample(0.0, 0.0), in_flight=Sample(8.0, 0.0))
    clean, _ = sanitize(spec, released, None, 0.0)
    assert learn_service_time(spec, None, clean) == pytest.approx(1.0)  # none held: Little's law again


# -- lead time --------------------------------------------------------------------------------------------
def test_lead_time_learns_a_high_percentile_and_adds_node_provisioning(spec):
    assert startup_s(spec, ()) == spec.default_startup_s
    samples = ()
    for d in range(100, 200, 10):
        clean, _ = sanitize(spec, signals(0.0, startups=(float(d),)), None, 0.0)
        samples = remember_startups(spec, samples, clean)
    assert startup_s(spec, samples) == 190.0
    assert lead_time_s(spec, 190.0, free_slots=0) == 190.0 + spec.node_provisioning_s
    assert lead_time_s(spec, 190.0, free_slots=2) == 190.0


def test_node_provisioning_is_learned_per_node_type_and_the_slowest_type_counts(spec):
    from policies.stages.leadtime import node_provisioning_s, remember_node_waits

    default, why = node_provisioning_s(spec, ())
    assert default == spec.node_provisioning_s and "no pod has waited" in why
    samples = ()
    waits = (tuple(("g5.xlarge", float(d)) for d in range(60, 160, 10))
             + (("p5.48xlarge", 600.0), ("p5.48xlarge", 700.0)))
    for w in waits + (("g5.xlarge", -1.0), ("g5.xlarge", 1e9)):  # impossible durations are not samples
        clean, _ = sanitize(spec, signals(0.0, node_waits=(w,)), None, 0.0)
        samples = remember_node_waits(spec, samples, clean)
    assert len(samples) == len(waits)
    learned, why = node_provisioning_s(spec, samples)
    assert learned == 700.0 and "2 pod waits for a new p5.48xlarge node, the slowest of 2 node types" in why
    g5_only = tuple(w for w in samples if w[0] == "g5.xlarge")
    assert node_provisioning_s(spec, g5_only)[0] == 150.0  # p90 of 60..150
    assert lead_time_s(spec, 100.0, free_slots=0, node_s=150.0) == 250.0
    assert lead_time_s(spec, 100.0, free_slots=1, node_s=150.0) == 100.0


# -- forecast ---------------------------------------------------------------------------------------------
def _feed(spec, rates, tick=15.0, start=0.0, shares=None):
    """`shares`: each tick's protected share (per tick, or one for all; None: not measured)."""
    fs = ForecastState()
    t = start
    for i, r in enumerate(rates):
        share = shares[i] if isinstance(shares, (list, tuple)) else shares
        fs = fc.observe(spec, fs, r, t, share)
        t += tick
    return fs, t


def test_forecast_moves_from_level_to_holt_to_holt_winters():
    spec = PolicySpec(season_s=3600.0, forecast_bucket_s=300.0, refit_interval_s=3600.0)
    fs, _ = _feed(spec, [10.0] * 20 * 3)  # 3 buckets
    assert fs.kind == "level"
    fs, _ = _feed(spec, [10.0] * 20 * 11)
    assert fs.kind == "level"  # too few buckets for five parameters
    fs, _ = _feed(spec, [10.0] * 20 * 13)
    assert fs.kind == "holt"
    fs, _ = _feed(spec, [10.0] * 20 * 12 * 2 + [10.0] * 20)
    assert fs.kind == "holt-winters"


def test_seasonal_forecast_predicts_the_daily_peak():
    """Three 'days' of a 1-hour season: the forecast an hour-quarter ahead follows the cycle, which a level
    model cannot."""
    spec = PolicySpec(season_s=3600.0, forecast_bucket_s=300.0, refit_interval_s=1800.0)
    t = np.arange(0, 3 * 3600, 15.0)
    rates = 100 + 60 * np.sin(2 * np.pi * t / 3600.0)
    fs, now = _feed(spec, rates)
    assert fs.kind == "holt-winters"
    truth = 100 + 60 * np.sin(2 * np.pi * (now + 900) / 3600.0)
    mean, upper = fc.forecast(spec, fs, now=now, start_s=900.0, end_s=900.0)
    assert mean == pytest.approx(truth, abs=12.0)
    assert upper >= mean


def test_cheap_update_continues_the_fitted_filter():
    """Between refits, one recursion step per bucket equals what statsmodels' own filter would give."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    spec = PolicySpec(season_s=3600.0, forecast_bucket_s=300.0, refit_interval_s=10 * 86400.0)
    rng = np.random.default_rng(2)
    buckets = 100 + 30 * np.sin(2 * np.pi * np.arange(40) / 12) + rng.normal(0, 2, 40)
    fs = ForecastState(bucket_start_s=0.0, history=tuple(buckets[:36]))
    fs = fc._fit(spec, fs, now=0.0)
    for y in buckets[36:]:
        fs = fc._step(fs, float(y))
    model = ExponentialSmoothing(buckets[:36], trend="add", damped_trend=True, seasonal="add", seasonal_periods=12,
                                 initialization_method="heuristic", bounds=fc._BOUNDS)
    fitted = model.fit()
    params = {k: fitted.params[k] for k in ("smoothing_level", "smoothing_trend", "smoothing_seasonal",
                                             "damping_trend", "initial_level", "initial_trend")}
    params["initial_seasons"] = fitted.params["initial_seasons"]
    continued = ExponentialSmoothing(buckets, trend="add", damped_trend=True, seasonal="add", seasonal_periods=12,
                                     initialization_method="known", initial_level=params["initial_level"],
                                     initial_trend=params["initial_trend"],
                                     initial_seasonal=params["initial_seasons"]).fit(
        smoothing_level=params["smoothing_level"], smoothing_trend=params["smoothing_trend"],
        smoothing_seasonal=params["smoothing_seasonal"], damping_trend=params["damping_trend"], optimized=False)
    assert fs.level == pytest.approx(continued.level[-1], rel=1e-6)
    assert fc.point(fs, 1) == pytest.approx(continued.forecast(1)[0], rel=1e-6)


def test_a_start_up_ramp_is_not_a_trend_and_the_forecast_follows_a_decline():
    """Seen live: a controller started with the traffic, so its first bucket held the ramp-in (0, then the
    level). Fitted on 6 buckets, statsmodels' best Holt was alpha ~ 0: a rising line that the falling
    demand after it never moved, for the whole refit interval (the forecast rose while demand halved)."""
    spec = PolicySpec(forecast_bucket_s=300.0)
    t = np.arange(0, 30 * 60, 15.0)
    ramp_in = np.minimum(1.0, t / 60.0) * 50.0  # the rate window filling up
    t2 = np.arange(30 * 60, 120 * 60, 15.0)
    decline = np.maximum(25.0, 50.0 - 25.0 * (t2 - 30 * 60) / 3600.0)  # then halving over an hour
    fs, now = _feed(spec, np.concatenate([ramp_in, decline]), start=7.0)
    assert fs.alpha >= 0.1 and fs.fitted_buckets > fc._HOLT_MIN_BUCKETS  # refitted as the history grew
    mean, _ = fc.forecast(spec, fs, now=now, start_s=60.0, end_s=60.0)
    assert mean < 32.0  # demand is at 25 and falling: not the 50+ a frozen rising line would say


def test_a_step_is_not_extrapolated_as_a_trend():
    """Seen live in the doubling drill: bucket means of a step from 25 to 50 req/s. Fitted on those 6
    buckets, Holt's best was alpha = beta = 1 (the last difference, +16 a bucket, taken as the trend) and
    the forecast two buckets on was 90 req/s; the controller ordered 20 replicas for 11 replicas' demand.
    However much flat history follows the step, the forecast stays near the new level."""
    spec = PolicySpec(forecast_bucket_s=300.0)
    buckets = [23.8, 26.9, 26.2, 27.8, 38.3, 54.7] + [51.3, 54.1, 54.0, 52.6, 51.7, 54.6, 53.7, 52.9]
    for n in range(6, len(buckets) + 1):
        fs, now = _feed(spec, np.repeat(buckets[:n], 20), start=0.0)
        fs = fc.observe(spec, fs, buckets[n - 1], now)  # closes the last bucket
        mean, _ = fc.forecast(spec, fs, now=now, start_s=0.0, end_s=600.0)
        assert mean <= 1.25 * 54.7, (n, fs.kind, mean)


def test_upper_bound_tracks_on_off_bursts_without_multiplying_them():
    """On/off traffic: bursts at 600 req/s, gaps at 0. The bound sits near the burst height, not at the
    bucket mean times the burst ratio."""
    spec = PolicySpec()
    pattern = ([600.0] * 6 + [0.0] * 10) * 20
    fs, now = _feed(spec, pattern)
    mean, upper = fc.forecast(spec, fs, now=now, start_s=420.0, end_s=435.0)
    assert mean < 400.0
    assert 550.0 <= upper <= 700.0


def test_missing_rate_learns_nothing():
    spec = PolicySpec()
    fs, now = _feed(spec, [10.0] * 30)
    assert fc.observe(spec, fs, None, now).bucket_n == fs.bucket_n


# -- combine / bounds ---------------------------------------------------------------------------------------
def test_short_burst_is_not_provisioned_until_sustained_for_a_start_up(spec):
    """Start-up 120 s: a burst must hold 120 s before replicas are ordered for it; a climb counts at once."""
    window = confirm_window_s(spec, 120.0, climbing=False)
    assert window == 120.0 and confirm_window_s(spec, 120.0, climbing=True) == 0.0
    assert confirm_window_s(spec.model_copy(update={"burst_confirm_s": 30.0}), 120.0, climbing=False) == 30.0
    recent = ()
    for t, r in [(0.0, 5), (15.0, 5), (30.0, 20), (45.0, 20), (60.0, 20), (75.0, 20), (90.0, 20)]:
        recent = remember_reactive(recent, r, t, keep_s=window)
    n, reasons = combine(reactive=20, recent=recent, predictive=6, window_s=window, now=90.0)
    assert n == 6 and "forecast" in reasons[0]  # held 60 s of 120: a burst, queued or shed
    for t in (105.0, 120.0, 135.0):
        recent = remember_reactive(recent, 20, t, keep_s=window)
    n, _ = combine(reactive=20, recent=recent, predictive=6, window_s=window, now=135.0)
    assert n == 20  # held for a whole start-up: provisioned
    n, _ = combine(reactive=20, recent=recent[:3], predictive=6, window_s=0.0, now=30.0)
    assert n == 20  # climbing: at once


def test_an_unconfirmed_burst_is_ordered_at_once_onto_free_slots_and_only_onto_them(spec):
    """Start-up 120 s, 6 replicas running for the forecast, a burst needing 20 held for 30 s: with no free
    slot it waits its confirmation (queued or shed); with 4 warm or idle slots free, 10 are wanted at once
    (capacity paid for already lands after a start-up), never more than the burst needs."""
    recent = ()
    for t, r in [(0.0, 6), (15.0, 20), (30.0, 20)]:
        recent = remember_reactive(recent, r, t, keep_s=120.0)
    n, reasons = combine(reactive=20, recent=recent, predictive=6, window_s=120.0, now=30.0)
    assert n == 6 and "queue/shed" in reasons[-1]
    n, reasons = combine(reactive=20, recent=recent, predictive=6, window_s=120.0, now=30.0, onto_free=6 + 4)
    assert n == 10 and "4 replicas ordered now onto free warm or idle slots" in reasons[-1]
    n, _ = combine(reactive=8, recent=recent, predictive=6, window_s=120.0, now=30.0, onto_free=6 + 4)
    assert n == 8
    n, _ = combine(reactive=20, recent=recent, predictive=12, window_s=120.0, now=30.0, onto_free=6 + 4)
    assert n == 12  # the forecast already asks for more than the free slots hold


def test_stabilization_holds_the_window_maximum_and_a_fresh_start_holds_current(spec):
    n, history, reasons = bound(spec, wanted=3, current=10, recommendations=(), lead_s=120.0, now=0.0)
    assert n == 10 and "holding" in reasons[0]
    n, history, _ = bound(spec, wanted=3, current=10, recommendations=history, lead_s=120.0, now=300.0)
    assert n == 10
    n, history, _ = bound(spec, wanted=3, current=10, recommendations=history, lead_s=120.0, now=601.0)
    assert n == 3


def test_a_decision_does_not_fall_back_below_the_last_one_within_a_tick_of_it(spec):
    # ticks 50 ms apart at a wake: 12 decided, KEDA's HPA has not applied it, the Deployment still reads 8;
    # the next tick wants 8 (its climb not seen this time): held at 12, the last decision, for the window
    n, history, _ = bound(spec, wanted=12, current=8, recommendations=((0.0, 8),), lead_s=55.0, now=1.0)
    assert n == 12
    n, _, reasons = bound(spec, wanted=8, current=8, recommendations=history, lead_s=55.0, now=1.05, decided=12)
    assert n == 12 and "holding 12" in reasons[0]
    assert bound(spec, wanted=8, current=8, recommendations=history, lead_s=55.0, now=1.05)[0] == 8  # before
    # what runs above the last decision still caps the hold at the window's maximum, as before
    assert bound(spec, wanted=3, current=10, recommendations=((0.0, 6),), lead_s=55.0, now=1.0, decided=6)[0] == 6


def test_the_last_decision_counts_only_within_a_tick_of_it(spec):
    from policies.stages.bounds import _just_decided
    from policies.types import PolicyState
    state = PolicyState(last_replicas=12, recommendations=((100.0, 12),))
    assert _just_decided(spec, SimpleNamespace(state=state, now=100.05)) == 12
    assert _just_decided(spec, SimpleNamespace(state=state, now=100.0 + spec.tick_s)) is None  # a tick on: what runs
    assert _just_decided(spec, SimpleNamespace(state=PolicyState(), now=1.0)) is None


def test_stabilization_window_is_never_shorter_than_lead_time(spec):
    n, history, _ = bound(spec, wanted=10, current=10, recommendations=(), lead_s=900.0, now=0.0)
    n, _, _ = bound(spec, wanted=2, current=10, recommendations=history, lead_s=900.0, now=800.0)
    assert n == 10


def test_scale_up_rate_limit_and_bounds(spec):
    n, _, reasons = bound(spec, wanted=90, current=10, recommendations=((0.0, 10),), lead_s=0.0, now=1.0)
    assert n == 20 and "limited" in reasons[-1]
    n, _, _ = bound(spec, wanted=500, current=100, recommendations=((0.0, 100),), lead_s=0.0, now=1.0)
    assert n == spec.max_replicas


# -- warm pool / shedding / feedback ------------------------------------------------------------------------
def test_warm_pool_holds_forecast_growth_within_limits(spec):
    assert warm_slots(spec, replicas=10, peak_replicas=14)[0] == 4
    assert warm_slots(spec, replicas=10, peak_replicas=40)[0] == spec.max_warm_slots
    assert warm_slots(spec, replicas=10, peak_replicas=8)[0] == 0
    assert warm_slots(spec, replicas=10, peak_replicas=None)[0] == 0


def test_warm_pool_covers_the_growth_risk_less_idle_slots(spec):
    n, reasons = warm_slots(spec, replicas=10, peak_replicas=11, risk_replicas=15, risk_why="p99 ...", idle_slots=2)
    assert n == 3 and "15 replicas if demand grows as it has (p99 ...)" in reasons[0] and "2 idle" in reasons[0]
    assert warm_slots(spec, replicas=10, peak_replicas=None, risk_replicas=9)[0] == 0
    tight = spec.model_copy(update={"max_replicas": 12})
    assert warm_slots(tight, replicas=10, peak_replicas=None, risk_replicas=30)[0] == 2  # the replica bound
    assert warm_slots(spec.model_copy(update={"max_warm_slots": 0}), replicas=10, peak_replicas=40,
                      risk_replicas=40)[0] == 0


def _keep(growths, *, idle=0, hold_s=300.0, tick_s=15.0, replicas=10):
    """The slots kept tick by tick for a sequence of growth needs beyond `replicas` (the risk sized at
    replicas + growth), `idle` idle node slots throughout."""
    needs, held, kept = (), 0, []
    for i, growth in enumerate(growths):
        held, needs = keep_slots(needs, held=held, asked=max(0, growth - idle), risk_replicas=replicas + growth,
                                 replicas=replicas, now=i * tick_s, hold_s=hold_s)
        kept.append(held)
    return kept


def test_warm_pool_keeps_a_need_that_oscillates_at_its_top():
    assert _keep([5, 7] * 20) == [5] + [7] * 39  # deleting two placeholders every other tick saves nothing


def test_warm_pool_releases_a_need_that_falls_and_stays_down_after_one_node_provisioning():
    """7 asked last at t = 0; 5 from then on: held until 300 s (the hold) after 7 was asked, then 5."""
    kept = _keep([7] + [5] * 30)
    assert kept[:20] == [7] * 20 and kept[20:] == [5] * 11  # t = 0 .. 285 s, then from 300 s
    stepwise = _keep([7] + [6] * 10 + [5] * 30)  # each slot goes 300 s after it was last asked for
    assert stepwise[19] == 7 and stepwise[20] == 6 and stepwise[29] == 6 and stepwise[30] == 5


def test_warm_pool_rises_at_once_and_idle_slots_lower_what_is_created_not_what_is_held():
    assert _keep([2, 2, 6]) == [2, 2, 6]
    assert _keep([0, 3], hold_s=0.0) == [0, 3] and _keep([3, 0], hold_s=0.0) == [3, 0]  # no hold: no hysteresis
    # 7 held; then 3 idle node slots appear: deleting 3 placeholders would leave 3 more idle nodes (billed as
    # before until removed), which would count against the pool again, and so on until it is empty
    held, needs = keep_slots((), held=0, asked=7, risk_replicas=17, replicas=10, now=0.0, hold_s=300.0)
    for i in range(1, 100):
        held, needs = keep_slots(needs, held=held, asked=4, risk_replicas=17, replicas=10, now=i * 15.0,
                                 hold_s=300.0)
    assert held == 7
    assert _keep([7, 7], idle=3) == [4, 4]  # what is created is less the idle slots


def test_replicas_that_grow_into_the_warm_pool_lower_it_at_once():
    """The risk is sized at 17 replicas: 10 replicas and 7 slots; 3 replicas more take 3 of the slots, the
    risk is the same, so the pool is 4 at once (not refilled behind them); the risk falling is held."""
    held, needs = keep_slots((), held=0, asked=7, risk_replicas=17, replicas=10, now=0.0, hold_s=300.0)
    held, needs = keep_slots(needs, held=held, asked=4, risk_replicas=17, replicas=13, now=15.0, hold_s=300.0)
    assert held == 4
    held, needs = keep_slots(needs, held=held, asked=2, risk_replicas=15, replicas=13, now=30.0, hold_s=300.0)
    assert held == 4


def test_growth_samples_are_the_largest_rise_within_one_provisioning_time():
    spec = PolicySpec(forecast_bucket_s=300.0, node_provisioning_s=300.0)
    assert growth_samples(spec, (100.0, 100.0, 140.0, 150.0)).tolist() == pytest.approx([0.0, 0.4, 150 / 140 - 1])
    two = spec.model_copy(update={"node_provisioning_s": 600.0})  # two buckets ahead
    assert growth_samples(two, (100.0, 90.0, 150.0, 120.0)).tolist() == pytest.approx([0.5, 150 / 90 - 1])
    # a near-silent start counts at 2 % of the peak, not as an unbounded rise
    assert growth_samples(spec, (0.0, 100.0)).tolist() == pytest.approx([100 / 2 - 1])


def test_growth_samples_are_the_bits_of_numpys_windowed_maximum():
    """The windows' peaks as shifted maxima: the same doubles as `sliding_window_view(...).max(axis=1)`, for
    horizons of one to five buckets, histories with zeros of both signs, repeats and a silent start."""
    rng = np.random.default_rng(7)
    spec = PolicySpec(forecast_bucket_s=300.0)
    for length in (0, 1, 2, 3, 7, 50, 400):
        history = tuple(float(x) for x in rng.choice([0.0, -0.0, 3.0, 3.0, 100.0, 0.5], size=length)
                        * rng.uniform(0.5, 2.0, size=length))
        for buckets in range(1, 6):
            spec_h = spec.model_copy(update={"node_provisioning_s": 300.0 * buckets})
            y = np.asarray(history, dtype=float)
            if len(y) <= buckets:
                expected = np.zeros(0)
            else:
                windows = np.lib.stride_tricks.sliding_window_view(y[1:], buckets)
                floor = max(0.02 * float(y.max()), 1e-9)
                expected = np.maximum(windows.max(axis=1) / np.maximum(y[: len(windows)], floor) - 1.0, 0.0)
            assert growth_samples(spec_h, history).tobytes() == expected.tobytes(), (length, buckets)


def test_growth_risk_follows_the_time_of_day_and_has_a_floor():
    """Three days of 5-min buckets, flat at 100 but for a rise to 200 every day at 08:00: at 08:00 the risk
    is the doubling; at 20:00 nothing grows; a floor holds whatever the history says."""
    spec = PolicySpec(forecast_bucket_s=300.0, node_provisioning_s=300.0)
    day = [100.0] * 288
    day[97:110] = [200.0] * 13  # 08:05 to 09:10
    fs = ForecastState(history=tuple(day * 3), bucket_start_s=3 * 86400.0, kind="level", level=100.0)
    morning, why = growth_risk(spec, fs, now=3 * 86400.0 + 8 * 3600.0)
    evening, _ = growth_risk(spec, fs, now=3 * 86400.0 + 20 * 3600.0)
    assert morning == pytest.approx(1.0) and "this time of day" in why
    assert evening == 0.0
    floored, _ = growth_risk(spec.model_copy(update={"warm_growth_min_ratio": 0.5}), fs, now=3 * 86400.0 + 20 * 3600.0)
    assert floored == 0.5
    short = ForecastState(history=(40.0, 100.0, 130.0, 120.0), bucket_start_s=1200.0, kind="level", level=120.0)
    risk, why = growth_risk(spec, short, now=900.0)
    assert risk == pytest.approx(0.3, abs=0.01) and "all history" in why


def test_a_steady_climb_is_extrapolated_a_step_or_noise_is_not():
    spec = PolicySpec(tick_s=15.0)
    rng = np.random.default_rng(3)
    ramp = tuple(20.0 + 1.0 * i + rng.normal(0, 0.3) for i in range(8))
    ahead = fc.climb(spec, ForecastState(rates=ramp), horizon_s=120.0)
    assert ahead == pytest.approx(27.0 + 8.0, abs=1.0)  # 8 ticks more of +1 req/s per tick
    step = (20.0,) * 4 + (30.0,) * 4
    noise = tuple(20.0 + rng.normal(0, 1.0) for _ in range(8))
    falling = tuple(reversed(ramp))
    for rates in (step, noise, falling, ramp[:5]):
        assert fc.climb(spec, ForecastState(rates=rates), horizon_s=120.0) is None


def test_shedding_takes_the_excess_from_the_lowest_priority_only(spec):
    rates = {"critical": 20.0, "standard": 50.0, "sheddable": 30.0}
    clean, _ = sanitize(spec, signals(0.0, rate=100.0, service=1.0, spec_replicas=10, by_priority=rates), None, 0.0)
    levels, reasons = shed_levels(spec, clean, 1.0)
    assert set(levels) == {"sheddable"}
    assert 0.0 < levels["sheddable"] <= 1.0 and reasons
    clean, _ = sanitize(spec, signals(0.0, rate=20.0, service=1.0, spec_replicas=10, by_priority=rates), None, 0.0)
    assert shed_levels(spec, clean, 1.0)[0] == {"sheddable": 0.0}


def test_steady_traffic_scales_down_after_one_lead_time_bursty_traffic_after_the_window():
    """40 replicas recommended 300 s ago, 30 now, a lead time of 140 s: with a burst envelope of 1.3 x the
    forecast (steady) the 40 are released; at 6 x (on/off bursts) the 600-s window holds them."""
    from policies.stages import bounds
    from policies.types import PolicyState, Tick

    spec = PolicySpec(max_replicas=100)
    now = 10_000.0
    clean, _ = sanitize(spec, signals(now, rate=30.0, spec_replicas=40), None, now)
    state = PolicyState(recommendations=((now - 300.0, 40), (now - 15.0, 30)))

    def decided(ratio):
        tick = Tick(signals=signals(now), now=now, state=state, clean=clean, current=40, lead_s=140.0,
                    replicas=30, quantiles=(ratio, 50.0))
        return bounds.stage(spec, tick)

    assert decided(1.3).replicas == 30
    bursty = decided(6.0)
    assert bursty.replicas == 40 and any("holding 40" in line for line in bursty.reasons)
    assert decided(None).replicas == 40  # no envelope yet: not known to be steady
    never = spec.model_copy(update={"steady_burst_ratio": 0.0})
    assert bounds.stage(never, Tick(signals=signals(now), now=now, state=state, clean=clean, current=40,
                                    lead_s=140.0, replicas=30, quantiles=(1.3, 50.0))).replicas == 40


def test_a_backlog_is_the_guards_while_it_covers_the_shed_classes():
    """10 replicas x 16 slots at 1 s serve ~150 req/s within the SLO: 120 req/s needs no shedding, and the
    400 queued behind a burst drain within seconds, which the guard (on the live queue) covers. A shed level
    sized to drain them in one SLO would reject sheddable requests for the whole next tick."""
    spec = PolicySpec(replica_concurrency=16, slo_queue_wait_s=2.0)
    rates = {"critical": 24.0, "standard": 60.0, "sheddable": 36.0}
    clean, _ = sanitize(spec, signals(0.0, rate=120.0, queue=400.0, service=1.0, spec_replicas=10,
                                      by_priority=rates), None, 0.0)
    assert "sheddable" in saturation_depths(spec, 10, 1.0)
    assert shed_levels(spec, clean, 1.0)[0] == {"sheddable": 0.0}
    unguarded = spec.model_copy(update={"guard_priority_below": -1})  # no guard: the level drains the queue
    assert saturation_depths(unguarded, 10, 1.0) == {}
    levels, reasons = shed_levels(unguarded, clean, 1.0)
    assert levels["sheddable"] > 0.0 and reasons


def test_saturation_guard_never_covers_the_highest_priority():
    spec = PolicySpec(replica_concurrency=16, slo_queue_wait_s=2.0)
    depths = saturation_depths(spec, ready_replicas=40, service_s=0.7)
    assert set(depths) == {"sheddable", "standard"}
    assert depths["sheddable"] == int(640 * 0.5 * 2 / 0.7)
    assert depths["standard"] == int(640 * 0.8 * 2 / 0.7)
    with pytest.raises(ValueError, match="highest priority"):
        PolicySpec(guard_priority_below=2)


def test_slo_feedback_learns_only_from_misses_with_capacity_in_place(spec):
    spec = spec.model_copy(update={"p99_latency_target_s": 2.0})
    clean, _ = sanitize(spec, signals(0.0, p99=5.0), None, 0.0)
    assert slo_feedback(spec, 1.0, clean, model_satisfied=True)[0] == pytest.approx(1.05)
    assert slo_feedback(spec, 1.0, clean, model_satisfied=False)[0] == 1.0
    quiet, _ = sanitize(spec, signals(0.0, p99=0.1), None, 0.0)
    assert slo_feedback(spec, 1.5, quiet, model_satisfied=True)[0] == pytest.approx(1.5 * 0.998)
    assert slo_feedback(spec, 2.0, clean, model_satisfied=True)[0] == spec.max_headroom_ratio


def test_a_gap_is_filled_with_the_model_not_with_zeros():
    spec = PolicySpec()
    fs, now = _feed(spec, [80.0] * 3)  # the first bucket is still open
    fs = fc.observe(spec, fs, 80.0, now + 3 * spec.forecast_bucket_s)  # three buckets later
    assert len(fs.history) == 3 and min(fs.history) == pytest.approx(80.0)
    assert fc.point(fs, 1) == pytest.approx(80.0)


def test_an_implausible_drop_to_zero_is_held_as_an_outage_then_accepted():
    spec = PolicySpec(outage_hold_s=900.0)
    fs, now = _feed(spec, [100.0] * 300)  # steady: silent ticks never happen
    expected = fc.point(fs, 1)
    for i in range(40):  # 10 minutes of nothing
        fs = fc.observe(spec, fs, 0.0, now + 15.0 * i)
    assert fc.outage_held(spec, fs, now + 15.0 * 39)
    assert fc.point(fs, 1) == pytest.approx(expected, rel=0.05)  # not learned
    for i in range(40, 100):  # past the hold: accepted as real
        fs = fc.observe(spec, fs, 0.0, now + 15.0 * i)
    assert not fc.outage_held(spec, fs, now + 15.0 * 99)
    assert fs.history[-1] == 0.0  # the silence is learned from then on


def test_traffic_back_after_a_long_silence_is_the_level_it_interrupted_not_a_burst():
    """Half an hour of nothing (the 5-minute outage hold long expired, the zeros learned, the forecast near 0),
    then traffic returns: the predictive stage sizes for the 100 req/s the silence interrupted at once."""
    from policies.stages import predictive
    from policies.types import PolicyState, Tick

    spec = PolicySpec(outage_hold_s=300.0)
    fs, now = _feed(spec, [100.0] * 80)
    for i in range(120):
        fs = fc.observe(spec, fs, 0.0, now + 15.0 * i)
    assert fc.point(fs, 1) < 10.0
    back_s = now + 15.0 * 120
    fs = fc.observe(spec, fs, 30.0, back_s)  # the first tick of the return
    clean, _ = sanitize(spec, signals(back_s, rate=30.0, service=1.0, spec_replicas=1), None, back_s)
    tick = Tick(signals=signals(back_s), now=back_s, state=PolicyState(forecast=fs), clean=clean, service_s=1.0,
                startup_s=120.0, lead_s=420.0)
    after = predictive.stage(spec, tick)
    assert after.predicted is not None and after.predicted[1] >= 95.0
    assert any("traffic back after a silence" in line for line in after.reasons)
    assert fc.returning(fs, back_s, 420.0) == pytest.approx(100.0, rel=0.05)
    assert fc.returning(fs, back_s + 420.0, 420.0) is None  # one lead time: the forecast's own again


def test_on_off_traffic_is_never_an_outage():
    spec = PolicySpec()
    fs, now = _feed(spec, ([600.0] * 6 + [0.0] * 10) * 20)
    assert fs.outage_since_s is None


def test_replicas_that_cannot_get_a_node_are_named_and_the_warm_pool_yields():
    from policies import ClusterState
    from policies.stages.placement import unplaceable

    spec = PolicySpec(node_provisioning_s=300.0)
    told = ClusterState(spec_replicas=12, ready_replicas=9, unschedulable_pods=3, no_capacity_pods=2,
                        no_capacity_reason="karpenter: all available instance types exceed limits", at_s=0.0)
    count, reasons = unplaceable(spec, told)
    assert count == 2 and "exceed limits" in reasons[0] and "not counted as capacity on the way" in reasons[0]
    waiting = ClusterState(spec_replicas=12, ready_replicas=9, unschedulable_pods=3, oldest_unschedulable_s=200.0,
                           at_s=0.0)
    assert unplaceable(spec, waiting)[0] == 0  # a node is on its way
    overdue = ClusterState(spec_replicas=12, ready_replicas=9, unschedulable_pods=3, oldest_unschedulable_s=1000.0,
                           at_s=0.0)
    count, reasons = unplaceable(spec, overdue)
    assert count == 3 and "waiting for a node for 1000 s" in reasons[0]
    assert unplaceable(spec, overdue, node_s=400.0)[0] == 0  # learned: nodes take 400 s here, 1000 s is not 3x


def test_burst_episodes_closer_than_a_start_up_are_one():
    rates = (10.0,) * 5 + (50.0, 50.0, 12.0, 50.0) + (10.0,) * 10 + (50.0,) + (10.0,) * 3
    assert fc.episodes(rates, 30.0, gap_ticks=8) == [4, 1]  # the dip of one tick does not split the first
    assert fc.episodes(rates, 30.0, gap_ticks=11) == [15]
    assert fc.episodes(rates, 60.0, gap_ticks=1) == []


def test_a_rate_the_cut_covers_does_not_join_the_burst_into_a_longer_episode():
    # a burst to 100, then four ticks later one tick at 73: over the halfway threshold (72.0, the point forecast
    # about 44) but under the cut (75): the cut serves it, so the burst stays a one-off; at 80 it is not
    spec = PolicySpec()
    for after, cut in ((73.0, 75.0), (80.0, 100.0)):
        # every tick 75 % protected: the burst's share is 75 % (with the tick at 73 or 80 in it or not)
        fs, _ = _feed(spec, [40.0] * 40 + [100.0] * 4 + [40.0] * 4 + [after] + [30.0] * 30, shares=0.75)
        quantiles = fc.envelope(spec, fs)
        assert 72.0 < fc.point(fs, 1) + 0.5 * (quantiles[1] - fc.point(fs, 1)) < 73.0
        kept, _ = fc.recurring_only(fs, quantiles, gap_ticks=8, climbing=False)
        assert kept[1] == pytest.approx(cut)


def test_a_single_burst_envelope_is_cut_to_the_protected_share_and_nothing_without_classes():
    spec = PolicySpec()
    fs, _ = _feed(spec, [40.0] * 30 + [100.0] * 4 + [40.0] * 10, shares=0.7)
    quantiles = fc.envelope(spec, fs)
    cut, why = fc.recurring_only(fs, quantiles, gap_ticks=8, climbing=False)
    assert quantiles[1] == 100.0 and cut[1] == pytest.approx(70.0) and "not yet a pattern" in why
    assert fc.recurring_only(fs, quantiles, gap_ticks=8, climbing=True) == (quantiles, None)
    assert fc.recurring_only(fs, quantiles, gap_ticks=4, climbing=False) == (quantiles, None)
    unmeasured, _ = _feed(spec, [40.0] * 30 + [100.0] * 4 + [40.0] * 10)
    assert fc.recurring_only(unmeasured, quantiles, gap_ticks=8, climbing=False) == (quantiles, None)
    all_kept, _ = _feed(spec, [40.0] * 30 + [100.0] * 4 + [40.0] * 10, shares=1.0)
    assert fc.recurring_only(all_kept, quantiles, gap_ticks=8, climbing=False) == (quantiles, None)
    fs, _ = _feed(spec, [40.0] * 30 + ([100.0] * 4 + [40.0] * 10) * 2, shares=0.7)
    assert fc.recurring_only(fs, fc.envelope(spec, fs), gap_ticks=8, climbing=False)[1] is None


def test_the_cut_is_the_bursts_own_protected_share_whatever_a_later_tick_reads():
    # the burst's four ticks 60 % protected but one at 80 % (65 % of its arrivals); the ticks after it read from
    # 50 % to 90 %, the last 90 %: the cut stays at 65 % of the burst's 100 req/s
    spec = PolicySpec()
    rates = [40.0] * 30 + [100.0] * 4 + [40.0] * 6
    shares = [0.7] * 30 + [0.6, 0.6, 0.8, 0.6] + [0.5, 0.9, 0.6, 0.7, 0.9, 0.9]
    fs, _ = _feed(spec, rates, shares=shares)
    cut, why = fc.recurring_only(fs, fc.envelope(spec, fs), gap_ticks=8, climbing=False)
    assert cut[1] == pytest.approx(65.0) and "protected 65%" in why
    assert fs.protected_share_ratio == 0.9  # this tick's share, which the cut used before


def test_the_cut_is_the_share_at_the_bursts_height_not_diluted_by_a_lower_tick_of_another_mix():
    # a tick at 71 req/s, 50 % protected, 30 ticks before a burst to 100 at 75 %: above the halfway line, under
    # the cut; the share is read where the burst reached its height, so the cut stays at 75, not 71
    spec = PolicySpec()
    rates = [40.0] * 10 + [71.0] + [40.0] * 29 + [100.0] * 4 + [40.0] * 6
    shares = [0.75] * 10 + [0.5] + [0.75] * 29 + [0.75] * 4 + [0.75] * 6
    fs, _ = _feed(spec, rates, shares=shares)
    quantiles = fc.envelope(spec, fs)
    assert fc.point(fs, 1) + 0.5 * (quantiles[1] - fc.point(fs, 1)) < 71.0
    cut, _ = fc.recurring_only(fs, quantiles, gap_ticks=8, climbing=False)
    assert cut[1] == pytest.approx(75.0)


def test_a_burst_whose_classes_were_not_measured_is_not_cut():
    # the classes measured at 50 % before the burst, not during it: an unknown mix counts as protected
    spec = PolicySpec()
    rates = [40.0] * 30 + [100.0] * 4 + [40.0] * 6
    fs, _ = _feed(spec, rates, shares=[0.5] * 30 + [None] * 4 + [0.5] * 6)
    quantiles = fc.envelope(spec, fs)
    assert fc.recurring_only(fs, quantiles, gap_ticks=8, climbing=False) == (quantiles, None)
