"""The fleet's /metrics: its own figures, and every model's `ControllerMetrics` with the model's labels.

Each model keeps the single mode's metrics in a registry of its own (the loop records into it unchanged); at
scrape time `ModelMetrics` re-exports every model's samples under the same names with two more labels,
`namespace` and `model_autoscaler`, so the single mode's dashboards and alerts work per model. A deleted
model's series disappear with it.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

Key = tuple[str, str]


class ModelMetrics:
    """A collector over the models' registries (`registries()` is read at each scrape)."""

    def __init__(self, registries: Callable[[], Iterable[tuple[Key, CollectorRegistry]]]) -> None:
        self.registries = registries

    def collect(self):
        families: dict[str, Metric] = {}
        for (namespace, name), registry in self.registries():
            for metric in registry.collect():
                family = families.get(metric.name)
                if family is None:
                    family = families[metric.name] = Metric(metric.name, metric.documentation, metric.type)
                for sample in metric.samples:
                    family.add_sample(sample.name, {**sample.labels, "namespace": namespace,
                                                    "model_autoscaler": name}, sample.value, sample.timestamp)
        return list(families.values())


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.models = Gauge("autoscaler_fleet_models", "Models controlled (valid ModelAutoscaler objects)", registry=r)
        self.invalid = Gauge("autoscaler_fleet_invalid_objects", "ModelAutoscaler objects whose spec does not "
                             "validate (reported in their status, not controlled)", registry=r)
        self.tick = Histogram("autoscaler_fleet_tick_duration_seconds", "Duration of one fleet tick (every model)",
                              buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30), registry=r)
        self.errors = Counter("autoscaler_fleet_errors_total", "Errors of the fleet loop by kind", ["kind"],
                              registry=r)
        self.unknown_model = Counter("autoscaler_fleet_unknown_model_total", "Requests naming no model this "
                                     "process serves, by server (admission: admitted; keda: NOT_FOUND)",
                                     ["server"], registry=r)
        self.status_writes = Gauge("autoscaler_fleet_status_writes", "Status patches sent since start", registry=r)

    def register_models(self, registries: Callable[[], Iterable[tuple[Key, CollectorRegistry]]]) -> None:
        self.registry.register(ModelMetrics(registries))
