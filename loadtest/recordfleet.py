"""Make a recording the way a user makes one: a fleet of fake vLLM servers under a trace, scraped by a real
Prometheus, exported with `autoscaler record`. The bundled `loadtest/recordings/fleet-3h` was made with it.

    python -m loadtest.recordfleet --out loadtest/recordings/fleet-3h [--scenario fleet-3h] [--factor 10]
                                   [--replicas 6] [--concurrency 16]

What runs, all on 127.0.0.1: `--replicas` fake vLLM servers (`loadtest.fakeserver`, `--concurrency` slots
each) behind nginx (`least_conn`); a static kube-state-metrics stand-in saying the Deployment has
`--replicas` replicas, all ready (the fleet is fixed: nothing scales it, which is what the recording is
for: what would the controller have done?); Debian's Prometheus scraping all of them; and the open-loop
load generator (`loadtest.loadgen`) sending the scenario's requests (`loadtest.scenarios`) with their
priority header. Then `autoscaler record` exports the run from Prometheus with the vLLM preset.

Time is compressed by `--factor` like the closed loop's (`loadtest/e2e/config.py`): the servers' service
times, the trace's clock, the scrape interval (15 s / factor), the rate window (60 s / factor) and the
record step (15 s / factor) are all divided by it. The export is written twice: `compressed.json`, as
recorded, and `recording.json`, the same samples at factor 1: times stretched from the run's start by the
factor, `*_per_s` signals divided by it and `*_s` signals multiplied by it, the rest (queue, in flight,
replicas, headroom) unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from autoscaler.cli import main as autoscaler_main
from autoscaler.sim.workload import ServerModel, WorkloadConfig, build
from loadtest import scenarios
from loadtest.gateway import nginx_binary
from loadtest.loadgen import Request, replay
from loadtest.realservers import fake_model_server, free_port, prometheus, stop, wait_tcp

NAMESPACE, DEPLOYMENT = "llm", "model"
TICK_S, RATE_WINDOW_S = 15.0, 60.0


def requests_of(scenario: str, *, concurrency: int) -> list[Request]:
    """The scenario's requests with a priority class each, as the closed loop sends them."""
    trace = scenarios.synthetic(scenario)
    workload = build(trace, WorkloadConfig(scale=1.0, server=ServerModel(concurrency=concurrency)))
    return [Request(i, float(t), workload.classes[int(p)], int(a), int(b)) for i, (t, p, a, b) in
            enumerate(zip(workload.arrival_s, workload.priority, trace.input_tokens, trace.output_tokens))]


@contextlib.contextmanager
def replica_exporter(replicas: int):
    """kube-state-metrics' two Deployment gauges for a fleet of a fixed size (the target label adds the namespace)."""
    body = (f'kube_deployment_spec_replicas{{deployment="{DEPLOYMENT}"}} {replicas}\n'
            f'kube_deployment_status_replicas_ready{{deployment="{DEPLOYMENT}"}} {replicas}\n').encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def balancer(servers: list[str]):
    """nginx balancing over `servers` (host:port), least connections first. Yields its URL."""
    import subprocess

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="balancer-") as tmp:
        upstream = "".join(f"server {s};" for s in servers)
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(
            f"worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/error.log;\n"
            "events { worker_connections 16384; }\n"
            f"http {{ access_log off; client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;\n"
            f"  upstream model {{ least_conn; {upstream} }}\n"
            f"  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://model; "
            "proxy_read_timeout 3600s; } } }\n")
        proc = subprocess.Popen([nginx_binary(), "-c", str(conf), "-p", tmp],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_tcp("127.0.0.1", port, proc=proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(proc)


def controller_config(prom: str, factor: float) -> str:
    """The controller config `record` reads: the vLLM preset, compressed; p99 of the queue wait (the SLO's)."""
    window = f"{round(RATE_WINDOW_S / factor * 1000)}ms"
    p99 = ("histogram_quantile(0.99, sum by (le) (rate(vllm:request_queue_time_seconds_bucket"
           f'{{namespace="{NAMESPACE}"}}[{window}])))')
    return json.dumps({
        "target": {"namespace": NAMESPACE, "name": DEPLOYMENT},
        "prometheus": {"url": prom, "selector": f'namespace="{NAMESPACE}"', "rate_window_s": RATE_WINDOW_S / factor,
                       "queries": {"p99_latency_s": p99}},
    })


def at_factor_one(document: dict, *, start_s: float, factor: float) -> dict:
    """The recorded samples at real time: times stretched from `start_s`, rates divided, durations multiplied."""
    out = {}
    for name, response in document.items():
        scale = 1.0 / factor if name.endswith("_per_s") else factor if name.endswith("_s") else 1.0
        result = [{"metric": series.get("metric", {}),
                   "values": [[round(start_s + (float(t) - start_s) * factor, 3), _scaled(v, scale)]
                              for t, v in series.get("values", [])]}
                  for series in response["data"]["result"]]
        out[name] = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return out


def _scaled(value: str, scale: float) -> str:
    number = float(value)
    return value if scale == 1.0 or number != number else f"{number * scale:.6g}"  # NaN stays "NaN"


def make(*, out: Path, scenario: str, factor: float, replicas: int, concurrency: int) -> None:
    requests = requests_of(scenario, concurrency=concurrency)
    span_s = max(r.t_s for r in requests)
    print(f"{scenario}: {len(requests)} requests over {span_s / 3600:.2f} h, at factor {factor:g}: "
          f"{span_s / factor / 60:.1f} min live; {replicas} replicas of {concurrency} slots", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        models = [stack.enter_context(fake_model_server(concurrency=concurrency, time_scale=1.0 / factor))
                  for _ in range(replicas)]
        hosts = [m.removeprefix("http://") for m in models]
        exporter = stack.enter_context(replica_exporter(replicas))
        prom = stack.enter_context(prometheus(hosts + [exporter], scrape_interval_s=TICK_S / factor))
        url = stack.enter_context(balancer(hosts))
        time.sleep(3 * TICK_S / factor)  # a few scrapes before the first request
        start = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            records = Path(tmp) / "records.jsonl"
            asyncio.run(replay(requests, url, factor=factor, out=records, start_at=start))
            answered = sum(1 for line in records.read_text().splitlines() if json.loads(line)["status"] == 200)
        time.sleep(2 * RATE_WINDOW_S / factor)
        end = time.time()
        print(f"load done: {answered} of {len(requests)} answered 200; recording {end - start:.0f} s", flush=True)
        config = out / "controller-config.json"
        config.write_text(controller_config(prom, factor))
        compressed = out / "compressed.json"
        status = autoscaler_main(["record", "--config", str(config), "--start", f"{start:.3f}",
                                  "--end", f"{end:.3f}", "--step-s", f"{TICK_S / factor:g}", "--out", str(compressed)])
        config.unlink()
        if status != 0:
            raise SystemExit(status)
    document = json.loads(compressed.read_text())
    (out / "recording.json").write_text(json.dumps(at_factor_one(document, start_s=start, factor=factor)))
    print(f"wrote {compressed} and {out / 'recording.json'} (factor 1)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.recordfleet", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for recording.json and compressed.json")
    p.add_argument("--scenario", default="fleet-3h", help="demand profile (loadtest/scenarios.py)")
    p.add_argument("--factor", type=float, default=10.0, help="time compression (1 = real time)")
    p.add_argument("--replicas", type=int, default=6, help="fake vLLM servers (fixed)")
    p.add_argument("--concurrency", type=int, default=16, help="slots per server (vLLM --max-num-seqs)")
    args = p.parse_args(argv)
    make(out=args.out.resolve(), scenario=args.scenario, factor=args.factor, replicas=args.replicas,
         concurrency=args.concurrency)


if __name__ == "__main__":
    main()
