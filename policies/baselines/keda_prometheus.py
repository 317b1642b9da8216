"""KEDA's Prometheus scaler: an External metric with an AverageValue threshold, fed to the HPA.

The query is the deployment's total in-flight + waiting requests (e.g.
`sum(vllm:num_requests_running + vllm:num_requests_waiting)`), the threshold the per-replica target. The HPA
then applies usage ratio = value / (threshold x current replicas), tolerance 0.1, desired =
ceil(value / threshold), and its default behavior (see `hpa`)."""

from __future__ import annotations

from policies.baselines.hpa import HpaSpec, HpaState, decide as hpa_decide
from policies.baselines.hpa import initial_state as initial_state  # noqa: F401 (same state as the HPA)
from policies.types import Decision, Signals


def keda_spec(threshold: float, *, min_replicas: int = 1, max_replicas: int = 64) -> HpaSpec:
    return HpaSpec(
        target_per_pod=threshold, min_replicas=min_replicas, max_replicas=max_replicas, external_average_value=True
    )


def decide(spec: HpaSpec, state: HpaState, signals: Signals, now: float) -> tuple[Decision, HpaState]:
    decision, new_state = hpa_decide(spec, state, signals, now)
    reasons = tuple(r.replace("hpa:", "keda:", 1) for r in decision.reasons)
    return Decision(replicas=decision.replicas, valid=decision.valid, reasons=reasons), new_state
