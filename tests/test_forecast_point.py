"""The forecaster's point forecast takes its damping sum from a memo: the same bits as the sum itself."""

from policies.stages import forecast
from policies.types import ForecastState


def test_the_point_forecast_is_the_damped_trend_summed_in_order_bit_for_bit():
    for phi in (0.8, 0.9137251, 0.98):
        fs = ForecastState(kind="holt", level=100.0, trend=3.7, phi=phi, alpha=0.5, beta=0.1)
        for steps in (1, 2, 7, 40):
            damp = 0.0
            for i in range(1, steps + 1):
                damp += phi**i
            assert forecast.point(fs, steps) == max(0.0, 100.0 + damp * 3.7)
            assert forecast.point(fs, steps) == forecast.point(fs, steps)  # again, from the memo


def test_an_undamped_trend_adds_one_trend_a_bucket():
    fs = ForecastState(kind="holt", level=10.0, trend=2.0, phi=1.0, alpha=0.5, beta=0.1)
    assert forecast.point(fs, 5) == 20.0
