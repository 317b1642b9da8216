"""Rate-level simulation for 10-minute rate traces (ServeGen), one step per tick.

Per tick of length dt, with the window's rate lambda, squared inter-arrival CV ca2 and mean service S:
- the tick's arrival count A is drawn once (seeded, so every policy sees the same traffic and the
  clairvoyant knows it) as the sum over clients of their share of the window: each client's window count
  (rate x window, as the trace states) is spread over the window's ticks with Dirichlet weights of
  concentration lambda_i dt / ca2_i, so a tick's count has about the renewal variance lambda_i dt ca2_i
  (the count spread of a renewal process with the client's CV) while no client ever sends more than the
  trace says. This is where the window's burstiness lives (a batchy client spikes by its own volume);
  within a tick arrivals are spread evenly. At the extreme, all of a window's M requests in one tick, the
  index of dispersion is M, so ca2_i is capped at M (ServeGen has clients with CV^2 in the hundreds of
  thousands: a handful of requests sent at once);
- A is split by the priority mix, minus what is shed;
- c = ready slots; a fluid backlog B grows by (lambda_admitted - c/S) dt when overloaded and drains
  otherwise; a request's fluid wait is B / (c/S). The saturation guard rejects a guarded class while B
  is above the class's depth (the admission endpoint's probe reading carried forward with its own
  admissions is B in the fluid), so a backlog above the depth drains while the class is rejected; on a
  tick whose top-class rate alone outruns the decision's drain, every guarded class's depth is 0 (the
  endpoint's overrun rule, `policies.admission.top_outruns`, read on the tick's mean rate), and so it is
  while slots are kept for the top class (`Guard.reserve`), which also rejects the guarded classes with
  the M/M/c probability of the reserve's slots being all that is free (`_reserve_share`);
- with no fluid backlog, the M/M/c queueing wait: P(W > t) = C_eff exp(-(c - a) t / S), where C_eff
  relaxes towards the stationary Erlang C(c, a) with the queue's relaxation time
  tau ~ S / (c (1 - sqrt(rho))^2) (first order, carried across ticks): a queue near rho = 1 with
  minute-long requests needs far longer than one tick to build, so a tick does not jump to the
  stationary wait; held load reaches it; with guard depths the guarded chain replaces M/M/c;
  (with a fluid backlog every slot is busy and the backlog is the queue: a request waits its drain);
- SLO attainment of the tick's arrivals averages P(wait <= SLO) over the tick;
- the queue the policy reads is the backlog plus the M/M/c mean queue C_eff a / (c - a), never more than
  the previous reading plus the tick's admitted arrivals (requests are conserved; near a = c the
  stationary formula alone has no bound).
Scale to zero (`max_hold_s` set): a tick's admitted arrivals while no replica is ready at its middle are
held (`hold.py`) and released when the first replica is Ready (at the start of a later tick that has one,
or at the first Ready within it): their hold is that time from the middle of their tick. In the fluid they
wait in the backlog (an infinite wait while no slot exists: an SLO miss), and `held_requests` reads them.
This costs O(1) per tick, so 14 days at 15-s ticks simulate in seconds.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable, Sequence

import numpy as np

from autoscaler.sim.cluster import Cluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.hold import Holds, wake_start
from autoscaler.sim.workload import RateWorkload
from policies.admission import OVERRUN_WINDOW_S, top_outruns
from policies.queueing import erlang_c
from policies.types import Sample, Signals

RATE_WINDOW_S = 60.0
SHED_NOTICED = 0.5  # requests: a tick counts as shedding a class when at least half a request of it was shed
_POINTS = (0.1, 0.3, 0.5, 0.7, 0.9)


# The draws are a pure function of the workload, the tick and the seed, and a benchmark replays every policy
# (a frontier every knob of every policy) on one workload: drawn once per process, kept for the last few
# workloads (the workload object itself is the key, so it stays alive while its draws are kept).
_DRAWS_KEPT = 4
_drawn: list[tuple[RateWorkload, float, int, np.ndarray]] = []


def tick_arrivals(workload: RateWorkload, tick_s: float, seed: int = 5) -> np.ndarray:
    """The arrival count of every tick (read-only), drawn once for all policies (`_draw`)."""
    for kept, kept_tick_s, kept_seed, counts in _drawn:
        if kept is workload and kept_tick_s == tick_s and kept_seed == seed:
            return counts
    counts = _draw(workload, tick_s, seed)
    counts.flags.writeable = False
    _drawn[:] = [(workload, tick_s, seed, counts)] + _drawn[: _DRAWS_KEPT - 1]
    return counts


def _draw(workload: RateWorkload, tick_s: float, seed: int) -> np.ndarray:
    """The arrival count of every tick.

    Each client's requests of a window (rate x window, as the trace states) are spread over the window's
    ticks with Dirichlet weights of concentration mean / ca2 per tick: normalised Gamma draws, so a tick's
    count has the renewal variance (about mean x ca2) while the window keeps exactly the trace's count. A
    batchy client piles its window into a few ticks but never sends more than the trace says it did."""
    n = max(1, math.ceil(workload.span_s / tick_s))
    t = np.arange(n) * tick_s
    win = np.minimum((t // workload.window_s).astype(int), len(workload.rate_per_s) - 1)
    ticks_in = np.bincount(win, minlength=len(workload.rate_per_s))
    rng = np.random.default_rng(seed)
    total = np.zeros(n)
    for rates, cv2s in zip(workload.client_rate_per_s, workload.client_cv2):
        mean = rates[win] * tick_s
        if not mean.any():
            continue
        count = rates * ticks_in * tick_s  # the window's requests (ticks cover it whole but at the end)
        cv2 = np.clip(cv2s[win], 1e-6, np.maximum(count[win], 1.0))
        shape = np.maximum(mean, 1e-12) / cv2
        # log Gamma(shape) = log Gamma(shape + 1) + log(U) / shape: no underflow for tiny shapes
        logw = np.log(rng.gamma(shape + 1.0)) + np.log(rng.random(n)) / shape
        peak = np.full(len(rates), -np.inf)
        np.maximum.at(peak, win, logw)
        weight = np.exp(logw - peak[win])
        share = weight / np.bincount(win, weights=weight, minlength=len(rates))[win]
        total += np.where(mean > 0, count[win] * share, 0.0)
    return total


def _guarded_tail(*, c_eff: float, rho: float, rates: Sequence[float], depth: Sequence[float]):
    """P(queue >= q) seen by an arrival in M/M/c whose arrival rate drops at each guard depth (a
    birth-death chain: the queue's ratio is rho below the first depth, then the share of the load still
    admitted). `c_eff` is the unguarded chain's probability of waiting, which fixes the weight of the
    no-queue states; the guarded chain puts less mass on long queues, so its own probability of waiting
    is smaller. Returns q -> P(Q >= q)."""
    total = _total(rates)
    order = sorted({float(d) for d in depth if math.isfinite(d)})
    bounds = [0.0] + order
    ratios = [rho * _total([r for r, dr in zip(rates, depth) if dr > d]) / total if total > 0 else 0.0
              for d in bounds]
    logs = [math.log(max(r, 1e-300)) for r in ratios]
    start = [0.0]  # log of the chain's weight at each bound
    for i in range(1, len(bounds)):
        start.append(start[-1] + (bounds[i] - bounds[i - 1]) * logs[i - 1])
    mass = _beyond(start, ratios, bounds, 0)  # the weights of every queue length
    k = c_eff * (1.0 - rho) / (1.0 - c_eff) if c_eff < 1.0 else math.inf
    scale = k / (1.0 + k * mass) if math.isfinite(k) else 1.0 / mass

    def tail(q: float) -> float:
        i = max(j for j, lo in enumerate(bounds) if lo <= q)
        weight = math.exp(start[i] + (q - bounds[i]) * logs[i])
        r = ratios[i]
        rest = weight / (1.0 - r)  # the geometric tail from q, were the ratio to hold...
        if i + 1 < len(bounds):  # ...up to the next depth, then the chain's weights beyond it
            hi = bounds[i + 1]
            rest = weight * (1.0 - r ** (hi - q)) / (1.0 - r) + _beyond(start, ratios, bounds, i + 1)
        return min(1.0, scale * rest)

    return tail


def _reserve_share(*, c_wait: float, slots: float, offered: float, reserve: int) -> float:
    """P(n >= c - r) in M/M/c, from its probability of waiting P(n >= c) = `c_wait` (the tick's, relaxing
    towards Erlang C): the states c - j (j = 1..r) weigh pi(c) (c)(c - 1)...(c - j + 1) / a^j, pi(c) being
    c_wait (1 - rho). The share of a guarded class rejected to keep `reserve` slots for the top class, in the
    one pooled queue this simulator has: it counts what the reserve costs the lower classes, not what it
    spares the top class behind per-replica queues (`policies/reserve.py`), which a pooled queue does not
    have; nor that the rejected requests lower the load above c - r, so it is an upper estimate of that cost
    (`policies.reserve.top_waits` is the chain with that). E.g. c = 32, a = 22, C = 0.031, r = 1:
    0.031 (1 + (10/32) (32/22)) = 0.045 (the chain: 0.017)."""
    if offered <= 0 or slots <= 0:
        return 0.0
    rho = offered / slots
    weight, total = 1.0, 0.0
    for j in range(min(reserve, int(slots))):
        weight *= (slots - j) / offered
        total += weight
    return min(1.0, c_wait * (1.0 + (1.0 - rho) * total))


def _beyond(start: list[float], ratios: list[float], bounds: list[float], i: int) -> float:
    """The chain's weight of every queue length from bounds[i] on."""
    total = 0.0
    for j in range(i, len(bounds)):
        hi = bounds[j + 1] if j + 1 < len(bounds) else math.inf
        r = ratios[j]
        segment = (1.0 - r ** (hi - bounds[j])) / (1.0 - r) if math.isfinite(hi) else 1.0 / (1.0 - r)
        total += math.exp(start[j]) * segment
    return total


def _total(values: Iterable[float]) -> float:
    """The sum in numpy's order for a few values (from 0.0, in sequence), so the per-class figures in
    plain floats are the bits numpy's arrays gave (the builtin `sum` compensates from Python 3.12 on)."""
    total = 0.0
    for value in values:
        total += value
    return total


def _weighted_wait(waits: list[tuple[list[float], float]]) -> float:
    """`sum(_total(a) * w for a, w in waits)`, each list of amounts totalled once: `_open` and `_fluid` give a
    segment's five points one list. The same products in the same order into the builtin `sum`."""
    weighted, last, last_total = [], None, 0.0
    for amount, wait in waits:
        if amount is not last:
            last, last_total = amount, _total(amount)
        weighted.append(last_total * wait)
    return sum(weighted)


class RateSim:
    def __init__(self, workload: RateWorkload, *, concurrency: int, slo_s: float, tick_s: float, seed: int = 5,
                 max_hold_s: float | None = None):
        self.w = workload
        self.k = concurrency
        self.slo_s = slo_s
        self.tick_s = tick_s
        self.arrivals = tick_arrivals(workload, tick_s, seed)
        self.classes = workload.classes
        self.backlog = 0.0
        self.c_eff = 0.0  # P(wait) of the queueing component, relaxing towards Erlang C
        self.recent: deque[tuple[float, list[float], float]] = deque()  # (time, arrivals by class, tokens)
        self.last = (0.0, 0.0, 0.0)  # queue, in-flight, p99
        # Per class, in plain floats: with three classes numpy's per-call cost was most of a tick's (the
        # same IEEE operations in the same order, so the same bits; `_total` sums in numpy's order).
        n = len(self.classes)
        self._total, self._met, self._shed = [0.0] * n, [0.0] * n, [0.0] * n
        self._shed_ticks = [0] * n  # ticks in which a class had requests shed
        self._shares: dict[int, list[float]] = {}
        self._mixture: list[tuple[float, float, float, float]] = []  # (admitted, fluid wait, C, theta)
        self.holds = Holds(max_hold_s) if max_hold_s is not None else None
        self._pending: list[tuple[float, float, str]] = []  # (requests, held since, wake start) at 0 ready
        # Read every tick, so in plain floats too: `tolist()` gives each element as the double `float()` of it
        # gives, and a list index costs a third of a numpy scalar's.
        self._service_s = workload.service_s.tolist()
        self._output_tokens = workload.output_tokens.tolist()
        self._arrivals = self.arrivals.tolist()
        self._unguarded = [math.inf] * n  # every class's depth when no class is guarded (`Guard.depths`)

    total = property(lambda self: np.array(self._total))
    met = property(lambda self: np.array(self._met))
    shed = property(lambda self: np.array(self._shed))
    shed_ticks = property(lambda self: np.array(self._shed_ticks))

    def _window(self, t: float) -> int:
        return min(len(self.w.rate_per_s) - 1, max(0, int(t // self.w.window_s)))

    def _class_shares(self, window: int) -> list[float]:
        shares = self._shares.get(window)
        if shares is None:
            shares = self._shares[window] = self.w.shares(window).tolist()
        return shares

    def signals(self, now: float, cluster: Cluster) -> Signals:
        if now <= 0:
            return Signals(cluster=cluster.state())  # nothing scraped yet
        while self.recent and now - self.recent[0][0] > RATE_WINDOW_S:
            self.recent.popleft()
        span = min(RATE_WINDOW_S, max(len(self.recent) * self.tick_s, self.tick_s))
        by_class = [a / self.tick_s for a in self.recent[-1][1]] if self.recent else [0.0] * len(self.classes)
        tokens = sum(t for _, _, t in self.recent) / span
        queue, in_flight, p99 = self.last
        state = cluster.state()
        capacity = state.ready_replicas * self.k
        return Signals(
            cluster=state,
            queue_depth=Sample(queue, now),
            in_flight=Sample(in_flight, now),
            p99_latency_s=Sample(p99, now),
            gpu_memory_headroom_ratio=Sample(1.0 - min(1.0, in_flight / capacity) if capacity else 0.0, now),
            token_rate_per_s=Sample(tokens, now),
            arrival_rate_per_s=Sample(_total(by_class), now),
            service_time_s=Sample(self._service_s[self._window(now - self.tick_s)], now),
            arrival_rate_by_priority=dict(zip(self.classes, by_class)),
            held_requests=Sample(sum(r for r, _, _ in self._pending), now) if self.holds is not None else None,
        )

    def _depths(self, guard: Guard, top_rate: float) -> list[float]:
        """The guard's depths per class; while the top class's rate this tick outruns the decision's drain
        (`top_outruns`, the tick's mean standing for the endpoint's last second), 0 for every guarded class:
        the endpoint rejects it while any request waits, which in the fluid is admitting only what the top
        class leaves of the drain. With slots kept for the top class (`Guard.reserve`), 0 as well: a guarded
        class is rejected before every slot is busy, so never while a request waits."""
        depth = guard.depths(self.classes)
        if guard.reserve <= 0 and not top_outruns(top_arrivals=top_rate * OVERRUN_WINDOW_S, window_s=OVERRUN_WINDOW_S,
                                                  drain_per_s=guard.drain_per_s):
            return depth
        return [0.0 if math.isfinite(d) else d for d in depth]

    def serve(
        self, start: float, end: float, cluster: Cluster, shed: dict[str, float], guard: Guard | None = None
    ) -> None:
        dt = end - start
        win = self._window(start)
        service = self._service_s[win]
        arrivals = self._arrivals[min(len(self._arrivals) - 1, int(round(start / self.tick_s)))]
        by_class = [arrivals * share for share in self._class_shares(win)]
        shed_now = [b * shed.get(c, 0.0) for b, c in zip(by_class, self.classes)]
        offered_by_class = [b - x for b, x in zip(by_class, shed_now)]
        self.recent.append((end, by_class, arrivals * self._output_tokens[win]))

        slots = cluster.ready(start + dt / 2) * self.k
        mu = slots / service  # requests/s the ready slots complete
        # No class guarded (every baseline's tick): the depths are all infinite, which is all `_fluid` and
        # the guarded chain below would find out, one class at a time.
        unguarded = guard is None or not guard.depth
        depth = self._unguarded if unguarded else self._depths(guard, offered_by_class[0] / dt)
        if unguarded:
            admitted_by_class, rejected, waits, b1 = self._open(offered_by_class, mu, dt)
        else:
            admitted_by_class, rejected, waits, b1 = self._fluid(offered_by_class, mu, dt, depth)
        shed_now = [x + r for x, r in zip(shed_now, rejected)]
        admitted = _total(admitted_by_class)
        if self.holds is not None:
            self._hold(start, end, cluster, admitted)
        offered = admitted / dt * service
        if slots > 0 and offered < slots:
            stationary = erlang_c(slots, offered)
            rho = offered / slots
            tau = service / (slots * (1.0 - math.sqrt(rho)) ** 2) if rho > 0 else 0.0
            keep = math.exp(-dt / tau) if tau > 0 else 0.0
            self.c_eff = stationary + (self.c_eff - stationary) * keep
            c_wait = self.c_eff
            theta = (slots - offered) / service
        else:
            c_wait, theta = 1.0, 0.0
            self.c_eff = 1.0
        # Without a fluid backlog: the M/M/c tail, or with guard depths below the SLO's queue, the tail of
        # the guarded chain: a guarded class is rejected while the queue is at its depth (shed), admitted
        # ones wait less than that; the highest class misses when the queue is past the SLO's.
        n = len(self.classes)
        no_backlog = [1.0 - c_wait * math.exp(-theta * self.slo_s) if theta > 0 else 1.0] * n
        reject = [0.0] * n
        guarded = [] if unguarded else [math.isfinite(d) and d < self.slo_s * mu for d in depth]
        rejecting = theta > 0 and any(guarded)
        if rejecting:
            rho = offered / slots
            tail = _guarded_tail(c_eff=c_wait, rho=rho, rates=[o / dt for o in offered_by_class],
                                 depth=[d if g else math.inf for d, g in zip(depth, guarded)])
            reject = [tail(d) if g else 0.0 for d, g in zip(depth, guarded)]
            # the queue ahead drains at random: the unguarded chain's P(Q >= q) = C rho^q matches
            # P(W > SLO) = C exp(-theta SLO) at q = theta SLO / -ln(rho)
            q_slo = theta * self.slo_s / -math.log(rho) if 0.0 < rho < 1.0 else 0.0
            top = 1.0 - tail(q_slo)
            if guard is not None and guard.reserve > 0:  # also rejected in the reserve's free slots
                kept = _reserve_share(c_wait=c_wait, slots=slots, offered=offered, reserve=guard.reserve)
                reject = [max(r, kept) if g else r for r, g in zip(reject, guarded)]
            no_backlog = [1.0 - r if g else top for r, g in zip(reject, guarded)]
        met = [0.0] * n
        last: list[float] | None = None
        for amount, w in waits:
            if w <= 0.0:
                if amount is not last:  # a segment's five points share one list: its products, computed once,
                    last = amount  # are the same doubles each time, added in the same order below
                    gain = [a * nb for a, nb in zip(amount, no_backlog)]
                    lost = [a * r for a, r in zip(amount, reject)] if rejecting else []
                    lost_total = _total(lost)
                met = [m + g for m, g in zip(met, gain)]
                if rejecting:  # else every loss is 0.0 (finite amounts x 0.0), which adds nothing to any figure
                    shed_now = [x + y for x, y in zip(shed_now, lost)]
                    admitted -= lost_total
            elif w <= self.slo_s:
                met = [m + a for m, a in zip(met, amount)]  # every slot is busy: the fluid backlog is the
                # queue, a request waits its drain

        for i in range(n):
            self._total[i] += by_class[i]
            self._shed[i] += shed_now[i]
            self._shed_ticks[i] += shed_now[i] >= SHED_NOTICED
            self._met[i] += met[i]
        wmid = _weighted_wait(waits) / admitted if admitted > 0 else 0.0
        self._mixture.append((admitted, min(wmid, 1e6), c_wait, theta))

        queued_before = max(self.last[0], self.backlog)  # the queue reading the tick starts from
        self.backlog = b1
        if offered < slots and slots > 0:
            lq = c_wait * offered / (slots - offered)
            stochastic_p99 = math.log(c_wait / 0.01) / theta if c_wait > 0.01 and theta > 0 else 0.0
        else:
            lq, stochastic_p99 = 0.0, 0.0
        in_flight = float(slots) if b1 > 0 else min(float(slots), offered)
        p99 = min(b1 / mu + stochastic_p99, 1e6) if mu > 0 else 1e6
        # A queue holds only requests that arrived: at most what was queued before the tick plus the tick's
        # admitted arrivals. The stationary C a / (c - a) has no such bound near saturation: with c - a ~ 1e-15
        # after an overloaded tick (C ~ 1) it read 3.9e15 requests on a 14-day trace.
        self.last = (min(b1 + lq, queued_before + max(0.0, admitted)), in_flight, p99)

    def _fluid(
        self, offered: list[float], mu: float, dt: float, depth: list[float]
    ) -> tuple[list[float], list[float], list[tuple[list[float], float]], float]:
        """The fluid backlog over one tick: (admitted by class, rejected by class, [(admitted by class, fluid
        wait)], backlog at the end). The admission endpoint carries each probe reading forward with its
        own admissions, free slots and drain, which in the fluid is the backlog itself: a guarded class is
        admitted while the backlog is below its depth, rejected above it, and at its depth just enough of
        it is admitted to hold the backlog there. Piecewise linear: at most a few segments per tick."""
        b = self.backlog
        rate = [o / dt for o in offered]
        zero = [0.0] * len(offered)
        finite = [math.isfinite(d) for d in depth]
        if not any(finite) or (b <= 0 and _total(rate) <= mu):
            return self._open(offered, mu, dt)
        levels = sorted({float(d) for d in depth if math.isfinite(d)} | {0.0})
        admitted: list[float] = zero
        waits: list[tuple[list[float], float]] = []
        left = dt
        for _ in range(2 * len(levels) + 4):  # each segment ends at a depth, or the tick ends
            if left <= 1e-9:
                break
            below = [d > b + 1e-9 for d in depth]
            at = [abs(d - b) <= 1e-9 for d in depth]
            r_below = _total([r for r, x in zip(rate, below) if x])
            r_at = _total([r for r, x in zip(rate, at) if x])
            if mu > 0 and r_at > 0 and r_below <= mu <= r_below + r_at:  # held at a depth
                share = [1.0 if x else (mu - r_below) / r_at if y else 0.0 for x, y in zip(below, at)]
                step = [r * sh * left for r, sh in zip(rate, share)]
                admitted = [a + st for a, st in zip(admitted, step)]
                waits.append((step, b / mu))
                break
            share = [1.0 if x or (y and r_below + r_at < mu) else 0.0 for x, y in zip(below, at)]
            slope = _total([r * sh for r, sh in zip(rate, share)]) - mu
            if slope > 0:
                target = min((d for d in levels if d > b + 1e-9), default=math.inf)
            elif slope < 0:
                target = max((d for d in levels if d < b - 1e-9), default=b)
            else:
                target = b
            span = left if target == b else min(left, (target - b) / slope)
            end = target if span < left else max(0.0, b + slope * span)
            step = [r * sh * span for r, sh in zip(rate, share)]
            admitted = [a + st for a, st in zip(admitted, step)]
            fifth = [st / len(_POINTS) for st in step]
            for p in _POINTS:
                waits.append((fifth, (b + (end - b) * p) / mu if mu > 0 else math.inf))
            b, left = end, left - span
        rejected = [max(o - a, 0.0) if f else 0.0 for o, a, f in zip(offered, admitted, finite)]
        return admitted, rejected, waits, b

    def _open(
        self, offered: list[float], mu: float, dt: float
    ) -> tuple[list[float], list[float], list[tuple[list[float], float]], float]:
        """`_fluid` when nothing is rejected (no class guarded, or no backlog and the slots keep up): every
        request admitted, the backlog linear over the tick."""
        b = self.backlog
        rate = [o / dt for o in offered]
        zero = [0.0] * len(offered)
        b1 = max(0.0, b + (_total(rate) - mu) * dt)
        if mu <= 0:
            return offered, zero, [(offered, math.inf)], b1
        fifth = [o / len(_POINTS) for o in offered]
        return offered, zero, [(fifth, (b + (b1 - b) * p) / mu) for p in _POINTS], b1

    def _hold(self, start: float, end: float, cluster: Cluster, admitted: float) -> None:
        """Hold the tick's admitted arrivals if no replica is ready at its middle; release every held request
        at the first Ready of the tick (its start if one is ready then)."""
        assert self.holds is not None
        if admitted > 0 and cluster.ready(start + (end - start) / 2) == 0:
            wake = self._pending[0][2] if self._pending else wake_start(cluster.state())
            self._pending.append((admitted, start + (end - start) / 2, wake))
        ready_at = start if cluster.ready(start) else min(cluster.ready_times_between(start, end), default=None)
        if ready_at is None:
            return
        keep = []
        for requests, since, wake in self._pending:
            if since <= ready_at:
                self.holds.add(ready_at - since, requests, start=wake)
            else:
                keep.append((requests, since, wake))
        self._pending = keep

    def finish(self, end: float) -> None:
        """Requests still held at the end were held at least until then."""
        if self.holds is not None:
            for requests, since, wake in self._pending:
                self.holds.add(end - since, requests, start=wake)
            self._pending = []

    def outcome(self) -> dict:
        attainment, shed_by_class = {}, {}
        for i, name in enumerate(self.classes):
            total = self.total[i]
            attainment[name] = float(self.met[i] / total) if total > 0 else 1.0
            shed_by_class[name] = float(self.shed[i] / total) if total > 0 else 0.0
        return {
            "requests": float(self.total.sum()),
            "slo_attainment": attainment,
            "shed_by_class": shed_by_class,
            "shed_fraction": float(self.shed.sum() / self.total.sum()) if self.total.sum() > 0 else 0.0,
            "p99_queue_wait_s": self._p99(),
            "shed_time_s": {name: float(self.shed_ticks[i] * self.tick_s) for i, name in enumerate(self.classes)},
            **({"hold": self.holds.figures()} if self.holds is not None else {}),
        }

    def _p99(self) -> float:
        """The 99th percentile of the mixture of every tick's wait distribution (fluid shift + exponential
        tail with an atom at the shift)."""
        if not self._mixture:
            return 0.0
        data = np.array(self._mixture)
        weight, shift, c_wait, theta = data[:, 0], data[:, 1], data[:, 2], data[:, 3]
        total = weight.sum()
        if total <= 0:
            return 0.0

        def cdf(x: float) -> float:
            tail = np.where(theta > 0, c_wait * np.exp(-theta * np.maximum(x - shift, 0.0)), 0.0)
            inside = np.where(x >= shift, 1.0 - tail, 0.0)
            return float((weight * inside).sum() / total)

        lo, hi = 0.0, 1.0
        while cdf(hi) < 0.99 and hi < 1e6:
            hi *= 2
        if cdf(lo) >= 0.99:
            return 0.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if cdf(mid) >= 0.99 else (mid, hi)
        return hi
