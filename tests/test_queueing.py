"""Closed-form M/M/c results against textbook values."""

import math

import pytest

from policies.queueing import erlang_c, mean_wait, rate_within_slo, servers_for, wait_exceeds


def test_mm1_wait_probability_is_utilization():
    for rho in (0.1, 0.5, 0.9):
        assert erlang_c(1, rho) == pytest.approx(rho, rel=1e-9)


def test_mm2_textbook_value():
    # c = 2, a = 1: C = a^2/2 * 2/(2-1) / (1 + 1 + 1) = 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3, rel=1e-9)


def test_worked_example_in_docstring():
    c = erlang_c(10, 8.0)
    assert c == pytest.approx(0.409, abs=0.002)
    assert wait_exceeds(10, 8.0, 1.0, 1.0) == pytest.approx(c * math.exp(-2.0), rel=1e-9)


def test_unstable_and_idle_edges():
    assert erlang_c(4, 4.0) == 1.0
    assert erlang_c(4, 0.0) == 0.0
    assert mean_wait(3, 5.0, 1.0) == math.inf


def test_large_systems_stay_finite():
    value = erlang_c(2000, 1950.0)
    assert 0.0 < value < 1.0


@pytest.mark.parametrize("rate", [0.5, 5.0, 80.0, 900.0])
def test_servers_for_is_the_fewest_that_meet_the_target(rate):
    n = servers_for(rate_per_s=rate, service_s=1.5, wait_s=2.0, miss_ratio=0.001)
    assert wait_exceeds(n, rate * 1.5, 1.5, 2.0) <= 0.001
    assert wait_exceeds(n - 1, rate * 1.5, 1.5, 2.0) > 0.001


def test_rate_within_slo_inverts_servers_for():
    rate = rate_within_slo(servers=64, service_s=2.0, wait_s=2.0, miss_ratio=0.01)
    assert servers_for(rate_per_s=rate, service_s=2.0, wait_s=2.0, miss_ratio=0.01) <= 64
    assert servers_for(rate_per_s=rate * 1.05, service_s=2.0, wait_s=2.0, miss_ratio=0.01) > 64
