"""A workload's demand tick by tick, and the replicas it needs: the one binning of arrivals that the
simulator's truth (`run.needed_replicas`), the benchmark's floor and the preflight analysis share.

Request workloads: arrivals are counted in bins of `bin_s` (the tick unless said otherwise), each tick is
represented by its busiest bin, and a tick's service time is the mean of its requests' (the workload's mean
where it has none). Rate workloads: each client's requests are spread over the ticks by
`rate.tick_arrivals` (seeded, so every caller sees the same draws), at the service time of the window the
tick falls in.

The replicas a rate needs are the policy's own rule, `policies.engine.replicas_for_rate`, evaluated once per
distinct (rate, service time) rounded to 1/1000: traces repeat the same tick many times.
"""

from __future__ import annotations

import math

import numpy as np

from autoscaler.sim.rate import tick_arrivals
from autoscaler.sim.workload import RateWorkload, RequestWorkload
from policies import PolicySpec
from policies.engine import replicas_for_rate


def ticks(workload: RequestWorkload | RateWorkload, tick_s: float) -> int:
    return max(1, math.ceil(workload.span_s / tick_s))


def tick_demand(workload: RequestWorkload | RateWorkload, tick_s: float, *, seed: int = 5,
                bin_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(arrival rate in req/s, mean service time in s) of every tick. `bin_s` divides the tick (request
    workloads): the tick's rate is that of its busiest bin."""
    n = ticks(workload, tick_s)
    if isinstance(workload, RequestWorkload):
        width = tick_s if bin_s is None else bin_s
        per_tick = round(tick_s / width)
        index = np.minimum((workload.arrival_s // width).astype(int), n * per_tick - 1)
        counts = np.bincount(index, minlength=n * per_tick)
        work = np.bincount(index, weights=workload.service_s, minlength=n * per_tick)
        busiest = counts.reshape(n, per_tick).argmax(axis=1) + np.arange(n) * per_tick
        counts, work = counts[busiest], work[busiest]
        services = np.where(counts > 0, work / np.maximum(counts, 1), float(workload.service_s.mean()))
        return counts / width, services
    t = np.arange(n) * tick_s
    win = np.minimum((t // workload.window_s).astype(int), len(workload.rate_per_s) - 1)
    return tick_arrivals(workload, tick_s, seed) / tick_s, workload.service_s[win]


def replicas_for_rates(spec: PolicySpec, rates: np.ndarray, services: np.ndarray) -> np.ndarray:
    """`replicas_for_rate` of every tick."""
    cache: dict[tuple[float, float], int] = {}
    out = np.zeros(len(rates), dtype=int)
    for i, (rate, service) in enumerate(zip(rates, services)):
        key = (round(float(rate), 3), round(float(service), 3))
        if key not in cache:
            cache[key] = replicas_for_rate(spec, key[0], key[1])
        out[i] = cache[key]
    return out
