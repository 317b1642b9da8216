"""Closed-form M/M/c results against textbook values."""

import math
import random

import pytest

from policies import queueing
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


def _ufunc_erlang_c(servers: int, offered: float) -> float:
    """Erlang C through the scipy.special ufunc, as computed before the cython_special call."""
    from scipy.special import gammaincc

    if offered <= 0.0:
        return 0.0
    if servers <= offered:
        return 1.0
    log_pmf = min(0.0, servers * math.log(offered) - offered - math.lgamma(servers + 1))
    cdf = float(gammaincc(servers + 1, offered))
    if cdf <= 0.0:
        return 1.0
    b = math.exp(log_pmf) / cdf
    return min(1.0, servers * b / (servers - offered * (1.0 - b)))


def test_erlang_c_is_bit_identical_to_the_ufunc_evaluation():
    rng = random.Random(7)
    for _ in range(2000):
        servers = rng.randint(1, 5000)
        offered = rng.uniform(0.0, 1.1 * servers)
        assert erlang_c(servers, offered) == _ufunc_erlang_c(servers, offered)


def _bisected_rate(*, servers: int, service_s: float, wait_s: float, miss_ratio: float) -> float:
    """The 30-step bisection rate_within_slo replaced: the reference it must agree with."""
    lo, hi = 0.0, servers / service_s
    for _ in range(30):
        mid = (lo + hi) / 2
        if wait_exceeds(servers, mid * service_s, service_s, wait_s) > miss_ratio:
            hi = mid
        else:
            lo = mid
    return lo


@pytest.mark.parametrize("seed", range(4))
def test_rate_within_slo_meets_the_target_and_agrees_with_bisection(seed):
    rng = random.Random(seed)
    for _ in range(200):
        servers = rng.randint(1, 6000)
        service_s, wait_s = 10 ** rng.uniform(-2, 1.5), 10 ** rng.uniform(-1, 1)
        miss_ratio = 10 ** rng.uniform(-5, -0.5)
        rate = rate_within_slo(servers=servers, service_s=service_s, wait_s=wait_s, miss_ratio=miss_ratio)
        assert wait_exceeds(servers, rate * service_s, service_s, wait_s) <= miss_ratio
        reference = _bisected_rate(servers=servers, service_s=service_s, wait_s=wait_s, miss_ratio=miss_ratio)
        assert rate == pytest.approx(reference, abs=servers / service_s * 2.0**-29)


def test_rate_within_slo_edges():
    assert rate_within_slo(servers=0, service_s=1.0, wait_s=2.0, miss_ratio=0.01) == 0.0
    assert rate_within_slo(servers=8, service_s=1.0, wait_s=2.0, miss_ratio=0.0) == 0.0
    assert rate_within_slo(servers=8, service_s=1.0, wait_s=2.0, miss_ratio=1.0) == 8.0


def test_rate_within_slo_takes_a_handful_of_evaluations(monkeypatch):
    """Newton steps, not a 30-step bisection: the shedding stage calls it every tick."""
    calls = []
    original = queueing.erlang_b
    monkeypatch.setattr(queueing, "erlang_b", lambda servers, offered: calls.append(1) or original(servers, offered))
    for servers in (1, 16, 64, 640, 4000):
        calls.clear()
        queueing.rate_within_slo(servers=servers, service_s=0.7, wait_s=2.0, miss_ratio=0.01)
        assert 0 < len(calls) <= 12, servers


def _bisected_servers(*, rate_per_s: float, service_s: float, wait_s: float, miss_ratio: float) -> int:
    """The plain bisection servers_for used before it searched from square-root staffing."""
    offered = rate_per_s * service_s
    lo = math.floor(offered)
    hi = max(lo + 1, math.ceil(offered + 4.0 * math.sqrt(offered) + 2.0))
    while wait_exceeds(hi, offered, service_s, wait_s) > miss_ratio:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if wait_exceeds(mid, offered, service_s, wait_s) > miss_ratio else (lo, mid)
    return hi


@pytest.mark.parametrize("seed", range(4))
def test_servers_for_agrees_with_bisection(seed):
    rng = random.Random(seed)
    for _ in range(500):
        kw = dict(rate_per_s=10 ** rng.uniform(-3, 3.7), service_s=10 ** rng.uniform(-2, 2),
                  wait_s=10 ** rng.uniform(-1, 1), miss_ratio=10 ** rng.uniform(-7, -0.01))
        assert servers_for(**kw) == _bisected_servers(**kw), kw


def test_servers_for_takes_a_few_evaluations(monkeypatch):
    calls = []
    original = queueing.wait_exceeds
    monkeypatch.setattr(queueing, "wait_exceeds", lambda *a: calls.append(1) or original(*a))
    for rate in (0.5, 5.0, 80.0, 900.0, 3000.0):
        for service_s in (0.7, 30.0):
            calls.clear()
            queueing.servers_for(rate_per_s=rate, service_s=service_s, wait_s=2.0, miss_ratio=0.001)
            assert 0 < len(calls) <= 4, (rate, service_s, len(calls))
