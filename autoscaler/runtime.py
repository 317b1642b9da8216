"""`autoscaler run`: wire the controller for one target and run it until SIGTERM.

Servers: health (/healthz: the loop ticked within three periods; /readyz: the servers listen; /decided: a
decision younger than `stale_after_ticks` ticks is published) and the controller's own /metrics on
`http_port`; the admission endpoint on `admission.port`; the KEDA gRPC scaler on `keda.port` in `keda`
mode. With leader election on, only the Lease holder writes to the cluster (every replica decides and
serves, so KEDA and gateways can ask any of them). Readiness is serving, not deciding: before its first
decision a replica's admission endpoint admits and its KEDA scaler answers UNAVAILABLE, both right, so its
Service must not drop it then (a rollout would otherwise leave the gateways no admission endpoint). On
SIGTERM the loop finishes its tick, the Lease is released and the servers stop. One clock serves every part.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import aiohttp
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard
from autoscaler.clock import Clock, SystemClock
from autoscaler.config import Mode, Settings
from autoscaler.fitchild import FIT_SHARE_OF_DEADLINE, LOCK_WAIT_S, ProcessFitter
from autoscaler.kube.client import Kube
from autoscaler.kube.deletion import DeletionOrder
from autoscaler.kube.events import EventRecorder
from autoscaler.kube.lease import LeaderElector
from autoscaler.kube.scale import ScaleActuator
from autoscaler.kube.readers import build_cluster_reader, build_warm_pool
from autoscaler.loop import Controller, PriorityCounter
from autoscaler.metrics import ControllerMetrics
from autoscaler.presets import SCRAPE
from autoscaler.signals.prometheus import PrometheusSource
from autoscaler.signals.queueprobe import QueueProbe, QueueReading
from autoscaler.signals.scrape import KubePodEndpoints, PodInFlight, ScrapeSource

# /healthz: the loop is alive while its last tick is at most this many periods old...
HEALTHY_TICK_PERIODS = 3
# ...and, before the first tick, for this long beyond that (start-up reads the cluster and Prometheus).
STARTUP_GRACE_S = 30.0


# The servers take request and header lines up to this size (aiohttp's default is 8190 bytes): a gateway
# forwards its clients' headers (Envoy accepts 60 KiB of them), and a refusal is a 400 the client sees.
MAX_HEADER_BYTES = 64 * 1024


class _BadRequestLine(logging.Filter):
    """A client's malformed request (a header over the limit, bad syntax) is the client's fault: aiohttp logs
    it with a traceback; this turns it into one warning with the status and the reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.peer = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.msg, record.args, record.exc_info, record.exc_text = "bad request", (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            reason = str(exc.message).split(": b'")[0]  # the client's bytes stay out of the log (tokens)
            record.status, record.error = exc.code, " ".join(reason.split())[:200]
        return True


def configure_logging() -> None:
    """Every log line is one JSON object on stdout, the libraries' (aiohttp, kubernetes) included."""
    timestamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(_BadRequestLine())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.JSONRenderer()],
        foreign_pre_chain=[structlog.processors.add_log_level, structlog.stdlib.add_logger_name, timestamp,
                           structlog.stdlib.ExtraAdder(allow=["peer", "status", "error"]),
                           structlog.processors.format_exc_info],
    ))
    logging.basicConfig(handlers=[handler], level=logging.INFO, force=True)
    structlog.configure(
        processors=[structlog.processors.add_log_level, timestamp,
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )


class Ticking(Protocol):
    """What /healthz reads of a loop (one model's, or the fleet's)."""

    settings: Settings
    last_tick_s: float | None


class Decided(Protocol):
    """What /decided reads of a board (one model's, or the fleet's view of all)."""

    stale_after_s: float | None

    @property
    def latest(self) -> object | None: ...

    def age_s(self) -> float: ...

    def stale(self) -> bool: ...


def health_app(controller: Ticking, metrics: Any, board: Decided, clock: Clock,
               started_s: float, *, serving: Callable[[], bool] = lambda: True) -> web.Application:
    limit = HEALTHY_TICK_PERIODS * controller.settings.tick_s

    async def healthz(request: web.Request) -> web.Response:
        last, now = controller.last_tick_s, clock.now()
        if last is None and now - started_s > limit + STARTUP_GRACE_S:
            return web.Response(status=503, text="no tick completed yet\n")
        if last is not None and now - last > limit:
            return web.Response(status=503, text=f"last tick {now - last:.0f} s ago\n")
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if not serving():
            return web.Response(status=503, text="starting the servers\n")
        return web.Response(text="ok\n")

    async def decided(request: web.Request) -> web.Response:
        if board.latest is None:
            return web.Response(status=503, text="no decision yet\n")
        age = f"decision {board.age_s():.0f} s old"
        if board.stale():
            return web.Response(status=503, text=f"{age}, stale after {board.stale_after_s:.0f} s\n")
        return web.Response(text=f"{age}\n")

    async def prometheus_metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/decided", decided),
                    web.get("/metrics", prometheus_metrics)])
    return app


def decision_board(settings: Settings, *, metrics: ControllerMetrics, clock: Clock,
                   wake: asyncio.Event | None = None) -> DecisionBoard:
    """The board the loop publishes to, whose decisions go stale after `stale_after_ticks` ticks; its age
    and every stale read are metrics. `wake`: an event shared with other boards (the fleet's one loop)."""
    board = DecisionBoard(stale_after_s=settings.stale_after_ticks * settings.tick_s, clock=clock,
                          on_stale=lambda reader: metrics.stale_answers.labels(reader).inc(), _wake=wake)
    metrics.decision_age.set_function(board.age_s)
    metrics.held.set_function(lambda: board.held_requests)
    return board


async def _serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    # No access log: the admission endpoint answers every request of the gateway; its counts are metrics.
    runner = web.AppRunner(app, access_log=None, max_line_size=MAX_HEADER_BYTES, max_field_size=MAX_HEADER_BYTES)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


@dataclass
class Parts:
    """What `run` starts and later stops: background tasks (each runs until `stop`) and servers."""

    tasks: list = field(default_factory=list)  # coroutine functions taking the stop event
    runners: list[web.AppRunner] = field(default_factory=list)
    grpc_server: object | None = None
    serving: bool = False  # every server listens
    fit: ProcessFitter | None = None  # the refits' child process (one per process, shared by its models)

    def fitter(self, registry: CollectorRegistry, clock: Clock, *, deadline_s: float) -> ProcessFitter:
        """The process's refit child, made on first use (its failures counted in `registry`). A fit may take
        half the tick's deadline, and a model waits for another's at most a quarter of that: a hung child
        costs its model's tick, never the fleet's (see autoscaler/fitchild.py)."""
        if self.fit is None:
            timeout_s = FIT_SHARE_OF_DEADLINE * deadline_s
            self.fit = ProcessFitter(registry=registry, now=clock.now, timeout_s=timeout_s,
                                     lock_wait_s=min(LOCK_WAIT_S, timeout_s / 4))
        return self.fit


def _pods(kube: Kube, settings: Settings) -> KubePodEndpoints:
    target = settings.target
    return KubePodEndpoints(kube, namespace=target.namespace, kind=target.kind, name=target.name,
                            port=settings.scrape.port, path=settings.scrape.path)


def build_scaler(settings: Settings, kube: Kube, session: aiohttp.ClientSession, *,
                 metrics: ControllerMetrics) -> ScaleActuator:
    """The scale subresource writer, which marks the pods a scale-down should remove (by node usage, and by
    requests in flight when the pods are scraped) within a third of the tick's deadline."""
    target, scrape = settings.target, settings.scrape
    order_timeout_s = settings.deadline_s / 3
    metric = SCRAPE[settings.model_server].get("in_flight")
    in_flight = None
    if scrape.enabled and metric:  # the pods are reachable from the controller: read their running requests
        in_flight = PodInFlight(session, metric, port=scrape.port, path=scrape.path,
                                timeout_s=min(scrape.timeout_s, order_timeout_s / 2))
    deletion = DeletionOrder(kube, namespace=target.namespace, in_flight=in_flight, timeout_s=order_timeout_s,
                             on_error=lambda exc: metrics.errors.labels(exc.kind).inc())
    # With idle_after_s the policy's own 0 (idle) must reach the target: min_replicas is the floor the policy
    # keeps while the model serves, not a bound of the write.
    floor = 0 if settings.policy.idle_after_s is not None else settings.policy.min_replicas
    return ScaleActuator(kube, namespace=target.namespace, kind=target.kind, name=target.name,
                         min_replicas=floor, max_replicas=settings.policy.max_replicas,
                         deletion=deletion)


def build_sources(settings: Settings, kube: Kube, session: aiohttp.ClientSession) -> list:
    """The signal sources: PromQL queries, the pods' /metrics, or both."""
    sources = []
    if settings.prometheus.url:
        sources.append(PrometheusSource(session, settings.prometheus.url, settings.queries,
                                        timeout_s=settings.prometheus.timeout_s))
    if settings.scrape.enabled:
        sources.append(ScrapeSource(session, _pods(kube, settings), SCRAPE[settings.model_server],
                                    timeout_s=settings.scrape.timeout_s))
    return sources


def build_controller(settings: Settings, kube: Kube, session: aiohttp.ClientSession, *, identity: str,
                     board: DecisionBoard, metrics: ControllerMetrics, priorities: PriorityCounter,
                     clock: Clock, parts: Parts) -> Controller:
    """The loop with its actuators (scale subresource, warm pool, events) and, in actuate mode, the leader
    election that gates them."""
    target = settings.target
    warm_pool = build_warm_pool(settings, kube)
    elector = None
    if settings.leader_election.enabled and settings.mode == Mode.actuate:
        le = settings.leader_election
        elector = LeaderElector(kube, namespace=target.namespace, name=le.lease_name or f"{target.name}-autoscaler",
                                identity=identity, lease_duration_s=le.lease_duration_s,
                                renew_deadline_s=le.renew_deadline_s, retry_period_s=le.retry_period_s, clock=clock)
        parts.tasks.append(elector.run)
    controller = Controller(
        settings=settings, sources=build_sources(settings, kube, session), board=board, metrics=metrics,
        cluster=build_cluster_reader(settings, kube, warm_pool),
        priorities=priorities,
        scaler=build_scaler(settings, kube, session, metrics=metrics),
        warm_pool=warm_pool,
        events=EventRecorder(kube, namespace=target.namespace, kind=target.kind, name=target.name, instance=identity),
        is_leader=(lambda: elector.is_leader) if elector else (lambda: True),
        clock=clock,
        fit=parts.fitter(metrics.registry, clock, deadline_s=settings.deadline_s),
    )
    parts.tasks.insert(0, controller.run)
    return controller


def build_admission(settings: Settings, kube: Kube, session: aiohttp.ClientSession, *, board: DecisionBoard,
                    metrics: ControllerMetrics, priorities: PriorityCounter, clock: Clock, parts: Parts) -> Admission:
    """The admission endpoint, with the queue probe that feeds its saturation guard."""
    probe = None
    queue_metric = SCRAPE[settings.model_server].get("queue_depth")
    if settings.admission.queue_probe_interval_s is not None and queue_metric:
        probe = QueueProbe(session, _pods(kube, settings), queue_metric,
                           interval_s=settings.admission.queue_probe_interval_s,
                           in_flight_metric=SCRAPE[settings.model_server].get("in_flight"), clock=clock,
                           ready=lambda: board.last_ready)
        parts.tasks.append(probe.run)

    def live_queue() -> QueueReading | float | None:
        reading = probe.reading() if probe is not None else None
        if reading is None and board.latest is not None:
            return board.latest.queue_depth
        return reading

    def on_result(cls: str, result: str) -> None:
        metrics.admission.labels(cls, result).inc()

    return Admission(
        board, priorities=settings.policy.priorities, header=settings.admission.priority_header,
        default_class=settings.admission.default_priority, unknown_class=settings.admission.unknown_priority,
        retry_after_s=settings.admission.retry_after_s, live_queue=live_queue, on_result=on_result,
        on_arrival=priorities.add,
        on_unknown=metrics.unknown_priority.inc, clock=clock, max_hold_s=settings.admission.max_hold_s,
        max_held_requests=settings.admission.max_held_requests,
        on_hold=lambda outcome, waited_s: metrics.observe_hold(outcome, waited_s, board.last_wake_start),
        # Only where a decision of 0 takes replicas away (not in shadow mode) and a held request wakes the
        # model (the idle rule's wake; without idle_after_s a held request is no demand the policy reads).
        hold_going_to_zero=settings.mode != Mode.shadow and settings.policy.idle_after_s is not None,
        replica_slots=settings.policy.replica_concurrency,
    )


async def start_servers(settings: Settings, *, host: str, controller: Controller, admission: Admission | None,
                        board: DecisionBoard, metrics: ControllerMetrics, clock: Clock, parts: Parts) -> None:
    parts.runners.append(await _serve(health_app(controller, metrics, board, clock, clock.now(),
                                                 serving=lambda: parts.serving), host, settings.http_port))
    if admission is not None:
        parts.runners.append(await _serve(admission.app(), host, settings.admission.port))
    if settings.mode == Mode.keda:
        from autoscaler.external_scaler.server import start
        from autoscaler.external_scaler.tls import server_credentials

        tls = settings.keda.tls
        parts.grpc_server = await start(board, host=host, port=settings.keda.port,
                                        namespace=settings.target.namespace, scaled_object=settings.target.name,
                                        metric_name=settings.keda.metric_name,
                                        credentials=server_credentials(tls) if tls is not None else None)
    parts.serving = True


async def stop_servers(parts: Parts) -> None:
    if parts.fit is not None:  # kills a fit in progress; off the event loop all the same (it reaps the child)
        await asyncio.to_thread(parts.fit.close)
    if parts.grpc_server is not None:
        await parts.grpc_server.stop(grace=2)
    for runner in parts.runners:
        await runner.cleanup()


async def run_tasks(parts: Parts, stop: asyncio.Event) -> None:
    """Run the background tasks until `stop`, then let them finish (each ends on `stop`)."""
    tasks = [asyncio.create_task(task(stop)) for task in parts.tasks]
    try:
        await stop.wait()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass  # not the main thread (tests)


async def run(settings: Settings, *, kubeconfig: str | None = None, host: str = "0.0.0.0",
              stop: asyncio.Event | None = None, clock: Clock | None = None) -> None:
    stop = stop or asyncio.Event()
    clock = clock or SystemClock()
    _on_signals(stop)
    target = settings.target
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    kube = await Kube.connect(kubeconfig, clock=clock)
    session = aiohttp.ClientSession()
    metrics, priorities, parts = ControllerMetrics(), PriorityCounter(), Parts()
    board = decision_board(settings, metrics=metrics, clock=clock)
    shared = dict(board=board, metrics=metrics, priorities=priorities, clock=clock, parts=parts)
    try:
        controller = build_controller(settings, kube, session, identity=identity, **shared)
        admission = build_admission(settings, kube, session, **shared) if settings.admission.enabled else None
        controller.reports_held = admission is not None  # the policy reads held_requests from the board
        await start_servers(settings, host=host, controller=controller, admission=admission, board=board,
                            metrics=metrics, clock=clock, parts=parts)
        structlog.get_logger("autoscaler").info("started", target=f"{target.namespace}/{target.kind}/{target.name}",
                                                mode=settings.mode.value, identity=identity)
        await run_tasks(parts, stop)
    finally:
        await stop_servers(parts)
        await session.close()
        await kube.close()
        structlog.get_logger("autoscaler").info("stopped")
