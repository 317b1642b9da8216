"""`autoscaler run` in fleet mode: watch the ModelAutoscaler objects and control them all from one process.

Wiring, as the single mode's (`autoscaler/runtime.py`) with the fleet's parts: the object watch, the
`FleetController` and its status writer; health and the fleet's /metrics (every model's metrics labelled
with it) on `http_port`; one admission endpoint for every model on `admission.port` (the gateway names the
model per request, `fleet/routing.py`); one KEDA gRPC scaler for every model on `keda.port` in `keda` mode.
Writes are gated per model by the process's Lease (leader election, as the single mode; the Lease is
`leader_election.lease_name`, default `inference-autoscaler-fleet`, in `fleet.lease_namespace`), or by a
shard gate: the one given, or with `fleet.shards` > 0 the shard Leases (`fleet/shards.py`, docs/sharding.md,
timed by `leader_election`). The process's own config is the base of every model's settings (mode,
admission, KEDA, warm pool, the Prometheus URL...): each object adds its target, preset, signals, policy
and budget (`crd.settings_for`).
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import aiohttp
import structlog

from autoscaler.clock import Clock, SystemClock
from autoscaler.config import Mode, Settings
from autoscaler.fleet.allocation import FleetStep
from autoscaler.fleet.controller import ClusterCache, FleetController, ShardGate, SignalHub
from autoscaler.fleet.metrics import FleetMetrics
from autoscaler.fleet.model import ModelBuilder, Readers
from autoscaler.fleet.routing import FleetAdmission, FleetDecided, FleetScaler
from autoscaler.fleet.shards import ShardLeases
from autoscaler.fleet.status import StatusWriter
from autoscaler.fleet.watch import ObjectWatch
from autoscaler.kube.client import Kube
from autoscaler.kube.lease import LeaderElector
from autoscaler.kube.pooledwarm import PooledCapacityBuffer, PooledWarmPool
from autoscaler.runtime import Parts, _on_signals, _serve, health_app, run_tasks, stop_servers
from policies.fleet import Budgets

DEFAULT_LEASE = "inference-autoscaler-fleet"


def base_config(settings: Settings) -> dict[str, Any]:
    """The process's config as the base of each model's settings (its own target and fleet section aside).
    The admission queue probe is off unless `fleet.queue_probe` asks for it: each probe reads every pod of its
    model each interval and lists the model's pods every 15 s (and after a failed read), which at hundreds of
    models is thousands of reads a second; without it the saturation guard reads the tick's queue depth."""
    base = settings.model_dump(mode="json", exclude={"target", "fleet"})
    if not settings.fleet.queue_probe:
        base["admission"]["queue_probe_interval_s"] = None
    return base


def build_fleet(settings: Settings, kube: Kube, session: aiohttp.ClientSession, *, identity: str, clock: Clock,
                parts: Parts, hub: SignalHub | None = None, cache: ClusterCache | None = None,
                gate: ShardGate | None = None, metrics: FleetMetrics | None = None) -> FleetController:
    """The fleet controller and its background tasks (the watch, the Lease or the shard gate) in `parts`."""
    metrics = metrics or FleetMetrics()
    if gate is None and settings.fleet.shards > 0:
        gate = shard_gate(settings, kube, identity=identity, clock=clock, metrics=metrics)
    watch = ObjectWatch(kube, namespaces=tuple(settings.fleet.namespaces), base=base_config(settings), clock=clock,
                        on_error=lambda exc: metrics.errors.labels(exc.kind).inc())
    readers = Readers(source=hub.source if hub is not None else None,
                      cluster=cache.cluster_source if cache is not None else None,
                      forget=getattr(cache, "forget", None))
    fleet = FleetController(
        settings=settings, objects=watch, metrics=metrics, hub=hub, gate=gate,
        builder=ModelBuilder(kube, session, identity, clock, readers=readers),
        status=StatusWriter(kube, every_ticks=settings.fleet.status_every_ticks,
                            on_error=lambda exc: metrics.errors.labels(exc.kind).inc()),
    )
    fleet.builder.wake = fleet.wake
    fleet.builder.fit = parts.fitter(metrics.registry, clock, deadline_s=settings.deadline_s)
    fleet.step = build_step(settings, kube)
    fleet.builder.pooled = fleet.step.pooled if fleet.step is not None else None
    fleet.builder.reclaimable = fleet.step.reclaimable if fleet.step is not None else None
    if hasattr(cache, "use_pooled"):  # the cache builds the models' cluster readers: the same warm pool view
        cache.use_pooled(fleet.builder.pooled)
    metrics.register_models(lambda: [(k, m.metrics.registry) for k, m in list(fleet.models.items())])
    metrics.status_writes.set_function(lambda: fleet.status.writes if fleet.status else 0)
    parts.tasks.append(watch.run)
    if gate is not None:
        parts.tasks.append(gate.run)
    elif settings.leader_election.enabled and settings.mode == Mode.actuate:
        le = settings.leader_election
        elector = LeaderElector(kube, namespace=lease_namespace(settings), name=le.lease_name or DEFAULT_LEASE,
                                identity=identity, lease_duration_s=le.lease_duration_s,
                                renew_deadline_s=le.renew_deadline_s, retry_period_s=le.retry_period_s, clock=clock)
        fleet.is_leader = lambda: elector.is_leader
        parts.tasks.append(elector.run)
    parts.tasks.insert(0, fleet.run)
    return fleet


def build_step(settings: Settings, kube: Kube) -> FleetStep | None:
    """The fleet decision, when the process config caps the fleet's GPUs (`capacity.max_gpus`) or each
    namespace's (`capacity.namespace_max_gpus`); with the warm pool on, pooled per replica shape in the
    controller's namespace, as placeholders or as CapacityBuffers (`warm_pool.backend`)."""
    capacity, warm = settings.capacity, settings.warm_pool
    if capacity.max_gpus is None and capacity.namespace_max_gpus is None:
        return None
    pooled = None
    if warm.enabled:
        backend = PooledCapacityBuffer if warm.backend == "capacity-buffer" else PooledWarmPool
        pooled = backend(kube, namespace=lease_namespace(settings), priority_class=warm.priority_class,
                         pause_image=warm.pause_image, max_slots=settings.policy.max_warm_slots)
    return FleetStep(budgets=Budgets(fleet_gpus=capacity.max_gpus), namespace_gpus_each=capacity.namespace_max_gpus,
                     spec=settings.fleet.decision.spec(), pooled=pooled)


def shared_io(settings: Settings, kube: Kube, session: aiohttp.ClientSession) -> tuple[SignalHub | None,
                                                                                     ClusterCache]:
    """The fleet's shared readers from the config: one PromQL query per signal for the fleet when Prometheus
    is configured, and the cluster from watches (the shard gate is `build_fleet`'s, from `fleet.shards`)."""
    from autoscaler.fleet.promql import FleetPrometheus
    from autoscaler.kube.cache import KubeCache

    hub = FleetPrometheus(session, timeout_s=settings.prometheus.timeout_s) if settings.prometheus.url else None
    return hub, KubeCache(kube, kueue_version=settings.capacity.kueue_api_version)


def shard_gate(settings: Settings, kube: Kube, *, identity: str, clock: Clock, metrics: FleetMetrics) -> ShardGate:
    """`fleet.shards` shard Leases (docs/sharding.md), timed by the leader election's settings and named after
    its Lease."""
    le = settings.leader_election
    return ShardLeases(kube, namespace=lease_namespace(settings), identity=identity, shards=settings.fleet.shards,
                       lease_duration_s=le.lease_duration_s, renew_deadline_s=le.renew_deadline_s,
                       retry_period_s=le.retry_period_s, clock=clock, group=le.lease_name or DEFAULT_LEASE,
                       registry=metrics.registry)


def lease_namespace(settings: Settings) -> str:
    return settings.fleet.lease_namespace or os.environ.get("POD_NAMESPACE") or "default"


async def start_fleet_servers(settings: Settings, fleet: FleetController, *, host: str, clock: Clock,
                              parts: Parts) -> None:
    decided = FleetDecided(fleet)
    parts.runners.append(await _serve(health_app(fleet, fleet.metrics, decided, clock, clock.now(),
                                                 serving=lambda: parts.serving), host, settings.http_port))
    if settings.admission.enabled:
        admission = FleetAdmission(fleet, on_unknown=fleet.metrics.unknown_model.labels("admission").inc)
        parts.runners.append(await _serve(admission.app(), host, settings.admission.port))
    if settings.mode == Mode.keda:
        from autoscaler.external_scaler.server import serve
        from autoscaler.external_scaler.tls import server_credentials

        tls = settings.keda.tls
        scaler = FleetScaler(fleet, metric_name=settings.keda.metric_name,
                             on_unknown=fleet.metrics.unknown_model.labels("keda").inc)
        parts.grpc_server = await serve(scaler, host=host, port=settings.keda.port,
                                        credentials=server_credentials(tls) if tls is not None else None)
    parts.serving = True


async def run_fleet(settings: Settings, *, kubeconfig: str | None = None, host: str = "0.0.0.0",
                    stop: asyncio.Event | None = None, clock: Clock | None = None, hub: SignalHub | None = None,
                    cache: ClusterCache | None = None, gate: ShardGate | None = None,
                    shared: bool = True) -> None:
    """Until `stop` (or SIGTERM). `shared`: the readers not given come from the config (`shared_io`); False:
    each model reads as the single mode does, save those given."""
    stop = stop or asyncio.Event()
    clock = clock or SystemClock()
    _on_signals(stop)
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    kube = await Kube.connect(kubeconfig, clock=clock)
    session = aiohttp.ClientSession()
    parts = Parts()
    log = structlog.get_logger("autoscaler")
    metrics = FleetMetrics()
    try:
        if shared:
            default_hub, default_cache = shared_io(settings, kube, session)
            hub, cache = hub or default_hub, cache or default_cache
        if cache is not None:
            await cache.start()
        fleet = build_fleet(settings, kube, session, identity=identity, clock=clock, parts=parts, hub=hub,
                            cache=cache, gate=gate, metrics=metrics)
        await start_fleet_servers(settings, fleet, host=host, clock=clock, parts=parts)
        log.info("started", fleet=True, namespaces=settings.fleet.namespaces or "all", mode=settings.mode.value,
                 identity=identity)
        await run_tasks(parts, stop)
    finally:
        await stop_servers(parts)
        if cache is not None:
            await cache.stop()
        await session.close()
        await kube.close()
        log.info("stopped")
