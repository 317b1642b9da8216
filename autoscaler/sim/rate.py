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
  admissions is B in the fluid), so a backlog above the depth drains while the class is rejected;
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

import numpy as np

from autoscaler.sim.cluster import Cluster
from autoscaler.sim.guard import Guard
from autoscaler.sim.hold import Holds
from autoscaler.sim.workload import RateWorkload
from policies.queueing import erlang_c
from policies.types import Sample, Signals

RATE_WINDOW_S = 60.0
SHED_NOTICED = 0.5  # requests: a tick counts as shedding a class when at least half a request of it was shed
_POINTS = (0.1, 0.3, 0.5, 0.7, 0.9)


def tick_arrivals(workload: RateWorkload, tick_s: float, seed: int = 5) -> np.ndarray:
    """The arrival count of every tick, drawn once for all policies.

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


def _guarded_tail(*, c_eff: float, rho: float, rates: np.ndarray, depth: np.ndarray):
    """P(queue >= q) seen by an arrival in M/M/c whose arrival rate drops at each guard depth (a
    birth-death chain: the queue's ratio is rho below the first depth, then the share of the load still
    admitted). `c_eff` is the unguarded chain's probability of waiting, which fixes the weight of the
    no-queue states; the guarded chain puts less mass on long queues, so its own probability of waiting
    is smaller. Returns q -> P(Q >= q)."""
    total = float(rates.sum())
    order = sorted(float(d) for d in set(depth[np.isfinite(depth)].tolist()))
    bounds = [0.0] + order
    ratios = [rho * float(rates[depth > d].sum()) / total if total > 0 else 0.0 for d in bounds]
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


def _beyond(start: list[float], ratios: list[float], bounds: list[float], i: int) -> float:
    """The chain's weight of every queue length from bounds[i] on."""
    total = 0.0
    for j in range(i, len(bounds)):
        hi = bounds[j + 1] if j + 1 < len(bounds) else math.inf
        r = ratios[j]
        segment = (1.0 - r ** (hi - bounds[j])) / (1.0 - r) if math.isfinite(hi) else 1.0 / (1.0 - r)
        total += math.exp(start[j]) * segment
    return total


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
        self.recent: deque[tuple[float, np.ndarray, float]] = deque()  # (time, arrivals by class, tokens)
        self.last = (0.0, 0.0, 0.0)  # queue, in-flight, p99
        self.total = np.zeros(len(self.classes))
        self.met = np.zeros(len(self.classes))
        self.shed = np.zeros(len(self.classes))
        self.shed_ticks = np.zeros(len(self.classes), dtype=int)  # ticks in which a class had requests shed
        self._mixture: list[tuple[float, float, float, float]] = []  # (admitted, fluid wait, C, theta)
        self.holds = Holds(max_hold_s) if max_hold_s is not None else None
        self._pending: list[tuple[float, float]] = []  # (requests, held since) while no replica is ready

    def _window(self, t: float) -> int:
        return min(len(self.w.rate_per_s) - 1, max(0, int(t // self.w.window_s)))

    def signals(self, now: float, cluster: Cluster) -> Signals:
        if now <= 0:
            return Signals(cluster=cluster.state())  # nothing scraped yet
        while self.recent and now - self.recent[0][0] > RATE_WINDOW_S:
            self.recent.popleft()
        span = min(RATE_WINDOW_S, max(len(self.recent) * self.tick_s, self.tick_s))
        by_class = self.recent[-1][1] / self.tick_s if self.recent else np.zeros(len(self.classes))
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
            arrival_rate_per_s=Sample(float(by_class.sum()), now),
            service_time_s=Sample(float(self.w.service_s[self._window(now - self.tick_s)]), now),
            arrival_rate_by_priority={c: float(by_class[i]) for i, c in enumerate(self.classes)},
            held_requests=Sample(sum(r for r, _ in self._pending), now) if self.holds is not None else None,
        )

    def serve(
        self, start: float, end: float, cluster: Cluster, shed: dict[str, float], guard: Guard | None = None
    ) -> None:
        dt = end - start
        win = self._window(start)
        service = float(self.w.service_s[win])
        arrivals = float(self.arrivals[min(len(self.arrivals) - 1, int(round(start / self.tick_s)))])
        by_class = arrivals * self.w.shares(win)
        levels = np.array([shed.get(c, 0.0) for c in self.classes])
        shed_now = by_class * levels
        offered_by_class = by_class - shed_now
        self.recent.append((end, by_class, arrivals * float(self.w.output_tokens[win])))

        slots = cluster.ready(start + dt / 2) * self.k
        mu = slots / service  # requests/s the ready slots complete
        depth = np.array((guard or Guard()).depths(self.classes))
        admitted_by_class, rejected, waits, b1 = self._fluid(offered_by_class, mu, dt, depth)
        shed_now += rejected
        admitted = float(admitted_by_class.sum())
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
        no_backlog = 1.0 - c_wait * math.exp(-theta * self.slo_s) if theta > 0 else 1.0
        guarded = np.isfinite(depth) & (depth < self.slo_s * mu)
        if theta > 0 and guarded.any():
            rho = offered / slots
            tail = _guarded_tail(c_eff=c_wait, rho=rho, rates=offered_by_class / dt,
                                 depth=np.where(guarded, depth, np.inf))
            reject = np.where(guarded, [tail(d) for d in depth], 0.0)
            # the queue ahead drains at random: the unguarded chain's P(Q >= q) = C rho^q matches
            # P(W > SLO) = C exp(-theta SLO) at q = theta SLO / -ln(rho)
            q_slo = theta * self.slo_s / -math.log(rho) if 0.0 < rho < 1.0 else 0.0
            no_backlog = np.where(guarded, 1.0 - reject, 1.0 - tail(q_slo))
        else:
            reject = np.zeros(len(self.classes))
        met = np.zeros(len(self.classes))
        for amount, w in waits:
            if w <= 0.0:
                met += amount * no_backlog
                shed_now += amount * reject
                admitted -= float((amount * reject).sum())
            elif w <= self.slo_s:
                met += amount  # every slot is busy: the fluid backlog is the queue, a request waits its drain

        self.total += by_class
        self.shed += shed_now
        self.shed_ticks += shed_now >= SHED_NOTICED
        self.met += met
        wmid = sum(float(a.sum()) * w for a, w in waits) / admitted if admitted > 0 else 0.0
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
        self, offered: np.ndarray, mu: float, dt: float, depth: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, float]], float]:
        """The fluid backlog over one tick: (admitted by class, rejected by class, [(admitted by class, fluid
        wait)], backlog at the end). The admission endpoint carries each probe reading forward with its
        own admissions, free slots and drain, which in the fluid is the backlog itself: a guarded class is
        admitted while the backlog is below its depth, rejected above it, and at its depth just enough of
        it is admitted to hold the backlog there. Piecewise linear: at most a few segments per tick."""
        b = self.backlog
        rate = offered / dt
        zero = np.zeros_like(offered)
        if not np.isfinite(depth).any() or (b <= 0 and float(rate.sum()) <= mu):
            b1 = max(0.0, b + (float(rate.sum()) - mu) * dt)
            if mu <= 0:
                return offered, zero, [(offered, math.inf)], b1
            return offered, zero, [(offered / len(_POINTS), (b + (b1 - b) * p) / mu) for p in _POINTS], b1
        levels = sorted({float(d) for d in depth if math.isfinite(d)} | {0.0})
        admitted, waits, left = zero.copy(), [], dt
        for _ in range(2 * len(levels) + 4):  # each segment ends at a depth, or the tick ends
            if left <= 1e-9:
                break
            below, at = depth > b + 1e-9, np.abs(depth - b) <= 1e-9
            r_below, r_at = float(rate[below].sum()), float(rate[at].sum())
            if mu > 0 and r_at > 0 and r_below <= mu <= r_below + r_at:  # held at a depth
                share = np.where(below, 1.0, np.where(at, (mu - r_below) / r_at, 0.0))
                step = rate * share * left
                admitted += step
                waits.append((step, b / mu))
                break
            share = np.where(below | (at & (r_below + r_at < mu)), 1.0, 0.0)
            slope = float((rate * share).sum()) - mu
            if slope > 0:
                target = min((d for d in levels if d > b + 1e-9), default=math.inf)
            elif slope < 0:
                target = max((d for d in levels if d < b - 1e-9), default=b)
            else:
                target = b
            span = left if target == b else min(left, (target - b) / slope)
            end = target if span < left else max(0.0, b + slope * span)
            step = rate * share * span
            admitted += step
            for p in _POINTS:
                waits.append((step / len(_POINTS), (b + (end - b) * p) / mu if mu > 0 else math.inf))
            b, left = end, left - span
        return admitted, np.where(np.isfinite(depth), np.maximum(offered - admitted, 0.0), 0.0), waits, b

    def _hold(self, start: float, end: float, cluster: Cluster, admitted: float) -> None:
        """Hold the tick's admitted arrivals if no replica is ready at its middle; release every held request
        at the first Ready of the tick (its start if one is ready then)."""
        assert self.holds is not None
        if admitted > 0 and cluster.ready(start + (end - start) / 2) == 0:
            self._pending.append((admitted, start + (end - start) / 2))
        ready_at = start if cluster.ready(start) else min(cluster.ready_times_between(start, end), default=None)
        if ready_at is None:
            return
        keep = []
        for requests, since in self._pending:
            if since <= ready_at:
                self.holds.add(ready_at - since, requests)
            else:
                keep.append((requests, since))
        self._pending = keep

    def finish(self, end: float) -> None:
        """Requests still held at the end were held at least until then."""
        if self.holds is not None:
            for requests, since in self._pending:
                self.holds.add(end - since, requests)
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
