"""A surge on one fake vLLM server, first come first served against priority scheduling: how long critical
requests wait for a slot in each, measured over loopback in real time.

    python -m loadtest.priosurge [--seconds 30] [--surge-ratio 2] [--seed 1] [--slo-s 2]

The same open-loop requests (Poisson arrivals at `--utilization` of the server's slots, `--surge-ratio`
times that in the middle third, classes drawn 20/50/30 critical/standard/sheddable) are replayed by the load
generator twice against a fresh server: once with `--scheduling-policy fcfs` and no `priority` in the body,
once with `priority` and the class's priority in the body (`loadgen.BODY_PRIORITY`). No admission, no
shedding: the gateway's guard is left out so the queue order is the only difference. Prints per policy
and class the p50 / p99 / max queue wait (the server's `x-queue-seconds`) and the share within the SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np

from loadtest.fakeserver import FakeModelServer, RunningServer
from loadtest.loadgen import Request, replay

CLASS_MIX = {"critical": 0.2, "standard": 0.5, "sheddable": 0.3}


def surge_requests(*, seconds: float, rate_per_s: float, surge_ratio: float, output_tokens: int,
                   seed: int) -> list[Request]:
    """Poisson arrivals at `rate_per_s`, times `surge_ratio` in the middle third of `seconds`."""
    rng = np.random.default_rng(seed)
    names, shares = list(CLASS_MIX), np.array(list(CLASS_MIX.values()))
    requests, t = [], 0.0
    while True:
        surging = seconds / 3 <= t < 2 * seconds / 3
        t += rng.exponential(1.0 / (rate_per_s * (surge_ratio if surging else 1.0)))
        if t >= seconds:
            return requests
        cls = names[rng.choice(len(names), p=shares)]
        requests.append(Request(len(requests), t, cls, 1, output_tokens))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_policy(policy: str, requests: list[Request], *, concurrency: int, decode_s_per_token: float,
                     out: Path) -> list[dict]:
    """Replay `requests` against a fresh fake server with this scheduling policy; the records."""
    server = RunningServer(FakeModelServer(concurrency=concurrency, prefill_s_per_token=0.0,
                                           decode_s_per_token=decode_s_per_token, scheduling_policy=policy),
                           "127.0.0.1", free_port())
    await server.start()
    try:
        await replay(requests, server.url, factor=1.0, out=out, timeout_s=600.0,
                     priority_in_body=policy == "priority")
    finally:
        await server.drain()
    return [json.loads(line) for line in out.read_text().splitlines()]


def summary(records: list[dict], *, slo_s: float) -> dict[str, dict]:
    """Per class: requests, p50 / p99 / max queue wait and the share within the SLO (a request without an
    answer counts as a miss)."""
    out = {}
    for cls in CLASS_MIX:
        rows = [r for r in records if r["class"] == cls]
        waits = np.array([r["queue_s"] if r["status"] == 200 and r["queue_s"] is not None else np.inf
                          for r in rows])
        finite = waits[np.isfinite(waits)]
        out[cls] = {"requests": len(rows),
                    "p50_s": float(np.percentile(finite, 50)) if len(finite) else None,
                    "p99_s": float(np.percentile(finite, 99)) if len(finite) else None,
                    "max_s": float(finite.max()) if len(finite) else None,
                    "within_slo": float((waits <= slo_s).mean()) if len(rows) else 1.0}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.priosurge", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0, help="length of the run per policy (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=8, help="the server's slots (default: %(default)s)")
    p.add_argument("--output-tokens", type=int, default=50, help="per request (default: %(default)s)")
    p.add_argument("--decode-s-per-token", type=float, default=0.02, help="(default: %(default)s)")
    p.add_argument("--utilization", type=float, default=0.7,
                   help="of the slots outside the surge (default: %(default)s)")
    p.add_argument("--surge-ratio", type=float, default=2.0,
                   help="arrival rate multiplier in the middle third (default: %(default)s)")
    p.add_argument("--slo-s", type=float, default=2.0, help="queue-wait SLO (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="arrivals and classes (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (default: a table)")
    args = p.parse_args(argv)
    if not 0 < args.seconds <= 600 or args.concurrency < 1 or args.utilization <= 0 or args.surge_ratio <= 0:
        print("error: need 0 < --seconds <= 600, --concurrency >= 1, --utilization > 0, --surge-ratio > 0",
              file=sys.stderr)
        return 2
    service_s = args.output_tokens * args.decode_s_per_token
    rate = args.utilization * args.concurrency / service_s
    requests = surge_requests(seconds=args.seconds, rate_per_s=rate, surge_ratio=args.surge_ratio,
                              output_tokens=args.output_tokens, seed=args.seed)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("fcfs", "priority"):
            records = asyncio.run(run_policy(policy, requests, concurrency=args.concurrency,
                                             decode_s_per_token=args.decode_s_per_token, out=Path(tmp) / policy))
            results[policy] = summary(records, slo_s=args.slo_s)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{len(requests)} requests over {args.seconds:g} s, {args.concurrency} slots of {service_s:g} s, "
          f"{args.utilization:.0%} busy outside a x{args.surge_ratio:g} surge, seed {args.seed}, "
          f"SLO {args.slo_s:g} s")
    print(f"{'policy':<9} {'class':<10} {'requests':>8} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'in SLO':>8}")
    for policy, by_class in results.items():
        for cls, f in by_class.items():
            cells = " ".join(f"{f[k]:>7.2f}" if f[k] is not None else f"{'-':>7}"
                             for k in ("p50_s", "p99_s", "max_s"))
            print(f"{policy:<9} {cls:<10} {f['requests']:>8} {cells} {f['within_slo']:>8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
