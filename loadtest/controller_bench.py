"""Figures of the live controller's runtime (a benchmark that prints, not a timed test).

    python -m loadtest.controller_bench [--ticks 300] [--rps 200] [--seconds 10] [--memory-ticks 240,5760]
    python -m loadtest.controller_bench --targets 1,50,500 [--fleet-ticks 10] [--pods] [--json]

1. Per-tick overhead of the loop against a local Prometheus (Debian's, scraping the fake vLLM server):
   p50 / p99 of a full tick (7 concurrent PromQL queries, decide, publish, metrics, log), back to back.
2. KEDA GetMetrics latency under `rps` requests per second (open loop, each call on its own schedule):
   p50 / p99 over `seconds`.
3. Resident memory of a controller after one hour (240 ticks) and after one day (5,760 ticks) of
   simulated ticks (fake sources, a manual clock advancing 15 s per tick), with the forecaster's refits in a
   child process as `autoscaler run` runs them (its peak resident memory printed too; --fit-in-process: in
   this process, as before); then a second controller (another model) run as long beside it, whose growth of
   the process's resident memory is the per-model cost of serving several models from one process. This
   process also holds the benchmark's own modules, so a fresh process (`controllerday.py`) then imports only
   what `autoscaler run` imports (`autoscaler.runtime`) and runs as many simulated ticks: the controller alone.
4. With --targets: the fleet controller at each N models (`fleetscale.py`: real apiserver with N Deployments
   and ModelAutoscalers, real Prometheus with N models' series), each N in its own process (so its resident
   memory is its own); a table, or with --json one JSON object per N.
The test suite runs them briefly (tests/test_controller_bench.py), so the script cannot silently break.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import grpc

from autoscaler.board import DecisionBoard
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.external_scaler.server import start
from autoscaler.fitchild import ProcessFitter
from autoscaler.loop import Controller
from autoscaler.metrics import ControllerMetrics
from autoscaler.signals.prometheus import PrometheusSource
from loadtest.controllerday import TICK_S, StaticCluster, memory, quiet_logs, rss_mb, settings
from loadtest.fleetscale import FleetFigures, pct, table
from loadtest.realservers import fake_model_server, free_port, post_json, prometheus, wait_for_series


async def loop_overhead(ticks: int) -> list[float]:
    import aiohttp

    import threading

    with fake_model_server() as model, prometheus([model.removeprefix("http://")]) as prom:
        running = threading.Event()
        running.set()

        def feed() -> None:  # steady traffic, so every rate() and histogram has data
            while running.is_set():
                post_json(f"{model}/admin/state", {"waiting": 5, "running": 12, "kv_usage": 0.5, "add_success": 50,
                                                   "add_generated": 5000, "observe_inference_s": [1.0] * 50,
                                                   "observe_e2e_s": [1.5] * 50})
                time.sleep(0.5)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        s = settings(prom)
        wait_for_series(prom, s.queries["service_time_s"], lambda v: v > 0)
        async with aiohttp.ClientSession() as session:
            source = PrometheusSource(session, prom, s.queries, timeout_s=3.0)
            controller = Controller(settings=s, sources=[source], cluster=StaticCluster(), board=DecisionBoard(),
                                    metrics=ControllerMetrics())
            for _ in range(5):
                await controller.tick()  # warm the connection pool
            durations = []
            for _ in range(ticks):
                t0 = time.perf_counter()
                await controller.tick()
                durations.append(time.perf_counter() - t0)
        running.clear()
        feeder.join(5)
    return durations


async def keda_latency(rps: int, seconds: float) -> tuple[list[float], int]:
    from autoscaler.board import Published
    from policies import Decision

    board = DecisionBoard()
    await board.publish(Published(Decision(replicas=7), 7, None, 0.0))
    port = free_port()
    server = await start(board, host="127.0.0.1", port=port, namespace="llm", scaled_object="model",
                         metric_name="desired-replicas")
    ref = pb.ScaledObjectRef(name="model", namespace="llm")
    request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="desired-replicas")
    latencies: list[float] = []
    failures = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        await stub.GetMetricSpec(ref)

        async def one() -> None:
            nonlocal failures
            t0 = time.perf_counter()
            try:
                await stub.GetMetrics(request, timeout=5)
                latencies.append(time.perf_counter() - t0)
            except grpc.RpcError:
                failures += 1

        tasks = []
        start_t = time.perf_counter()
        for i in range(int(rps * seconds)):
            delay = start_t + i / rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    await server.stop(None)
    return latencies, failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.controller_bench", description=__doc__.splitlines()[0])
    p.add_argument("--ticks", type=int, default=300,
                   help="loop ticks run back to back against the local Prometheus (default: %(default)s)")
    p.add_argument("--rps", type=int, default=200,
                   help="KEDA GetMetrics calls per second, open loop (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="how long the KEDA calls run, in seconds (default: %(default)s)")
    p.add_argument("--memory-ticks", default="240,5760",
                   help="simulated ticks (15 s) after which to print resident memory, comma-separated "
                        "(default: %(default)s: an hour and a day)")
    p.add_argument("--fit-in-process", action="store_true",
                   help="memory part: run the refits in the benchmark's own process, as replays do (default: in a "
                        "child process, as `autoscaler run` does)")
    p.add_argument("--targets", default=None,
                   help="fleet mode: model counts to measure the fleet controller at, comma-separated (e.g. 1,50,500; "
                        "default: the single-model modes)")
    p.add_argument("--fleet-ticks", type=int, default=10, help="measured fleet ticks per N (default: %(default)s)")
    p.add_argument("--pods", action="store_true",
                   help="fleet mode: the Deployments get their pods (scheduler, kwok nodes), which the cache holds "
                        "(default: no pods)")
    p.add_argument("--json", action="store_true",
                   help="fleet mode: one JSON object per N instead of the table (default: the table)")
    args = p.parse_args(argv)
    quiet_logs()
    if args.targets is not None:
        return fleet_main([int(n) for n in args.targets.split(",")], ticks=args.fleet_ticks, as_json=args.json,
                          pods=args.pods)
    start_rss = rss_mb()
    durations = asyncio.run(loop_overhead(args.ticks))
    print(f"loop tick against local Prometheus ({args.ticks} ticks): p50 {pct(durations, 0.5) * 1e3:.1f} ms, "
          f"p99 {pct(durations, 0.99) * 1e3:.1f} ms")
    latencies, failures = asyncio.run(keda_latency(args.rps, args.seconds))
    print(f"KEDA GetMetrics at {args.rps} req/s for {args.seconds:.0f} s ({len(latencies)} ok, {failures} failed): "
          f"p50 {pct(latencies, 0.5) * 1e3:.2f} ms, p99 {pct(latencies, 0.99) * 1e3:.2f} ms")
    fit = None if args.fit_in_process else ProcessFitter()
    counts = sorted(int(x) for x in args.memory_ticks.split(","))
    reports, per_model = asyncio.run(memory(counts, fit))
    print(f"resident memory ({'refits in this process' if fit is None else 'refits in a child process'}): "
          f"{start_rss:.0f} MB at start; " + "; ".join(
              f"{rss:.0f} MB after {ticks} simulated ticks ({ticks * TICK_S / 3600:.3g} h)" for ticks, rss in reports)
          + f"; a second model's controller over as many ticks adds {per_model:.1f} MB")
    if fit is not None:
        fit.close()
        print(f"the refits' child process: {fit.fits} fits, peak {fit.peak_rss_mb or 0:.0f} MB; statsmodels in "
              f"the controller's process: {'yes' if 'statsmodels' in sys.modules else 'no'}")
    print(fresh_day(counts[-1], in_process=fit is None))
    return 0


def fresh_day(ticks: int, *, in_process: bool) -> str:
    """The controller alone: a fresh process (`controllerday.py`) with `autoscaler run`'s imports runs `ticks`."""

    out = subprocess.run([sys.executable, "-m", "loadtest.controllerday", "--ticks", str(ticks)]
                         + (["--fit-in-process"] if in_process else []),
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    day = json.loads(out.strip().splitlines()[-1])
    where = ("refits in that process" if in_process else
             f"refits in a child process ({day['child_fits']} fits, peak {day['child_peak_mb']:.0f} MB)")
    return (f"a fresh process with only `autoscaler run`'s imports: {day['imports_mb']:.0f} MB after them, "
            f"{day['after_ticks_mb']:.0f} MB after {ticks} simulated ticks ({ticks * TICK_S / 3600:.3g} h), {where}; "
            f"the refit's stack in that process: {', '.join(day['fit_stack_loaded']) or 'none'}")


def fleet_main(counts: list[int], *, ticks: int, as_json: bool, pods: bool = False) -> int:
    """Each N in a child process (`python -m loadtest.fleetscale`), so its memory is measured alone."""

    rows = []
    for n in counts:
        out = subprocess.run([sys.executable, "-m", "loadtest.fleetscale", str(n), str(ticks)]
                             + (["pods"] if pods else []), check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        rows.append(FleetFigures(**json.loads(out.strip().splitlines()[-1])))
        if as_json:
            print(out.strip().splitlines()[-1], flush=True)
    if not as_json:
        print(f"fleet controller, {ticks} ticks per N after warm-up ({rows[0].controller}; "
              f"{'with' if pods else 'without'} pods):")
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
