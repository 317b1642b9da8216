"""A fake exporter of many models' vLLM series, for Prometheus to scrape (a fleet without a server per model).

    python -m loadtest.fleetexporter --models N --port P [--namespace fleet] [--label app]

Model i is `<prefix>-i` in `namespace`, its series labelled `namespace` and `label` (Prometheus must scrape
with `honor_labels`, so these are kept). Its figures are fixed by i, and its counters grow at a fixed rate
from the exporter's start, so every rate() of the vLLM preset has a value once two scrapes are in:
queue 1+i%5, running 4+i%7, KV cache 0.1+(i%8)/10, 10+i%13 requests/s of 1.0+(i%4)/4 s each, 50 tokens per
request, end-to-end latencies all in the bucket of `latency_s(i)`.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from http.server import ThreadingHTTPServer

from loadtest.realservers import exposition_handler, free_port, stop, wait_http

BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0)


def model_name(prefix: str, i: int) -> str:
    return f"{prefix}-{i}"


def rate_per_s(i: int) -> float:
    return 10.0 + i % 13


def service_s(i: int) -> float:
    return 1.0 + (i % 4) / 4


def latency_s(i: int) -> float:
    return BUCKETS_S[i % len(BUCKETS_S)]


def exposition(models: int, *, elapsed_s: float, namespace: str, label: str, prefix: str) -> str:
    """The text exposition of every model's series `elapsed_s` after the start."""
    lines = []
    for i in range(models):
        sel = f'namespace="{namespace}",{label}="{model_name(prefix, i)}"'
        done = rate_per_s(i) * elapsed_s
        lines += [
            f"vllm:num_requests_waiting{{{sel}}} {1 + i % 5}",
            f"vllm:num_requests_running{{{sel}}} {4 + i % 7}",
            f"vllm:kv_cache_usage_perc{{{sel}}} {0.1 + (i % 8) / 10}",
            f"vllm:request_success_total{{{sel}}} {done}",
            f"vllm:generation_tokens_total{{{sel}}} {50 * done}",
            f"vllm:request_inference_time_seconds_sum{{{sel}}} {service_s(i) * done}",
            f"vllm:request_inference_time_seconds_count{{{sel}}} {done}",
        ]
        lines += [f'vllm:e2e_request_latency_seconds_bucket{{{sel},le="{b}"}} {done if b >= latency_s(i) else 0}'
                  for b in BUCKETS_S]
        lines.append(f'vllm:e2e_request_latency_seconds_bucket{{{sel},le="+Inf"}} {done}')
    return "\n".join(lines) + "\n"


def serve(models: int, *, port: int, namespace: str, label: str, prefix: str) -> None:
    started = time.monotonic()
    handler = exposition_handler(lambda: exposition(models, elapsed_s=time.monotonic() - started,
                                                    namespace=namespace, label=label, prefix=prefix))
    ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()


@contextlib.contextmanager
def fleet_exporter(models: int, *, namespace: str = "fleet", label: str = "app", prefix: str = "model"):
    """The exporter in its own process (its CPU is not the controller's); yields host:port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.fleetexporter", "--models", str(models), "--port",
                             str(port), "--namespace", namespace, "--label", label, "--prefix", prefix],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.fleetexporter", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--namespace", default="fleet")
    p.add_argument("--label", default="app")
    p.add_argument("--prefix", default="model")
    args = p.parse_args(argv)
    serve(args.models, port=args.port, namespace=args.namespace, label=args.label, prefix=args.prefix)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
