"""The fleet controller's cost at N models (`python -m loadtest.controller_bench --targets N [--json]`).

The environment: a real kube-apiserver with N Deployments `model-i` of one 1-GPU replica and N
ModelAutoscalers in namespace `fleet` (with `pods`, also the scheduler, controller-manager and kwok with
8-GPU nodes enough for every replica, so the cache holds N pods and N/8 nodes, and idle slots are counted
(`capacity.read_nodes`): each model's count goes over every node and live pod; without, etcd and the
apiserver only: the Deployments have no pods); Debian's Prometheus scraping one exporter of N models' vLLM
series (`fleetexporter.py`, its own process). The controller: `fleet.runtime.build_fleet` (the
FleetController with its object watch) in shadow mode, its signals from `FleetPrometheus` and its cluster
reads from `KubeCache`, in this process. Warm-up ticks (the cache's sync, the models' start, the first
refreshes) are not measured; then `ticks` fleet ticks run back to back (so no forecast refit falls into
them: a refit comes once per forecast bucket, not per tick), each measured:
- tick_p50_ms, tick_p99_ms: wall time of `FleetController.tick()`;
- cpu_s_per_tick: this process's CPU time (every thread: the decisions run in worker threads) per tick;
- promql_queries_per_tick: instant queries Prometheus answered (its own prometheus_http_requests_total);
- apiserver_requests_per_tick: requests other than watches and writes (lists and gets), counted at the
  controller's Kube client (`kubecount.py`); writes per tick are reported apart (shadow mode writes none);
- rss_mb: this process's resident memory after the ticks;
- models_decided_on_every_signal: models whose last tick decided with every preset signal seen (a check that
  the figures are of a working fleet).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from autoscaler.clock import SystemClock
from autoscaler.config import Settings
from autoscaler.crd import GROUP, PLURAL, VERSION
from autoscaler.fleet.promql import FleetPrometheus
from autoscaler.fleet.runtime import build_fleet
from autoscaler.kube.cache import KubeCache
from autoscaler.kube.client import Kube
from autoscaler.presets import PRESETS
from autoscaler.runtime import Parts
from loadtest.controllerday import rss_mb
from loadtest.fleetexporter import fleet_exporter, model_name
from loadtest.kube.controlplane import control_plane, gpu_node, model_deployment
from loadtest.kubecount import RequestCounter
from loadtest.realservers import instant_queries_answered, prometheus, wait_for_series

NAMESPACE = "fleet"
CRD_FILE = Path(__file__).resolve().parent.parent / "deploy" / "crds" / "modelautoscaler.yaml"
SCRAPE_INTERVAL_S = 2.0


@dataclass(frozen=True)
class FleetFigures:
    targets: int
    ticks: int
    tick_p50_ms: float
    tick_p99_ms: float
    cpu_s_per_tick: float
    promql_queries_per_tick: float
    apiserver_requests_per_tick: float
    apiserver_writes_per_tick: float
    rss_mb: float
    signals: int
    models_decided_on_every_signal: int
    pods: bool
    controller: str = "FleetController (shadow mode) with FleetPrometheus and KubeCache"


def model_object(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelAutoscaler", "metadata": {"name": name},
            "spec": {"target": {"name": name}, "selector": {"matchLabels": {"app": name}},
                     "policy": {"min_replicas": 1, "max_replicas": 8}}}


def create_models(cp, targets: int) -> None:
    [crd] = cp.apply_yaml(CRD_FILE.read_text())
    cp.wait_established([crd["metadata"]["name"]])
    status, body = cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    assert status == 201, body
    for i in range(targets):
        name = model_name("model", i)
        status, body = cp.request("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
                                  model_deployment(NAMESPACE, name, 1))
        assert status == 201, body
        status, body = cp.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}",
                                  model_object(name))
        assert status == 201, body


def process_settings(prom: str, *, read_nodes: bool) -> Settings:
    return Settings(fleet={"enabled": True, "namespaces": [NAMESPACE]}, mode="shadow", prometheus={"url": prom},
                    warm_pool={"enabled": False}, leader_election={"enabled": False},
                    admission={"queue_probe_interval_s": None}, capacity={"read_nodes": read_nodes})


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(cp, prom: str, *, targets: int, ticks: int, warmup_ticks: int, pods: bool) -> FleetFigures:
    kube = await Kube.connect(cp.kubeconfig)
    counter = RequestCounter(kube)
    session = aiohttp.ClientSession()
    cache, parts, stop = KubeCache(kube), Parts(), asyncio.Event()
    hub = FleetPrometheus(session)
    try:
        await cache.start()
        fleet = build_fleet(process_settings(prom, read_nodes=pods), kube, session, identity="bench",
                            clock=SystemClock(), parts=parts, hub=hub, cache=cache)
        watch = asyncio.create_task(fleet.objects.run(stop))
        await asyncio.wait_for(fleet.objects.synced.wait(), 60)
        if not await cache.wait_synced(60.0):
            raise TimeoutError("the cluster cache did not sync within 60 s")
        for _ in range(warmup_ticks):
            await fleet.tick()
        if len(fleet.models) != targets:
            raise RuntimeError(f"{len(fleet.models)} models controlled, {targets} expected")
        counter.reset()
        queries_before, cpu_before = instant_queries_answered(prom), time.process_time()
        durations = []
        for _ in range(ticks):
            started = time.perf_counter()
            await fleet.tick()
            durations.append(time.perf_counter() - started)
        cpu_s = time.process_time() - cpu_before
        queries = instant_queries_answered(prom) - queries_before
        figures = FleetFigures(
            targets=targets, ticks=ticks, tick_p50_ms=round(pct(durations, 0.5) * 1e3, 1),
            tick_p99_ms=round(pct(durations, 0.99) * 1e3, 1), cpu_s_per_tick=round(cpu_s / ticks, 3),
            promql_queries_per_tick=round(queries / ticks, 2),
            apiserver_requests_per_tick=round(counter.reads() / ticks, 2),
            apiserver_writes_per_tick=round(counter.writes() / ticks, 2), rss_mb=round(rss_mb(), 1),
            signals=len(PRESETS["vllm"]), pods=pods,
            models_decided_on_every_signal=sum(1 for key, m in fleet.models.items()
                                               if m.decision is not None and not hub.missing(key)
                                               and len(m.controller.state.seen) >= len(PRESETS["vllm"])))
        stop.set()
        await watch
        await asyncio.gather(*(m.stop() for m in fleet.models.values()))
        return figures
    finally:
        await cache.stop()
        await session.close()
        await kube.close()


def wait_ready(cp, targets: int, timeout_s: float) -> None:
    """Until every Deployment of the fleet has its replica Ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, listed = cp.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")
        ready = sum(1 for d in listed.get("items", []) if (d.get("status") or {}).get("readyReplicas") == 1)
        if ready >= targets:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ready} of {targets} Deployments Ready after {timeout_s:.0f} s")
        time.sleep(1.0)


def run(targets: int, *, ticks: int = 10, warmup_ticks: int = 3, pods: bool = False) -> FleetFigures:
    """Build the environment for `targets` models, measure, tear it down."""
    with control_plane(with_pods=pods) as cp, fleet_exporter(targets, namespace=NAMESPACE) as exporter, \
            prometheus([exporter], scrape_interval_s=SCRAPE_INTERVAL_S, honor_labels=True) as prom:
        if pods:
            for i in range(targets // 8 + 1):
                status, body = cp.request("POST", "/api/v1/nodes", gpu_node(f"gpu-{i}"))
                assert status == 201, body
        create_models(cp, targets)
        if pods:
            wait_ready(cp, targets, timeout_s=600.0)
        last = model_name("model", targets - 1)
        wait_for_series(prom, f'sum(rate(vllm:request_success_total{{app="{last}"}}[1m]))', lambda v: v > 0,
                        timeout_s=120.0)
        return asyncio.run(measure(cp, prom, targets=targets, ticks=ticks, warmup_ticks=warmup_ticks, pods=pods))


HEADER = ("targets", "tick_p50_ms", "tick_p99_ms", "cpu_s_per_tick", "promql_queries_per_tick",
          "apiserver_requests_per_tick", "rss_mb")


def table(rows: list[FleetFigures]) -> str:
    lines = [" | ".join(HEADER), " | ".join("---" for _ in HEADER)]
    lines += [" | ".join(str(asdict(row)[k]) for k in HEADER) for row in rows]
    per_model = per_model_line(rows)
    return "\n".join(lines + ([per_model] if per_model else []))


def per_model_line(rows: list[FleetFigures]) -> str | None:
    """What one more model costs the fleet controller's process in resident memory: the slope between the
    fewest and the most models measured (each N in its own process), so what every process holds anyway (the
    interpreter, the libraries, the statsmodels stack) is left out. None with fewer than two distinct N."""
    low, high = min(rows, key=lambda r: r.targets, default=None), max(rows, key=lambda r: r.targets, default=None)
    if low is None or high is None or high.targets == low.targets:
        return None
    slope_mb = (high.rss_mb - low.rss_mb) / (high.targets - low.targets)
    return (f"resident memory per model: {slope_mb * 1024:.0f} KB ({high.rss_mb:g} MB at {high.targets} models, "
            f"{low.rss_mb:g} MB at {low.targets})")


def to_json(row: FleetFigures) -> str:
    return json.dumps(asdict(row))


def main(argv: list[str] | None = None) -> int:
    """`python -m loadtest.fleetscale N TICKS [pods]`: one N, its figures as one JSON line (controller_bench runs
    it)."""
    import logging
    import sys

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    args = argv if argv is not None else sys.argv[1:]
    print(to_json(run(int(args[0]), ticks=int(args[1]), pods=args[2:] == ["pods"])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
