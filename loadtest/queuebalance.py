"""One pooled queue against a least-connections balancer over per-server queues: the late share by class.

    python -m loadtest.queuebalance [--rates 20,21,22,23] [--servers 4] [--slots 8] [--service-s 1]
                                    [--slo-s 0.2] [--requests 200000] [--seed 1] [--exponential] [--reserve R]

The policy's sizing (Erlang C over replicas x slots, `policies/sizing.py`) and the simulator
(`autoscaler/sim/request.py`) both model one queue feeding the first free slot of any replica. A gateway
with nginx's `least_conn` does not queue: it hands each request, when it arrives, to the server with the
fewest requests in it (serving or queued), and a request queued there waits for one of that server's own
slots while another server may have a free one. This event-driven simulation serves the same requests both
ways (Poisson arrivals, classes drawn 20/50/30 critical/standard/sheddable, service times lognormal with
sigma 0.5 around `--service-s` as the scenarios' output lengths, or exponential), each queue served by class,
highest first, non-preemptive (vLLM's `--scheduling-policy priority`), and prints per arrival rate the share
of each class that waited longer than `--slo-s`. The defaults are the fleet drill's chat at factor 10 (1.5-s
ticks, 8-slot replicas, ~10-s requests, a 2-s SLO): four replicas near twice its base rate.

`--reserve R` adds a third column: least connections with R slots kept for the top class (trunk
reservation at the admission endpoint: a lower class is rejected while the requests in the servers, served
or queued, number at least servers x slots - R), as late share / rejected share per class. It shows what
keeping slots free costs the lower classes, against what one pooled queue gives without rejecting anyone.
"""

from __future__ import annotations

import argparse
import heapq
import sys

import numpy as np

from autoscaler.flags import number

CLASSES = ("critical", "standard", "sheddable")
MIX = (0.2, 0.5, 0.3)
_SIGMA = 0.5


def late_shares(*, rate_per_s: float, servers: int, slots: int, service_s: float, slo_s: float, requests: int,
                seed: int, exponential: bool = False) -> dict[str, float]:
    """Per class, the share of its requests whose queue wait exceeded `slo_s`; `servers` queues of `slots`
    slots each behind least connections (1: one pooled queue)."""
    return outcomes(rate_per_s=rate_per_s, servers=servers, slots=slots, service_s=service_s, slo_s=slo_s,
                    requests=requests, seed=seed, exponential=exponential)[0]


def outcomes(*, rate_per_s: float, servers: int, slots: int, service_s: float, slo_s: float, requests: int,
             seed: int, exponential: bool = False, reserve: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """Per class, the shares of its requests that waited past `slo_s` and that were rejected: `late_shares`,
    with `reserve` slots kept for the top class (a lower class rejected while the requests inside number
    at least servers x slots - reserve; 0: none rejected)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, requests))
    classes = rng.choice(len(CLASSES), requests, p=MIX)
    service = (rng.exponential(service_s, requests) if exponential
               else rng.lognormal(np.log(service_s) - _SIGMA**2 / 2, _SIGMA, requests))
    events = [(float(t), 0, i) for i, t in enumerate(arrivals)]  # (time, 0 arrival | 1 completion, request | server)
    heapq.heapify(events)
    busy, queued, inside = [0] * servers, [[] for _ in range(servers)], [0] * servers
    late, seen, rejected = [0] * len(CLASSES), [0] * len(CLASSES), [0] * len(CLASSES)
    bar = servers * slots - reserve
    while events:
        now, kind, x = heapq.heappop(events)
        if kind == 0:
            if reserve > 0 and classes[x] > 0 and sum(inside) >= bar:
                seen[classes[x]] += 1
                rejected[classes[x]] += 1
                continue
            fewest = min(inside)
            tied = [s for s in range(servers) if inside[s] == fewest]
            server = tied[0] if len(tied) == 1 else tied[int(rng.integers(len(tied)))]  # ties: at random
            inside[server] += 1
            seen[classes[x]] += 1
            if busy[server] < slots:
                busy[server] += 1
                heapq.heappush(events, (now + float(service[x]), 1, server))
            else:
                heapq.heappush(queued[server], (int(classes[x]), float(arrivals[x]), x))
            continue
        inside[x] -= 1
        if not queued[x]:
            busy[x] -= 1
            continue
        cls, arrived, i = heapq.heappop(queued[x])
        late[cls] += now - arrived > slo_s
        heapq.heappush(events, (now + float(service[i]), 1, x))
    def share(counts: list[int]) -> dict[str, float]:
        return {c: counts[k] / seen[k] if seen[k] else 0.0 for k, c in enumerate(CLASSES)}

    return share(late), share(rejected)


def _rates(text: str) -> list[float]:
    try:
        rates = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rates like 20,21,22, got {text!r}") from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be positive, got {text!r}")
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.queuebalance", description=__doc__.split("\n")[0])
    p.add_argument("--rates", type=_rates, default=[20.0, 21.0, 22.0, 23.0], help="arrival rates, req/s")
    p.add_argument("--servers", type=number(int, at_least=2), default=4, help="servers behind the balancer")
    p.add_argument("--slots", type=number(int, at_least=1), default=8, help="slots per server")
    p.add_argument("--service-s", type=number(above=0), default=1.0, help="mean time a request holds a slot")
    p.add_argument("--slo-s", type=number(above=0), default=0.2, help="queue-wait objective")
    p.add_argument("--requests", type=number(int, at_least=1000), default=200_000, help="requests per run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--exponential", action="store_true", help="exponential service times (M/M/c)")
    p.add_argument("--reserve", type=number(int, at_least=0), default=0,
                   help="also least connections with this many slots kept for the top class (trunk reservation): "
                        "late / rejected share per class (default: 0, not shown)")
    args = p.parse_args(argv)
    if args.reserve >= args.servers * args.slots:
        p.error(f"--reserve {args.reserve} leaves no slot of {args.servers * args.slots} to the lower classes")
    common = dict(service_s=args.service_s, slo_s=args.slo_s, requests=args.requests, seed=args.seed,
                  exponential=args.exponential)
    print(f"late share (wait > {args.slo_s:g} s) by class: one queue of {args.servers * args.slots} slots | "
          f"least connections over {args.servers} x {args.slots}"
          + (f" | the same keeping {args.reserve} slots for {CLASSES[0]}: late / rejected" if args.reserve else ""))
    for rate in args.rates:
        pooled = late_shares(rate_per_s=rate, servers=1, slots=args.servers * args.slots, **common)
        split = late_shares(rate_per_s=rate, servers=args.servers, slots=args.slots, **common)
        row = " ".join(f"{c} {pooled[c]:.3%}/{split[c]:.3%}" for c in CLASSES)
        if args.reserve:
            late, rejected = outcomes(rate_per_s=rate, servers=args.servers, slots=args.slots, reserve=args.reserve,
                                      **common)
            row += " | " + " ".join(f"{c} {late[c]:.3%}/{rejected[c]:.3%}" for c in CLASSES)
        print(f"{rate:g} req/s: {row}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
