"""`autoscaler run`: wire the controller for one target and run it until SIGTERM.

Servers: health (/healthz: the loop ticked within three periods; /readyz: a decision has been published)
and the controller's own /metrics on `http_port`; the admission endpoint on `admission.port`; the KEDA
gRPC scaler on `keda.port` in `keda` mode. With leader election on, only the Lease holder writes to the
cluster (every replica decides and serves, so KEDA and gateways can ask any of them). On SIGTERM the loop
finishes its tick, the Lease is released and the servers stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard
from autoscaler.config import Mode, Settings
from autoscaler.kube.client import Kube
from autoscaler.kube.cluster import ClusterReader
from autoscaler.kube.events import EventRecorder
from autoscaler.kube.lease import LeaderElector
from autoscaler.kube.scale import ScaleActuator
from autoscaler.kube.warmpool import WarmPool
from autoscaler.loop import Controller, PriorityCounter
from autoscaler.metrics import ControllerMetrics
from autoscaler.signals.prometheus import PrometheusSource


STARTED = web.AppKey("started", float)


def configure_logging() -> None:
    logging.basicConfig(format="%(message)s", stream=sys.stdout, level=logging.INFO)
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )


def health_app(controller: Controller, metrics: ControllerMetrics, board: DecisionBoard) -> web.Application:
    period = controller.settings.tick_s

    async def healthz(request: web.Request) -> web.Response:
        last = controller.last_tick_s
        started = request.app[STARTED]
        if last is None and time.time() - started > 3 * period + 30:
            return web.Response(status=503, text="no tick completed yet\n")
        if last is not None and time.time() - last > 3 * period:
            return web.Response(status=503, text=f"last tick {time.time() - last:.0f} s ago\n")
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if board.latest is None:
            return web.Response(status=503, text="no decision yet\n")
        return web.Response(text="ok\n")

    async def prometheus_metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app[STARTED] = time.time()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", prometheus_metrics)])
    return app


async def _serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def run(settings: Settings, *, kubeconfig: str | None = None, host: str = "0.0.0.0",
              stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass  # not the main thread (tests)
    target = settings.target
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    kube = await Kube.connect(kubeconfig)
    session = aiohttp.ClientSession()
    board, metrics, priorities = DecisionBoard(), ControllerMetrics(), PriorityCounter()
    warm_name = target.name + settings.warm_pool.name_suffix
    cluster = ClusterReader(kube, namespace=target.namespace, kind=target.kind, name=target.name,
                            warm_pool_name=warm_name if settings.warm_pool.enabled else None)
    sources = []
    if settings.prometheus.url:
        sources.append(PrometheusSource(session, settings.prometheus.url, settings.queries,
                                        timeout_s=settings.prometheus.timeout_s))
    if settings.scrape.enabled:
        from autoscaler.presets import SCRAPE
        from autoscaler.signals.scrape import KubePodEndpoints, ScrapeSource

        pods = KubePodEndpoints(kube, namespace=target.namespace, kind=target.kind, name=target.name,
                                port=settings.scrape.port, path=settings.scrape.path)
        sources.append(ScrapeSource(session, pods, SCRAPE[settings.model_server], timeout_s=settings.scrape.timeout_s))
    elector = None
    if settings.leader_election.enabled and settings.mode == Mode.actuate:
        le = settings.leader_election
        elector = LeaderElector(kube, namespace=target.namespace, name=le.lease_name or f"{target.name}-autoscaler",
                                identity=identity, lease_duration_s=le.lease_duration_s,
                                renew_deadline_s=le.renew_deadline_s, retry_period_s=le.retry_period_s)
    controller = Controller(
        settings=settings, sources=sources, cluster=cluster, board=board, metrics=metrics, priorities=priorities,
        scaler=ScaleActuator(kube, namespace=target.namespace, kind=target.kind, name=target.name,
                             min_replicas=settings.policy.min_replicas, max_replicas=settings.policy.max_replicas),
        warm_pool=WarmPool(kube, namespace=target.namespace, name=warm_name, target=target.name,
                           priority_class=settings.warm_pool.priority_class,
                           pause_image=settings.warm_pool.pause_image, max_slots=settings.policy.max_warm_slots),
        events=EventRecorder(kube, namespace=target.namespace, kind=target.kind, name=target.name, instance=identity),
        is_leader=(lambda: elector.is_leader) if elector else (lambda: True),
    )
    runners = [await _serve(health_app(controller, metrics, board), host, settings.http_port)]
    probe = None
    if settings.admission.enabled:
        from autoscaler.presets import SCRAPE
        from autoscaler.signals.queueprobe import QueueProbe, QueueReading
        from autoscaler.signals.scrape import KubePodEndpoints

        queue_metric = SCRAPE[settings.model_server].get("queue_depth")
        if settings.admission.queue_probe_interval_s is not None and queue_metric:
            pods = KubePodEndpoints(kube, namespace=target.namespace, kind=target.kind, name=target.name,
                                    port=settings.scrape.port, path=settings.scrape.path)
            probe = QueueProbe(session, pods, queue_metric, interval_s=settings.admission.queue_probe_interval_s,
                               in_flight_metric=SCRAPE[settings.model_server].get("in_flight"))

        def live_queue() -> QueueReading | float | None:
            reading = probe.reading() if probe is not None else None
            if reading is None and board.latest is not None:
                return board.latest.queue_depth
            return reading

        admission = Admission(
            board, priorities=settings.policy.priorities, header=settings.admission.priority_header,
            default_class=settings.admission.default_priority, retry_after_s=settings.admission.retry_after_s,
            live_queue=live_queue,
            on_result=lambda cls, result: (priorities.add(cls, result), metrics.admission.labels(cls, result).inc()),
        )
        runners.append(await _serve(admission.app(), host, settings.admission.port))
    grpc_server = None
    if settings.mode == Mode.keda:
        from autoscaler.keda.server import start

        grpc_server = await start(board, host=host, port=settings.keda.port, namespace=target.namespace,
                                  scaled_object=target.name, metric_name=settings.keda.metric_name)
    structlog.get_logger("autoscaler").info("started", target=f"{target.namespace}/{target.kind}/{target.name}",
                                            mode=settings.mode.value, identity=identity)
    tasks = [asyncio.create_task(controller.run(stop))]
    if elector is not None:
        tasks.append(asyncio.create_task(elector.run(stop)))
    if probe is not None:
        tasks.append(asyncio.create_task(probe.run(stop)))
    try:
        await stop.wait()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        if grpc_server is not None:
            await grpc_server.stop(grace=2)
        for runner in runners:
            await runner.cleanup()
        await session.close()
        await kube.close()
        structlog.get_logger("autoscaler").info("stopped")
