"""Closed-form M/M/c results used to size capacity and to check the simulator.

For c servers, offered load a = lambda * E[S] (in busy servers):
- Erlang B via the regularized incomplete gamma function: B(c, a) = pmf(c; a) / cdf(c; a) of Poisson(a);
- Erlang C: C(c, a) = c B / (c - a (1 - B)), the probability that an arrival waits;
- P(W > t) = C(c, a) * exp(-(c - a) * t / E[S]).
Worked example: a = 8 busy slots, c = 10 slots, E[S] = 1 s -> C ~ 0.41 and P(W > 1 s) ~ 0.41 * e^-2 ~ 0.056.

Speed: the policy evaluates Erlang C a few dozen times a tick, so the incomplete gamma function is called
through scipy's `cython_special` (the same kernel as the `scipy.special` ufunc, bit for bit, without the
ufunc's per-call dispatch, about 6x cheaper on one scalar). `servers_for` bisects over integers (a
handful of evaluations); `rate_within_slo` solves for the offered load with safeguarded Newton steps on
log P(W > t), whose derivative in a is closed-form (d log C / da = c / a - 1 + (1 - B) / (c - a (1 - B))),
instead of a 30-step bisection: five or six evaluations to the same answer, within 2^-30 of it.
Both are pure functions of their arguments and are memoised (`_SOLVED_KEPT` results each): a tick sizes
the same rate more than once (the reactive and predictive stages, the warm pool), neighbouring ticks repeat
it, and the shedding stage asks `rate_within_slo` for the same slots and service time tick after tick
(the service time changes once per trace window). On the 14-day servegen-m-small replay 41 % of
`servers_for`'s calls were repeats within the last 64 distinct ones. A memo returns the result the same
call computed, so the figures are the same bits.
"""

from __future__ import annotations

import functools
import math

from scipy.special.cython_special import gammaincc

# rate_within_slo stops when a Newton step moves the offered load by less than this share of the servers
# (the 30-step bisection it replaces resolved 2^-30).
_NEWTON_TOL_RATIO = 2.0**-40
_NEWTON_MAX_STEPS = 100
_GUESS_STEPS = 2
_GUESS_MAX_BETA = 8.0  # Phi / phi overflows past ~37; no target asks for 8 standard deviations
_SQRT2 = math.sqrt(2.0)
_HALF_SQRT_2PI = 0.5 * math.sqrt(2.0 * math.pi)
# Results kept per memoised solver: a few ticks of every stage's distinct rates for one model, a few KB.
_SOLVED_KEPT = 256


def erlang_b(servers: int, offered: float) -> float:
    """Probability that an arrival finds every server busy (M/M/c/c); 1.0 when rounding leaves no cdf.
    Assumes 0 < offered < servers (erlang_c handles the edges)."""
    # A probability is at most 1: clamping keeps rounding in huge systems from overflowing exp().
    log_pmf = min(0.0, servers * math.log(offered) - offered - math.lgamma(servers + 1))
    cdf: float = gammaincc(servers + 1.0, offered)
    if cdf <= 0.0:
        return 1.0
    return math.exp(log_pmf) / cdf


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival has to wait; 1.0 when the system is not stable (a >= c)."""
    if offered <= 0.0:
        return 0.0
    if servers <= offered:
        return 1.0
    b = erlang_b(servers, offered)
    if b == 1.0:
        return 1.0
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


def _staffing_guess(offered: float, wait_ratio: float, miss_ratio: float) -> int:
    """Halfin-Whitt square-root staffing, c ~ a + beta sqrt(a) with P(W > t) ~ exp(-beta sqrt(a) t / E[S]) /
    (1 + beta Phi(beta) / phi(beta)): a few Newton steps on beta, usually within a server or two of the
    exact answer. Only where servers_for starts looking: its answer does not depend on it."""
    root_a = math.sqrt(offered)
    target = -math.log(miss_ratio)
    beta = 1.0
    for _ in range(_GUESS_STEPS):
        mills = (1.0 + math.erf(beta / _SQRT2)) * _HALF_SQRT_2PI * math.exp(0.5 * beta * beta)  # Phi / phi
        r = beta * mills
        miss = math.log1p(r) + beta * root_a * wait_ratio - target
        slope = (mills + beta * (1.0 + r)) / (1.0 + r) + root_a * wait_ratio
        beta = min(_GUESS_MAX_BETA, max(0.0, beta - miss / slope))
    return math.ceil(offered + beta * root_a)


@functools.lru_cache(maxsize=_SOLVED_KEPT, typed=True)
def servers_for(*, rate_per_s: float, service_s: float, wait_s: float, miss_ratio: float) -> int:
    """Fewest servers with P(W > wait_s) <= miss_ratio at the given arrival rate.

    P(W > t) falls as servers are added, so the answer is where it first meets the target: searched from
    the square-root staffing guess, in steps of 1, 2, 4, ... towards it until it is bracketed, then by
    bisection. Two or three Erlang C evaluations for any size (a bisection from scratch took seven or
    eight for hundreds of slots), and the same answer, since the search only reads the same evaluations."""
    offered = rate_per_s * service_s
    if offered <= 0.0:
        return 0
    if miss_ratio <= 0.0 or miss_ratio >= 1.0:
        return _bisected_servers(offered, service_s=service_s, wait_s=wait_s, miss_ratio=miss_ratio)
    lo = math.floor(offered)  # unstable: always misses
    guess = max(lo + 1, _staffing_guess(offered, wait_s / service_s, miss_ratio))
    step = 1
    if wait_exceeds(guess, offered, service_s, wait_s) > miss_ratio:
        lo = guess
        while wait_exceeds(lo + step, offered, service_s, wait_s) > miss_ratio:
            lo += step
            step *= 2
        hi = lo + step
    else:
        hi = guess
        while hi - step > lo and wait_exceeds(hi - step, offered, service_s, wait_s) <= miss_ratio:
            hi -= step
            step *= 2
        lo = max(lo, hi - step)
    return _bisect(lo, hi, offered, service_s=service_s, wait_s=wait_s, miss_ratio=miss_ratio)


def _bisected_servers(offered: float, *, service_s: float, wait_s: float, miss_ratio: float) -> int:
    """servers_for from a bracket that always holds: from the stability limit up to square-root staffing,
    doubled until it meets the target."""
    lo = math.floor(offered)
    hi = max(lo + 1, math.ceil(offered + 4.0 * math.sqrt(offered) + 2.0))
    while wait_exceeds(hi, offered, service_s, wait_s) > miss_ratio:
        hi = hi * 2
    return _bisect(lo, hi, offered, service_s=service_s, wait_s=wait_s, miss_ratio=miss_ratio)


def _bisect(lo: int, hi: int, offered: float, *, service_s: float, wait_s: float, miss_ratio: float) -> int:
    """The fewest servers in (lo, hi] that meet the target, given that lo misses and hi meets it."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if wait_exceeds(mid, offered, service_s, wait_s) > miss_ratio:
            lo = mid
        else:
            hi = mid
    return hi


@functools.lru_cache(maxsize=_SOLVED_KEPT, typed=True)
def rate_within_slo(*, servers: int, service_s: float, wait_s: float, miss_ratio: float) -> float:
    """Largest arrival rate that `servers` slots serve with P(W > wait_s) <= miss_ratio (the inverse of
    servers_for in the rate): the root in a of log P(W > wait_s) = log miss_ratio by Newton steps kept
    inside a bracket [meets, misses] (a bisection step whenever Newton would leave it). P(W > t) grows
    with a from 0 at a = 0 to 1 at a = c, so the root is unique; the offered load returned always meets
    the target."""
    if servers <= 0 or miss_ratio <= 0.0:
        return 0.0
    if miss_ratio >= 1.0:
        return servers / service_s
    c, target = float(servers), math.log(miss_ratio)
    tol = c / service_s * _NEWTON_TOL_RATIO
    # C <= 1, so where the exponential alone is miss_ratio the target is met: a lower end of the bracket.
    lo, hi = max(0.0, (c + target * service_s / wait_s) / service_s), c / service_s  # lo meets, hi misses
    rate = lo if lo > 0.0 else 0.5 * hi
    for _ in range(_NEWTON_MAX_STEPS):
        a = rate * service_s  # offered load, as wait_exceeds sees it
        b = erlang_b(servers, a) if a > 0.0 else 0.0
        busy = c - a * (1.0 - b)
        p = min(1.0, c * b / busy) * math.exp(-(c - a) * wait_s / service_s) if b < 1.0 else 1.0
        if p > miss_ratio:
            hi = rate
        else:
            lo = rate
        if hi - lo <= tol:
            break
        nxt = 0.5 * (lo + hi)  # underflow or saturation: no usable derivative
        if 0.0 < p < 1.0:
            slope = (c / a - 1.0 + (1.0 - b) / busy + wait_s / service_s) * service_s  # d log P / d rate
            nxt = rate - (math.log(p) - target) / slope
            if abs(nxt - rate) <= tol:
                if p <= miss_ratio:
                    break
                nxt -= tol  # converged from the side that misses: land just on the side that meets
        rate = nxt if lo < nxt < hi else 0.5 * (lo + hi)
    return lo
