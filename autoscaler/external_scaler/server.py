"""KEDA external scaler (gRPC, package `externalscaler`): KEDA's HPA follows the published replica count.

The one metric has target 1 and value = the replicas to run, so the HPA's AverageValue rule
ceil(value / target) gives exactly the decision. Answers come from the latest decision in memory; no RPC
waits on I/O. Before the first decision, and while the latest one is stale (older than the board's
`stale_after_s`: the ticks stopped), GetMetrics and IsActive answer UNAVAILABLE: KEDA keeps the current
scale, or applies the ScaledObject's fallback after its failureThreshold, and never scales to zero on an
error; StreamIsActive pushes nothing until a fresh decision says. Scale to zero: while the admission
endpoint holds a request (the board's `held_requests`), IsActive is true and StreamIsActive pushes true at
once (the board wakes its watchers when a request is held), so KEDA scales a ScaledObject at
`minReplicaCount: 0` up without waiting for the next tick or its polling interval. An invalid decision publishes the
current replica count (hold). A ScaledObject other than the configured one, or another metric name, gets
NOT_FOUND; an empty name INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio

import grpc

from autoscaler.board import DecisionBoard, Published
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc

# StreamIsActive re-checks at least this often even when no decision changed: a keep-alive that lets a
# stream whose client went away be noticed and closed (KEDA reconnects on its own).
STREAM_RECHECK_S = 30.0


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(self, board: DecisionBoard, *, namespace: str, scaled_object: str, metric_name: str) -> None:
        self.board = board
        self.namespace = namespace
        self.scaled_object = scaled_object
        self.metric_name = metric_name

    async def _check(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> DecisionBoard:
        """The board of the ScaledObject `ref` names (aborts the call when there is none)."""
        if not ref.name or not ref.namespace:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ScaledObjectRef needs a name and a namespace")
        return await self._board(ref, context)

    async def _board(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> DecisionBoard:
        if (ref.namespace, ref.name) != (self.namespace, self.scaled_object):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown ScaledObject {ref.namespace}/{ref.name}; this scaler serves "
                f"{self.namespace}/{self.scaled_object}",
            )
        return self.board

    async def _fresh(self, board: DecisionBoard, context: grpc.aio.ServicerContext) -> Published:
        latest = board.fresh("keda")
        if latest is None:
            why = "no decision yet" if board.latest is None else f"decision {board.age_s():.0f} s old"
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{why}: keep the current scale")
        return latest

    async def IsActive(self, request, context):  # noqa: N802 (gRPC names)
        board = await self._check(request, context)
        latest = await self._fresh(board, context)
        return pb.IsActiveResponse(result=latest.replicas > 0 or board.held_requests > 0)

    async def StreamIsActive(self, request, context):  # noqa: N802
        board = await self._check(request, context)
        last = None
        recheck_s = min(STREAM_RECHECK_S, board.stale_after_s or STREAM_RECHECK_S)
        while True:
            latest = board.fresh("keda")
            if board.held_requests > 0:
                active = True  # a request waits for a replica: wake now, before the next decision says so
            else:
                active = latest.replicas > 0 if latest is not None else last  # nothing to say: say nothing
            if active != last:
                yield pb.IsActiveResponse(result=active)
                last = active
            await board.wait_change(timeout_s=recheck_s)

    def _spec(self) -> pb.GetMetricSpecResponse:
        return pb.GetMetricSpecResponse(
            metricSpecs=[pb.MetricSpec(metricName=self.metric_name, targetSize=1, targetSizeFloat=1.0)]
        )

    async def GetMetricSpec(self, request, context):  # noqa: N802
        await self._check(request, context)
        return self._spec()

    async def StreamMetricSpec(self, request, context):  # noqa: N802
        await self._check(request, context)
        yield self._spec()  # the spec never changes; keep the stream open until KEDA closes it
        while True:
            await asyncio.sleep(3600)

    async def GetMetrics(self, request, context):  # noqa: N802
        board = await self._check(request.scaledObjectRef, context)
        if request.metricName and request.metricName != self.metric_name:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown metric {request.metricName!r}; this scaler publishes "
                f"{self.metric_name!r}"
            )
        replicas = (await self._fresh(board, context)).replicas
        return pb.GetMetricsResponse(
            metricValues=[pb.MetricValue(metricName=self.metric_name, metricValue=replicas,
                                         metricValueFloat=float(replicas))]
        )


async def start(board: DecisionBoard, *, host: str, port: int, namespace: str, scaled_object: str,
                metric_name: str,
                credentials: grpc.ServerCredentials | None = None) -> grpc.aio.Server:
    """The scaler serving on host:port: over TLS with `credentials` (see `tls.server_credentials`), else plaintext."""
    servicer = ExternalScaler(board, namespace=namespace, scaled_object=scaled_object, metric_name=metric_name)
    return await serve(servicer, host=host, port=port, credentials=credentials)


async def serve(servicer: pb_grpc.ExternalScalerServicer, *, host: str, port: int,
                credentials: grpc.ServerCredentials | None = None) -> grpc.aio.Server:
    """`servicer` on host:port, over TLS with `credentials`, else plaintext."""
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind the KEDA gRPC server to {host}:{port}")
    await server.start()
    return server
