"""KEDA and the gateways ask one fleet process about any model; each question is routed to the model's board.

- KEDA: one gRPC scaler for every model. The ScaledObject's trigger metadata names the ModelAutoscaler
  (`modelAutoscaler: NAME`; unset: the ScaledObject's own name); its namespace is the ScaledObject's, which KEDA
  sends in every ScaledObjectRef. Then every answer is the single mode's (`external_scaler/server.py`) on that
  model's board. A model this process does not serve is NOT_FOUND (counted).
- Admission: one endpoint for every model. The gateway names the model per request, either in the header
  `x-model-autoscaler: NAMESPACE/NAME` on the usual paths (`/auth_request`, `/auth_request/hold`,
  `/ext_authz/...`) or in the path, `/models/NAMESPACE/NAME` + the usual path. Then the answer is the single
  mode's (`admission.py`) for that model. A request naming no model, or one not served here, is ADMITTED
  (the request path fails open) and counted.
- Health: `/decided` is ready once every model has a decision none of which is stale.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import grpc
from aiohttp import web

from autoscaler.board import DecisionBoard
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler.server import ExternalScaler

if TYPE_CHECKING:
    from autoscaler.fleet.controller import FleetController

MODEL_HEADER = "x-model-autoscaler"
MODEL_METADATA = "modelAutoscaler"


class FleetScaler(ExternalScaler):
    def __init__(self, fleet: "FleetController", *, metric_name: str, on_unknown: Callable[[], None] = lambda: None):
        self.fleet = fleet
        self.metric_name = metric_name
        self.on_unknown = on_unknown

    async def _board(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> DecisionBoard:
        name = ref.scalerMetadata.get(MODEL_METADATA) or ref.name
        model = self.fleet.models.get((ref.namespace, name))
        if model is None:
            self.on_unknown()
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no ModelAutoscaler {ref.namespace}/{name} is served here "
                                f"(ScaledObject {ref.namespace}/{ref.name}, metadata {MODEL_METADATA})")
        return model.board


def _model_of(value: str | None) -> tuple[str, str] | None:
    namespace, _, name = (value or "").strip().partition("/")
    return (namespace, name) if namespace and name else None


class FleetAdmission:
    def __init__(self, fleet: "FleetController", *, on_unknown: Callable[[], None] = lambda: None) -> None:
        self.fleet = fleet
        self.on_unknown = on_unknown

    def _route(self, handler: str):
        async def answer(request: web.Request) -> web.Response:
            info = request.match_info
            key = ((info["namespace"], info["name"]) if "namespace" in info
                   else _model_of(request.headers.get(MODEL_HEADER)))
            model = self.fleet.models.get(key) if key is not None else None
            if model is None or model.admission is None:
                self.on_unknown()
                return web.Response(status=200)  # fail open: no model to ask
            return await getattr(model.admission, handler)(request)

        return answer

    def app(self) -> web.Application:
        app = web.Application()
        for prefix in ("", "/models/{namespace}/{name}"):
            for path, handler in (("/auth_request", "auth_request"), ("/auth_request/hold", "auth_request_hold"),
                                  ("/ext_authz/{tail:.*}", "ext_authz"), ("/ext_authz", "ext_authz")):
                app.router.add_route("*", prefix + path, self._route(handler))
        return app


class FleetDecided:
    """The fleet as the health app's board: decided when every model has a decision, stale if any is."""

    def __init__(self, fleet: "FleetController") -> None:
        self.fleet = fleet
        settings = fleet.settings
        self.stale_after_s = settings.stale_after_ticks * settings.tick_s

    def _boards(self) -> list[DecisionBoard]:
        return [m.board for m in list(self.fleet.models.values())]

    @property
    def latest(self) -> object | None:
        boards = self._boards()
        return None if not boards or any(b.latest is None for b in boards) else boards

    def age_s(self) -> float:
        ages = [b.age_s() for b in self._boards() if b.latest is not None]
        return max(ages) if ages else math.nan

    def stale(self) -> bool:
        return any(b.stale() for b in self._boards())
