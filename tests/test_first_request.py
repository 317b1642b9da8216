"""The forecaster's history begins at the model's first request, once its rate window is full: zeros read
before it and rates of a window still filling are not a level the model served (policies/stages/forecast.py,
"Before the first request"). Traffic that stops after it is learned as before."""

import pytest

from autoscaler.config import Settings
from autoscaler.crd import ModelAutoscalerSpec, settings_for
from loadtest.e2e.config import E2EConfig
from policies import PolicySpec
from policies.stages import forecast as fc
from policies.types import ForecastState

TICK_S = 15.0
# As seen live: the controller reads two ticks of 0 before the load starts, then its 60-s window fills.
START = [0.0, 0.0, 6.0, 9.3]


def _observed(spec, rates, *, start_s=225.0, fs=None):
    """`rates` one a tick from `start_s` (by default just before the first 5-min bucket closes)."""
    fs = fs or ForecastState()
    for i, rate in enumerate(rates):
        fs = fc.observe(spec, fs, rate, start_s + i * TICK_S)
    return fs


def test_zeros_before_the_first_request_are_not_learned():
    spec = PolicySpec()  # a rate per tick: learned from the first request on
    fs = _observed(spec, [0.0] * 8 + [10.0] * 40)
    assert fs.history and min(fs.history) == 10.0  # no bucket pulled down by the zeros
    assert 0.0 not in fs.rates and set(fs.ratios) == {1.0}
    assert fs.first_demand_s == 225.0 + 8 * TICK_S


def test_a_rate_read_while_its_window_fills_is_not_learned():
    spec = PolicySpec(rate_window_s=60.0)
    fs = _observed(spec, START + [10.0] * 40)
    assert fs.history[0] == 10.0  # the old code: mean(0, 0, 6.0, 9.3, 10) = 5.06
    assert 6.0 not in fs.rates and 9.3 not in fs.rates
    assert len(fs.rates) == 40 - 2  # two ticks at 10 still within 60 s of the first request
    waiting = _observed(spec, START)
    assert waiting.bucket_start_s is None and waiting.first_demand_s == 225.0 + 2 * TICK_S


def test_a_start_before_the_load_leaves_steady_traffic_steady():
    """The burst envelope's ratio quantile (what `bounds.steady` reads) on a constant 10 req/s after the start
    seen live; learned from the zeros and the filling window it read 10 / 5.06 = 1.98 for an hour, over the
    1.5 that makes traffic steady, and the scale-down window stayed 600 s."""
    spec = PolicySpec(rate_window_s=60.0)
    fs = _observed(spec, START + [10.0] * 120)
    ratio, _ = fc.envelope(spec, fs)
    assert ratio is not None and ratio <= spec.steady_burst_ratio
    assert fc.point(fs, 1) == pytest.approx(10.0)


def test_once_the_history_has_begun_a_silence_is_learned_as_before():
    spec = PolicySpec(rate_window_s=60.0, outage_hold_s=300.0)  # past the hold the zeros are learned
    fs = _observed(spec, START + [10.0] * 40)
    quiet = _observed(spec, [0.0] * 60, start_s=225.0 + 44 * TICK_S, fs=fs)
    assert quiet.history[-2:] == (0.0, 0.0) and quiet.rates[-1] == 0.0
    assert fc.point(quiet, 1) == pytest.approx(10.0 * 0.5**2)  # two zero buckets at the level's weight 0.5
    missing = fc.observe(spec, fs, None, 225.0 + 44 * TICK_S)  # no reading: nothing learned, as before
    assert missing.rates == fs.rates and missing.bucket_n == fs.bucket_n


def _settings(prometheus: dict, policy: dict | None = None) -> Settings:
    return Settings(target={"namespace": "llm", "name": "m"},
                    prometheus={"url": "http://127.0.0.1:9090", **prometheus}, policy=policy or {})


def test_the_controller_tells_the_policy_its_preset_rate_window():
    assert _settings({"rate_window_s": 30.0}).policy.rate_window_s == 30.0
    assert _settings({"rate_window_s": 30.0}, {"rate_window_s": 90.0}).policy.rate_window_s == 90.0
    # an arrival query of its own: its window is not known, nothing assumed
    own = _settings({"queries": {"arrival_rate_per_s": "sum(rate(requests_total[2m]))"}})
    assert own.policy.rate_window_s is None


def test_each_model_of_the_fleet_is_told_its_own_rate_window():
    spec = ModelAutoscalerSpec.model_validate({"target": {"name": "chat"}, "selector": {"matchLabels": {"app": "chat"}},
                                               "signals": {"prometheus": {"rate_window_s": 6.0}}})
    settings = settings_for(namespace="llm", spec=spec, base={"prometheus": {"url": "http://127.0.0.1:9090"}})
    assert settings.policy.rate_window_s == 6.0


def test_the_twin_runs_the_live_policy_with_the_live_rate_window():
    config = E2EConfig()
    assert config.spec().rate_window_s == config.rate_window_s  # the twin's policy, at factor 1
    assert config.live_spec()["rate_window_s"] == config.rate_window_s / config.factor  # the live controller's
