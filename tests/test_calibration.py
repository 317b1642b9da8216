"""The upper forecast's conformal calibration at the lead time (`policies/stages/calibration.py`)."""

import math
from dataclasses import replace

import pytest

from policies import PolicySpec
from policies.stages import calibration, predictive
from policies.stages import forecast as fc
from policies.stages.sanitize import sanitize
from policies.types import ForecastState, PolicyState, Tick

from helpers import signals


def _issued_and_scored(spec, fs, *, bound, rates, lead_s=60.0, tick_s=15.0):
    """Issue `bound` every tick and observe `rates`, one a tick, as the pipeline does."""
    now = 0.0
    for rate in rates:
        fs = calibration.scored(spec, fs, rate, now)
        fs = calibration.issue(fs, now=now, lead_s=lead_s, upper=bound)
        now += tick_s
    return fs


def test_a_bound_exceeded_too_often_widens_by_what_its_misses_were_and_one_never_reached_narrows():
    spec = PolicySpec()
    rates = [100.0 + (i % 10) * 5.0 for i in range(200)]  # 100..145: a bound of 100 is exceeded on 90 %
    fs = _issued_and_scored(spec, ForecastState(), bound=100.0, rates=rates)
    n = len(fs.scores)
    assert n == 200 - 4  # the first four bounds were due from the fifth tick (lead 60 s)
    rank = math.ceil((n + 1) * spec.burst_quantile)
    assert calibration.factor(spec, fs) == sorted(fs.scores)[rank - 1] == pytest.approx(1.45)
    loose = _issued_and_scored(spec, ForecastState(), bound=200.0, rates=rates)
    assert calibration.factor(spec, loose) == pytest.approx(0.725)


def test_nothing_is_scored_without_a_rate_or_during_a_silence_and_few_scores_give_no_factor():
    spec = PolicySpec()
    fs = _issued_and_scored(spec, ForecastState(), bound=100.0, rates=[120.0] * 11)
    assert len(fs.scores) == 7 and calibration.factor(spec, fs) is None  # fewer than MIN_SCORES
    dropped = calibration.scored(spec, fs, None, 1000.0)
    assert dropped.scores == fs.scores and dropped.issued == ()  # due, no rate: dropped, not scored
    silent = ForecastState(interrupted_per_s=100.0)
    assert calibration.issue(silent, now=0.0, lead_s=60.0, upper=5.0).issued == ()
    back = ForecastState(interrupted_per_s=100.0, returned_at_s=0.0)
    assert calibration.issue(back, now=30.0, lead_s=60.0, upper=5.0).issued == ()  # within a lead time
    assert calibration.issue(back, now=60.0, lead_s=60.0, upper=5.0).issued == ((120.0, 5.0),)


def _tick(spec, fs, now):
    clean, _ = sanitize(spec, signals(now, rate=100.0, service=1.0, spec_replicas=10), None, now)
    return Tick(signals=signals(now), now=now, state=PolicyState(forecast=fs), clean=clean, service_s=1.0,
                startup_s=120.0, lead_s=60.0)


def test_the_predictive_stage_issues_the_raw_bound_and_sizes_on_the_calibrated_one_only_when_asked():
    spec = PolicySpec()
    fs, now = ForecastState(), 0.0
    for i in range(120):
        fs = fc.observe(spec, fs, 100.0 + (i % 2) * 10.0, now)
        now += 15.0
    plain = predictive.stage(spec, _tick(spec, fs, now))
    assert plain.state.forecast.issued == () and not any("calibrated" in r for r in plain.reasons)
    on = spec.model_copy(update={"calibrate_upper": True})
    first = predictive.stage(on, _tick(on, fs, now))
    assert first.state.forecast.issued == ((now + 60.0, plain.predicted[1]),)
    assert first.predicted == plain.predicted  # no scores yet
    scored = replace(fs, scores=(1.5,) * 20)
    wider = predictive.stage(on, _tick(on, scored, now))
    assert wider.predicted[1] == pytest.approx(1.5 * plain.predicted[1])
    assert any("x 1.500" in r and "calibrated" in r for r in wider.reasons)
    assert wider.predictive > plain.predictive
