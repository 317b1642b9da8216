"""Closed-form M/M/c results used to size capacity and to check the simulator.

For c servers, offered load a = lambda * E[S] (in busy servers):
- Erlang B via the regularized incomplete gamma function: B(c, a) = pmf(c; a) / cdf(c; a) of Poisson(a);
- Erlang C: C(c, a) = c B / (c - a (1 - B)), the probability that an arrival waits;
- P(W > t) = C(c, a) * exp(-(c - a) * t / E[S]).
Worked example: a = 8 busy slots, c = 10 slots, E[S] = 1 s -> C ~ 0.41 and P(W > 1 s) ~ 0.41 * e^-2 ~ 0.056.
"""

from __future__ import annotations

import math

from scipy.special import gammaincc


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival has to wait; 1.0 when the system is not stable (a >= c)."""
    if offered <= 0.0:
        return 0.0
    if servers <= offered:
        return 1.0
    # A probability is at most 1: clamping keeps rounding in huge systems from overflowing exp().
    log_pmf = min(0.0, servers * math.log(offered) - offered - math.lgamma(servers + 1))
    cdf = float(gammaincc(servers + 1, offered))
    if cdf <= 0.0:
        return 1.0
    b = math.exp(log_pmf) / cdf
    return min(1.0, servers * b / (servers - offered * (1.0 - b)))


def wait_exceeds(servers: int, offered: float, service_s: float, wait_s: float) -> float:
    """P(queue wait > wait_s) in M/M/c."""
    if servers <= offered:
        return 1.0 if offered > 0 else 0.0
    return erlang_c(servers, offered) * math.exp(-(servers - offered) * wait_s / service_s)


def mean_wait(servers: int, offered: float, service_s: float) -> float:
    """E[W] in M/M/c (infinite when unstable)."""
    if offered <= 0.0:
        return 0.0
    if servers <= offered:
        return math.inf
    return erlang_c(servers, offered) * service_s / (servers - offered)


def servers_for(*, rate_per_s: float, service_s: float, wait_s: float, miss_ratio: float) -> int:
    """Fewest servers with P(W > wait_s) <= miss_ratio at the given arrival rate.

    Starts from square-root staffing and bisects, so it costs a handful of Erlang C evaluations even for
    thousands of slots."""
    offered = rate_per_s * service_s
    if offered <= 0.0:
        return 0
    lo = math.floor(offered)  # unstable: always misses
    hi = max(lo + 1, math.ceil(offered + 4.0 * math.sqrt(offered) + 2.0))
    while wait_exceeds(hi, offered, service_s, wait_s) > miss_ratio:
        hi = hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if wait_exceeds(mid, offered, service_s, wait_s) > miss_ratio:
            lo = mid
        else:
            hi = mid
    return hi


def rate_within_slo(*, servers: int, service_s: float, wait_s: float, miss_ratio: float) -> float:
    """Largest arrival rate that `servers` slots serve with P(W > wait_s) <= miss_ratio (inverse of
    servers_for, by bisection on the rate)."""
    if servers <= 0:
        return 0.0
    lo, hi = 0.0, servers / service_s
    for _ in range(30):
        mid = (lo + hi) / 2
        if wait_exceeds(servers, mid * service_s, service_s, wait_s) > miss_ratio:
            hi = mid
        else:
            lo = mid
    return lo
