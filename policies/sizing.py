"""The product's one rule for capacity: replicas for an arrival rate.

Erlang C slots (`queueing.servers_for`) so that P(queue wait > SLO) stays under `slo_miss_target_ratio`,
in replicas of `spec.queueing_slots_per_replica` slots (`replica_concurrency`, or one fewer behind per-replica
gateway queues: `gateway_queues`). Every stage that turns a forecast rate into replicas
(predictive sizing, early orders, the warm pool) calls this."""

from __future__ import annotations

import math

from policies.queueing import servers_for
from policies.spec import PolicySpec


def replicas_for_rate(spec: PolicySpec, rate: float, service_s: float) -> int:
    slots = servers_for(
        rate_per_s=rate, service_s=service_s, wait_s=spec.slo_queue_wait_s, miss_ratio=spec.slo_miss_target_ratio
    )
    return math.ceil(slots / spec.queueing_slots_per_replica)
