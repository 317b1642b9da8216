"""Slots kept for the top class behind per-replica gateway queues (trunk reservation).

Behind a gateway that commits each request to one server when it arrives (nginx's `least_conn`: the
`gateway_queues: per-replica` setting), a top-class request that finds every slot busy waits in one server's
queue for that server's next completion, however many other slots complete meanwhile: with k slots a server
and requests of S seconds, it misses a wait objective w with probability exp(-k w / S) even when nothing of
its own class is ahead of it (priority scheduling in the server). For the fleet drill's chat (8 slots, ~10-s
requests, a 2-s objective) that is e^-1.6 = 20 %, so the top class can keep 99.9 % only if it finds all slots
busy less than 0.5 % of the time, which sizing for one pooled queue does not give at the end of a ramp
(`python -m loadtest.queuebalance`).

The admission endpoint can keep slots free for it: a guarded class is rejected while the requests in the
servers (served or queued) number at least the Ready slots c less a reserve r. Below c - r every class is
admitted; above it only the top class, so the top class finds every slot busy only when its own requests
filled the r slots. As a birth-death chain in the requests inside n, with a = lambda S (all classes) and
a_top = lambda_top S:
- n <= T = c - r: the truncated Poisson of an Erlang loss system with T servers, so P(n = T | n <= T) is
  Erlang B(T, a);
- n > T: births a_top / min(n, c) times the weight before (geometric beyond c, ratio a_top / c);
- P(n >= T) (a lower class rejected) and P(n >= c) (the top class waits) follow from the two sums.
The top class misses with P(n >= c) x exp(-k w / S). `reserve_slots` returns the fewest r (0 if none is
needed: the queue without a reserve, Erlang C(c, a), already keeps the top class within `miss`) that keep
it within `miss`, at most `max_reserve`. E.g. 4 Ready replicas of 8 slots, 1-s requests (factor 10), a 0.2-s
objective, 22 req/s of which 4.4 critical: Erlang C(32, 22) x e^-1.6 = 0.62 % late without a reserve; one
slot kept gives 0.23 % x e^-1.6 = 0.05 % and rejects 1.7 % of the lower classes while the load lasts (the
event simulation, `python -m loadtest.queuebalance --rates 22 --reserve 1`: 0.08 % and 1.8 %).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math

from policies.queueing import erlang_b, erlang_c


def top_waits(*, slots: int, reserve: int, offered: float, top_offered: float) -> tuple[float, float]:
    """(P(n >= c - r): a lower-class arrival is rejected, P(n >= c): a top-class arrival finds every slot busy)
    in the chain above, for `slots` c, `reserve` r (1 <= r < c), `offered` a and `top_offered` a_top."""
    threshold = slots - reserve
    if offered <= 0.0:
        return 0.0, 0.0
    if top_offered >= slots:
        return 1.0, 1.0  # the top class alone fills every slot: no reserve keeps one free
    b = erlang_b(threshold, offered)
    weight, above = 1.0, 0.0  # relative to the weight at T
    for n in range(threshold + 1, slots):
        weight *= top_offered / n
        above += weight
    weight *= top_offered / slots  # the weight at c
    busy = weight / (1.0 - top_offered / slots)  # c and the geometric tail beyond it
    above += busy
    total = 1.0 + b * above  # (all weights) / (the weights up to T)
    return min(1.0, b * (1.0 + above) / total), min(1.0, b * busy / total)


def reserve_slots(*, slots: int, server_slots: int, rate_per_s: float, top_rate_per_s: float, service_s: float,
                  wait_s: float, miss: float, max_reserve: int) -> int:
    """The fewest slots to keep for the top class so that it waits past `wait_s` with probability at most
    `miss` (see the module docstring); 0 when it does without; `max_reserve` when no reserve up to it does."""
    if slots <= 1 or service_s <= 0 or rate_per_s <= 0 or top_rate_per_s <= 0:
        return 0
    late_given_busy = math.exp(-server_slots * wait_s / service_s)
    offered, top_offered = rate_per_s * service_s, min(rate_per_s, top_rate_per_s) * service_s
    if erlang_c(slots, offered) * late_given_busy <= miss:
        return 0
    most = min(max_reserve, slots - 1)
    for reserve in range(1, most + 1):
        _, busy = top_waits(slots=slots, reserve=reserve, offered=offered, top_offered=top_offered)
        if busy * late_given_busy <= miss:
            return reserve
    return max(0, most)
