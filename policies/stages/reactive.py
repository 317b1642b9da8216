"""Stage 6, reactive: replicas needed for what is happening now, the max over signals (the HPA multi-metric rule).

- demand: Erlang C slots for the measured arrival rate at the learned service time, plus slots to drain
  the current queue within the SLO (q requests x E[S] / SLO). E.g. 30 req/s x 2 s = 60 busy slots; for a
  2 s SLO at 0.1 % misses Erlang C asks for 66 slots -> 5 replicas of 16; a queue of 40 adds
  40 x 2 / 2 = 40 slots, (66 + 40) / 16 -> 7 replicas.
  Behind per-replica gateway queues (`gateway_queues`) the slots fill replicas of k - 1 (spec.py).
- p99 above its target adds 10 % (at least one replica) to what is ready.
- GPU memory headroom below its floor scales ready replicas so usage falls back to 1 - floor.
- token rate over a per-replica token target, when configured.
"""

from __future__ import annotations

import math
from policies.queueing import servers_for
from policies.spec import PolicySpec
from policies.types import Clean, Tick


MIN_SERVICE_S, MAX_SERVICE_S = 1e-3, 3600.0  # plausible slot time of one request
# Smoothing of service-time samples per tick: a measured mean (vLLM's histogram over 1 min) is trusted more
# than Little's law on an instantaneous gauge, so it moves the estimate 3x faster (half-life ~2 vs ~7 ticks).
MEASURED_SERVICE_WEIGHT = 0.3
LITTLE_SERVICE_WEIGHT = 0.1
# Little's law needs throughput ~= arrivals: only while the queue is within 1 + 5 % of in-flight requests.
LITTLE_MAX_QUEUE_RATIO = 0.05
# p99 over its target: 10 % more than what is ready (at least one replica), a nudge the next tick re-checks.
P99_STEP_RATIO = 0.1


def learn_service_time(spec: PolicySpec, previous: float | None, clean: Clean) -> float | None:
    """Mean slot time per request, smoothed over ticks.

    Measured directly when the server exports it (vLLM's request_inference_time_seconds); otherwise by
    Little's law on the servers, in-flight = throughput x E[S], trusted only when the queue is (nearly)
    empty so that throughput ~= arrival rate. The measured value wins: Little's law on an instantaneous
    gauge against a 1-minute rate is biased on bursty traffic. Samples outside 1 ms .. 1 h are clamped, and
    Little's law needs at least one arrival per tick: a near-zero rate would "learn" an absurd time. Nor is it
    used while the gateway holds requests (scale to zero): the replicas then serve a released backlog that
    arrived before the rate's window, and in-flight / rate read 45 s for a 0.7-s service on the Azure code
    trace (`--idle-after-s 60`), which sized 461 replicas for its forecast."""
    if clean.service_time_s is not None:
        sample = min(MAX_SERVICE_S, max(MIN_SERVICE_S, clean.service_time_s))
        return sample if previous is None else previous + MEASURED_SERVICE_WEIGHT * (sample - previous)
    inflight, rate, queue = clean.in_flight, clean.arrival_rate_per_s, clean.queue_depth
    if inflight is None or rate is None or rate * spec.tick_s < 1 or inflight < 1 or (clean.held_requests or 0) > 0:
        return previous
    if queue is not None and queue > 1 + LITTLE_MAX_QUEUE_RATIO * inflight:
        return previous
    sample = min(MAX_SERVICE_S, max(MIN_SERVICE_S, inflight / rate))
    return sample if previous is None else previous + LITTLE_SERVICE_WEIGHT * (sample - previous)


def reactive(
    spec: PolicySpec, clean: Clean, service_s: float, sizing_ratio: float = 1.0
) -> tuple[int | None, list[str]]:
    """Replicas for the load now; `sizing_ratio` is the SLO feedback's multiplier on the rate sized for."""
    k = spec.replica_concurrency
    ready = clean.cluster.ready_replicas if clean.cluster else 0
    needs: list[tuple[int, str]] = []
    rate, queue = clean.arrival_rate_per_s, clean.queue_depth
    if rate is not None:
        slots = servers_for(
            rate_per_s=rate * sizing_ratio, service_s=service_s, wait_s=spec.slo_queue_wait_s,
            miss_ratio=spec.slo_miss_target_ratio,
        )
        drain = (queue or 0.0) * service_s / spec.slo_queue_wait_s
        needs.append((math.ceil((slots + drain) / spec.queueing_slots_per_replica),
                      f"{rate:.1f} req/s x {service_s:.2f} s, queue {queue or 0:.0f}{spec.queueing_note}"))
    elif clean.in_flight is not None:
        # No demand rate: in-flight plus queue is a lower bound on busy slots.
        busy = clean.in_flight + (queue or 0.0)
        needs.append((math.ceil(busy / k), f"in-flight {clean.in_flight:.0f} + queue {queue or 0:.0f}"))
    p99 = clean.p99_latency_s
    if spec.p99_latency_target_s is not None and p99 is not None and p99 > spec.p99_latency_target_s:
        step_replicas = max(1, math.ceil(P99_STEP_RATIO * ready))
        needs.append((ready + step_replicas, f"p99 {p99:.2f} s > {spec.p99_latency_target_s} s"))
    memory = clean.gpu_memory_headroom_ratio
    floor = spec.gpu_memory_headroom_floor_ratio
    if memory is not None and memory < floor and ready > 0:
        needs.append((math.ceil(ready * (1 - memory) / (1 - floor)), f"memory headroom {memory:.2f} < {floor}"))
    tokens = clean.token_rate_per_s
    if spec.target_tokens_per_s_per_replica is not None and tokens is not None:
        needs.append((math.ceil(tokens / spec.target_tokens_per_s_per_replica), f"{tokens:.0f} tokens/s"))
    if not needs:
        return None, []
    replicas, why = max(needs, key=lambda n: n[0])
    return replicas, [f"reactive: {replicas} replicas for {why}"]


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Replicas for the load now, sized with the feedback's headroom."""
    assert tick.clean is not None
    replicas, why = reactive(spec, tick.clean, tick.service_s, tick.sizing)
    return tick.then(why, reactive=replicas)
