"""The controller's own Prometheus metrics: what it decided, why it could not, and how long it took."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from policies import ClusterState, Decision

HOLD_BUCKETS_S = (0.1, 1, 5, 15, 30, 60, 120, 180, 300, 450, 600, 900)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.decided = Gauge("autoscaler_decided_replicas", "Replicas the last decision asked for", registry=r)
        self.current = Gauge("autoscaler_current_replicas", "Replicas the target has (spec)", registry=r)
        self.ready = Gauge("autoscaler_ready_replicas", "Ready replicas of the target", registry=r)
        self.unschedulable = Gauge("autoscaler_unschedulable_replicas",
                                   "Replicas waiting for a node (normal while one is provisioned)", registry=r)
        self.unplaceable = Gauge("autoscaler_unplaceable_replicas",
                                 "Ordered replicas no node can be provisioned for (a limit, a quota)", registry=r)
        self.capped = Gauge("autoscaler_capped_by_budget",
                            "1 while the GPU budget (config caps, Kueue quota) holds the replicas below demand",
                            registry=r)
        self.gpus_held = Gauge("autoscaler_gpus_held", "GPUs the target's pods and warm placeholders hold on nodes",
                               registry=r)
        self.cost = Gauge("autoscaler_gpu_cost_per_hour", "What the held GPUs cost per hour (capacity.gpu_hour_price)",
                          registry=r)
        self.warm = Gauge("autoscaler_warm_slots", "Warm (placeholder) slots decided", registry=r)
        self.shed = Gauge("autoscaler_shed_ratio", "Fraction shed per priority", ["priority"], registry=r)
        self.forecast = Gauge("autoscaler_forecast_requests_per_second", "Forecast demand at now + lead time",
                              ["bound"], registry=r)
        self.lead = Gauge("autoscaler_lead_time_seconds", "Learned lead time", registry=r)
        self.node_provisioning = Gauge("autoscaler_node_provisioning_seconds", "Node provisioning time the lead "
                                       "time counts when no slot is free (learned from pod waits, or the default)",
                                       registry=r)
        self.valid = Gauge("autoscaler_decision_valid", "1 if the last decision was valid", registry=r)
        self.leader = Gauge("autoscaler_is_leader", "1 while this replica holds the Lease", registry=r)
        self.loop = Histogram("autoscaler_loop_duration_seconds", "Duration of one tick",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.errors = Counter("autoscaler_errors_total", "Errors by kind", ["kind"], registry=r)
        self.actions = Counter("autoscaler_scaling_actions_total", "Scale writes", ["direction"], registry=r)
        self.admission = Counter("autoscaler_admission_requests_total", "Admission answers",
                                 ["priority", "result"], registry=r)
        self.unknown_priority = Counter("autoscaler_admission_unknown_priority_total", "Admission requests whose "
                                        "priority header named no class (answered as admission.unknown_priority)",
                                        registry=r)
        self.held = Gauge("autoscaler_admission_held_requests", "Requests the admission endpoint holds for a "
                          "Ready replica (scale to zero), now", registry=r)
        self.hold = Histogram("autoscaler_admission_hold_seconds", "How long each held request waited, by outcome "
                              "(admitted, or expired: answered 503 after max_hold_s)", ["outcome"],
                              buckets=HOLD_BUCKETS_S, registry=r)
        self.wake_hold = Histogram("autoscaler_admission_wake_hold_seconds", "How long each held request waited, "
                                   "by where the latest wake from zero landed its first replica (slot: a free warm "
                                   "or idle slot, a pod start-up; node: a new node first; unknown: no wake seen)",
                                   ["start"], buckets=HOLD_BUCKETS_S, registry=r)
        self.decision_age = Gauge("autoscaler_decision_age_seconds", "Age of the latest decision (NaN before the "
                                  "first); older than stale_after_ticks ticks it is not served", registry=r)
        self.stale_answers = Counter("autoscaler_stale_decision_answers_total", "Answers while the latest decision "
                                     "was stale: the admission endpoint admitted, KEDA got UNAVAILABLE", ["server"],
                                     registry=r)

    def observe_hold(self, outcome: str, waited_s: float, wake_start: str | None) -> None:
        """A hold ended (`admitted` or `expired`) after `waited_s`; `wake_start`: where the latest wake landed."""
        self.hold.labels(outcome).observe(waited_s)
        self.wake_hold.labels(wake_start or "unknown").observe(waited_s)

    def record(self, decision: Decision, *, current: int | None, ready: int | None,
               unschedulable: int | None = None, cluster: ClusterState | None = None) -> None:
        self.decided.set(decision.replicas)
        self.warm.set(decision.warm_slots)
        self.unplaceable.set(decision.unplaceable_replicas)
        self.capped.set(1 if decision.capped_by_budget else 0)
        self.valid.set(1 if decision.valid else 0)
        if current is not None:
            self.current.set(current)
        if ready is not None:
            self.ready.set(ready)
        if unschedulable is not None:
            self.unschedulable.set(unschedulable)
        for priority, level in decision.shed.items():
            self.shed.labels(priority).set(level)
        if decision.forecast_rate_per_s is not None:
            self.forecast.labels("mean").set(decision.forecast_rate_per_s)
        if decision.forecast_upper_rate_per_s is not None:
            self.forecast.labels("upper").set(decision.forecast_upper_rate_per_s)
        if cluster is not None:
            self.gpus_held.set(cluster.gpus_held)
            if cluster.gpu_cost_per_hour is not None:
                self.cost.set(cluster.gpu_cost_per_hour)
        if decision.lead_time_s is not None:
            self.lead.set(decision.lead_time_s)
        if decision.node_provisioning_s is not None:
            self.node_provisioning.set(decision.node_provisioning_s)
