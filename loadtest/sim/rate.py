"""Rate-level simulation for 10-minute rate traces (ServeGen), one step per tick.

Per tick of length dt, with the window's rate lambda, squared inter-arrival CV ca2 and mean service S:
- the tick's arrival count A is drawn once (seeded, so every policy sees the same traffic and the
  clairvoyant knows it) as the sum over clients of a Gamma draw with mean lambda_i dt and variance
  lambda_i dt ca2_i: the count spread of a renewal process with the client's CV (asymptotic method), never
  negative. This is where the window's burstiness lives (a batchy client spikes by its own volume);
  within a tick arrivals are taken as Poisson. The asymptotic variance holds for ticks much longer than
  the clustering; at the extreme, all of a window's M requests in one tick, the index of dispersion is M,
  so ca2_i is capped at M = lambda_i x window (ServeGen has clients with CV^2 in the hundreds of thousands:
  a handful of requests sent at once);
- A is split by the priority mix, minus what is shed;
- c = ready slots; a fluid backlog B grows by (lambda_admitted - c/S) dt when overloaded and drains
  otherwise; a request's fluid wait is B / (c/S);
- on top, the M/M/c queueing wait: P(W > t) = C_eff exp(-(c - a) t / S), where C_eff relaxes towards the
  stationary Erlang C(c, a) with the queue's relaxation time tau ~ S / (c (1 - sqrt(rho))^2) (first order,
  carried across ticks): a queue near rho = 1 with minute-long requests needs far longer than one tick
  to build, so a tick does not jump to the stationary wait; held load reaches it;
- SLO attainment of the tick's arrivals averages P(fluid + queueing wait <= SLO) over the tick.
This costs O(1) per tick, so 14 days at 15-s ticks simulate in seconds.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from loadtest.sim.cluster import SimCluster
from loadtest.workload import CLASSES, RateWorkload
from policies.queueing import erlang_c
from policies.types import Sample, Signals

RATE_WINDOW_S = 60.0
_POINTS = (0.1, 0.3, 0.5, 0.7, 0.9)


def tick_arrivals(workload: RateWorkload, tick_s: float, seed: int = 5) -> np.ndarray:
    """The arrival count of every tick, drawn once for all policies."""
    n = max(1, math.ceil(workload.span_s / tick_s))
    t = np.arange(n) * tick_s
    win = np.minimum((t // workload.window_s).astype(int), len(workload.rate_per_s) - 1)
    rng = np.random.default_rng(seed)
    total = np.zeros(n)
    for rates, cv2s in zip(workload.client_rate_per_s, workload.client_cv2):
        mean = rates[win] * tick_s
        cv2 = np.clip(cv2s[win], 1e-6, np.maximum(rates[win] * workload.window_s, 1.0))
        draws = rng.gamma(np.maximum(mean, 1e-12) / cv2, cv2)
        total += np.where(mean > 0, draws, 0.0)
    return total


class RateSim:
    def __init__(self, workload: RateWorkload, *, concurrency: int, slo_s: float, tick_s: float, seed: int = 5):
        self.w = workload
        self.k = concurrency
        self.slo_s = slo_s
        self.tick_s = tick_s
        self.arrivals = tick_arrivals(workload, tick_s, seed)
        mix = np.array(workload.priority_mix, dtype=float)
        self.mix = mix / mix.sum()
        self.backlog = 0.0
        self.c_eff = 0.0  # P(wait) of the queueing component, relaxing towards Erlang C
        self.recent: deque[tuple[float, np.ndarray, float]] = deque()  # (time, arrivals by class, tokens)
        self.last = (0.0, 0.0, 0.0)  # queue, in-flight, p99
        self.total = np.zeros(len(CLASSES))
        self.met = np.zeros(len(CLASSES))
        self.shed = np.zeros(len(CLASSES))
        self._mixture: list[tuple[float, float, float, float]] = []  # (admitted, fluid wait, C, theta)

    def _window(self, t: float) -> int:
        return min(len(self.w.rate_per_s) - 1, max(0, int(t // self.w.window_s)))

    def signals(self, now: float, cluster: SimCluster) -> Signals:
        if now <= 0:
            return Signals(cluster=cluster.state())  # nothing scraped yet
        while self.recent and now - self.recent[0][0] > RATE_WINDOW_S:
            self.recent.popleft()
        span = min(RATE_WINDOW_S, max(len(self.recent) * self.tick_s, self.tick_s))
        by_class = self.recent[-1][1] / self.tick_s if self.recent else np.zeros(len(CLASSES))
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
            arrival_rate_by_priority={c: float(by_class[i]) for i, c in enumerate(CLASSES)},
        )

    def serve(
        self, start: float, end: float, cluster: SimCluster, shed: dict[str, float], guard: dict[str, int] | None = None
    ) -> None:
        dt = end - start
        win = self._window(start)
        service = float(self.w.service_s[win])
        arrivals = float(self.arrivals[min(len(self.arrivals) - 1, int(round(start / self.tick_s)))])
        by_class = arrivals * self.mix
        levels = np.array([shed.get(c, 0.0) for c in CLASSES])
        shed_now = by_class * levels
        admitted_by_class = by_class - shed_now
        admitted = float(admitted_by_class.sum())
        self.recent.append((end, by_class, arrivals * float(self.w.output_tokens[win])))

        slots = cluster.ready(start + dt / 2) * self.k
        mu = slots / service  # requests/s the ready slots complete
        lam_adm = admitted / dt
        offered = lam_adm * service
        b0 = self.backlog
        b1 = max(0.0, b0 + (lam_adm - mu) * dt)
        # The saturation guard: while the backlog is past a class's depth, that class's arrivals are
        # rejected, lowest depth first, until the backlog stays at that depth.
        for depth, s in sorted((d, CLASSES.index(c)) for c, d in (guard or {}).items()):
            if b1 <= depth:
                break
            extra = min(admitted_by_class[s], b1 - max(float(depth), b0))
            if extra > 0:
                admitted_by_class[s] -= extra
                shed_now[s] += extra
                admitted -= extra
                b1 = max(0.0, b0 + (admitted / dt - mu) * dt)
        lam_adm = admitted / dt
        offered = lam_adm * service
        if mu > 0:
            w0, w1 = b0 / mu, b1 / mu
        else:
            w0 = w1 = math.inf
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
        ok = 0.0
        for p in _POINTS:
            w = w0 + (w1 - w0) * p if math.isfinite(w1) else math.inf
            if w <= self.slo_s:
                ok += 1.0 - c_wait * math.exp(-theta * (self.slo_s - w)) if theta > 0 else 1.0
        ok /= len(_POINTS)
        self.total += by_class
        self.shed += shed_now
        self.met += admitted_by_class * ok
        wmid = (w0 + w1) / 2 if math.isfinite(w1) else 1e6
        self._mixture.append((admitted, wmid, c_wait, theta))

        self.backlog = b1
        if offered < slots and slots > 0:
            lq = c_wait * offered / (slots - offered)
            stochastic_p99 = math.log(c_wait / 0.01) / theta if c_wait > 0.01 and theta > 0 else 0.0
        else:
            lq, stochastic_p99 = 0.0, 0.0
        in_flight = float(slots) if b1 > 0 else min(float(slots), offered)
        p99 = min(w1 + stochastic_p99, 1e6) if math.isfinite(w1) else 1e6
        self.last = (b1 + lq, in_flight, p99)

    def finish(self, end: float) -> None:
        return None

    def outcome(self) -> dict:
        attainment, shed_by_class = {}, {}
        for i, name in enumerate(CLASSES):
            total = self.total[i]
            attainment[name] = float(self.met[i] / total) if total > 0 else 1.0
            shed_by_class[name] = float(self.shed[i] / total) if total > 0 else 0.0
        return {
            "requests": float(self.total.sum()),
            "slo_attainment": attainment,
            "shed_by_class": shed_by_class,
            "shed_fraction": float(self.shed.sum() / self.total.sum()) if self.total.sum() > 0 else 0.0,
            "p99_queue_wait_s": self._p99(),
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
