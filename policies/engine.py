"""`decide(spec, state, signals, now) -> (Decision, PolicyState)`: the predictive policy.

The stages of `policies/stages/` in order: sanitize -> reactive -> lead time -> predictive -> combine -> bounds ->
warm pool -> shedding. Every stage that changes the outcome adds a reason.

Safety rules:
- no cluster state, or neither a demand rate nor in-flight: `valid=False`, replicas = current; actuators
  leave the cluster alone.
- a demand signal (queue, in-flight, arrival rate or counter) missing, stale or reset: the decision may
  scale up, never down ("hold" reason). Auxiliary signals (p99, memory headroom, tokens, service time)
  that are missing are named in the reasons and simply not used.
"""

from __future__ import annotations

import math
from dataclasses import replace

from policies.queueing import servers_for
from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.stages.bounds import bound
from policies.stages.budget import within_budget
from policies.stages.capacity import unplaceable
from policies.stages.combine import combine, confirm_window_s, remember_reactive
from policies.stages.feedback import slo_feedback
from policies.stages.growth import growth_risk
from policies.stages.leadtime import lead_time_s, node_provisioning_s, remember_node_waits, remember_startups, startup_s
from policies.stages.reactive import learn_service_time, reactive
from policies.stages.sanitize import blocks_scale_down, present, sanitize
from policies.stages.shedding import protected_share, saturation_depths, shed_levels
from policies.stages.warmpool import warm_slots
from policies.types import Decision, PolicyState, Signals

REFIT_REASON = "forecast: refitted"


def replicas_for_rate(spec: PolicySpec, rate: float, service_s: float) -> int:
    slots = servers_for(
        rate_per_s=rate, service_s=service_s, wait_s=spec.slo_queue_wait_s, miss_ratio=spec.slo_miss_target_ratio
    )
    return math.ceil(slots / spec.replica_concurrency)


def initial_state() -> PolicyState:
    return PolicyState()


def _hold(current: int, state: PolicyState, why: str, dropped: list[str]) -> tuple[Decision, PolicyState]:
    """A decision nobody acts on: replicas stay as they are and the shed levels of the last valid decision
    stay in force (the admission endpoint does not read an invalid decision either)."""
    reasons = tuple([f"hold: {why}"] + dropped)
    return Decision(replicas=current, valid=False, reasons=reasons, shed=dict(state.shed)), state


def decide(spec: PolicySpec, state: PolicyState, signals: Signals, now: float) -> tuple[Decision, PolicyState]:
    """One tick of the predictive policy: what to run now, given what was measured at `now`.

    `state` is what the previous call returned (`initial_state()` at start); the returned state goes into
    the next call. Pure: the same arguments always give the same result, so a replay of recorded signals
    reproduces the live decisions exactly. `Decision.valid` is False when the signals cannot support a
    decision (no cluster state, no demand signal): the caller then leaves the cluster as it is. Every stage
    that changed the outcome adds a line to `Decision.reasons`."""
    clean, counter = sanitize(spec, signals, state.last_counter, now, state.seen)
    state = replace(state, last_counter=counter, seen=state.seen | present(signals))
    dropped = list(clean.dropped)
    cluster = clean.cluster
    current = cluster.spec_replicas if cluster else (state.last_replicas or 0)
    if cluster is None:
        return _hold(current, state, "no usable cluster state", dropped)

    service_s = learn_service_time(spec, state.service_time_s, clean)
    forecast_state = fc.observe(spec, state.forecast, clean.arrival_rate_per_s, now)
    samples = remember_startups(spec, state.startup_samples_s, clean)
    waits = remember_node_waits(spec, state.node_wait_samples_s, clean)
    state = replace(state, service_time_s=service_s, forecast=forecast_state, startup_samples_s=samples,
                    node_wait_samples_s=waits)
    service_s = service_s or spec.initial_service_time_s

    if clean.arrival_rate_per_s is None and clean.in_flight is None:
        return _hold(current, state, "no demand signal (arrival rate and in-flight both unusable)", dropped)

    startup = startup_s(spec, samples)
    node_s, node_why = node_provisioning_s(spec, waits)
    lead = lead_time_s(spec, startup, cluster.warm_slots_ready + cluster.idle_slots, node_s)
    reasons: list[str] = []
    if lead > startup:
        reasons.append(f"lead time: start-up {startup:.0f} s + node provisioning {node_s:.0f} s ({node_why}); "
                       f"no warm or idle slot free")
    if fc.outage_held(spec, forecast_state, now):
        reasons.append(
            f"forecast: arrivals {clean.arrival_rate_per_s or 0:.1f} req/s, far below the expected "
            f"{fc.point(forecast_state, 1):.1f}: treated as an ingress outage since "
            f"{now - forecast_state.outage_since_s:.0f} s (held up to {spec.outage_hold_s:.0f} s)"
        )
    refitted = forecast_state.fitted_at_s == now and forecast_state.kind in ("holt", "holt-winters")
    if refitted:
        reasons.append(f"{REFIT_REASON} {forecast_state.kind} on {len(forecast_state.history)} buckets")
    # A miss while capacity the policy already ordered is still landing says it was late, which more
    # headroom would not fix; a miss with its own last decision ready says the sizing was wrong.
    model_satisfied = cluster.ready_replicas >= (state.last_replicas or cluster.spec_replicas)
    learned, why = slo_feedback(spec, state.headroom_ratio, clean, model_satisfied=model_satisfied)
    state = replace(state, headroom_ratio=learned)
    sizing = spec.capacity_ratio * learned
    reasons += why
    reactive_n, why = reactive(spec, clean, service_s, sizing)
    reasons += why
    rising = fc.climb(spec, forecast_state, startup)
    window = confirm_window_s(spec, startup, climbing=rising is not None)
    recent = remember_reactive(state.reactive_recent, reactive_n, now, keep_s=max(window, startup, spec.tick_s))

    quantiles, why = fc.recurring_only(forecast_state, fc.envelope(spec, forecast_state),
                                       gap_ticks=max(1, math.ceil(startup / spec.tick_s)),
                                       protected_share=protected_share(spec, clean.arrival_rate_by_priority),
                                       climbing=rising is not None)
    reasons += [why] if why else []
    predicted = fc.forecast(spec, forecast_state, now=now, start_s=lead, end_s=lead + spec.tick_s,
                            quantiles=quantiles)
    predictive_n = None
    if predicted is not None:
        predictive_n = replicas_for_rate(spec, predicted[1] * sizing, service_s)
        reasons.append(
            f"predictive: {predictive_n} replicas for upper forecast {predicted[1]:.1f} req/s "
            f"(mean {predicted[0]:.1f}, {forecast_state.kind}, headroom {sizing:.2f}) at +{lead:.0f} s"
        )
    free = cluster.warm_slots_ready + cluster.idle_slots
    if rising is not None and free and predictive_n is not None:
        # Demand climbs steadily: what the climb needs by the end of one start-up is ordered now, onto
        # capacity already paid for (warm and idle slots), so it is ready when the demand is.
        early = min(free, replicas_for_rate(spec, rising * sizing, service_s) - predictive_n)
        if early > 0:
            predictive_n += early
            reasons.append(f"forecast: demand climbing steadily to {rising:.1f} req/s at +{startup:.0f} s; "
                           f"{early} replicas ordered now onto warm or idle slots")
    wanted, why = combine(reactive=reactive_n, recent=recent, predictive=predictive_n, window_s=window, now=now)
    reasons += why
    if wanted is None:
        return _hold(current, state, "nothing to size on", dropped)

    replicas, recommendations, why = bound(
        spec, wanted=wanted, current=current, recommendations=state.recommendations, lead_s=lead, now=now
    )
    reasons += why
    if blocks_scale_down(clean.dropped) and replicas < current:
        replicas = current
        reasons.append("hold: not scaling down while demand signals are missing")
    reasons += [f"dropped {d}" for d in dropped]

    peak = fc.forecast(spec, forecast_state, now=now, start_s=0.0, end_s=startup + node_s,
                       quantiles=quantiles)
    peak_n = replicas_for_rate(spec, peak[1] * sizing, service_s) if peak else None
    if state.growth_risk is None or state.growth_risk_for_s != forecast_state.bucket_start_s:
        state = replace(state, growth_risk=growth_risk(spec, forecast_state, now, node_s),
                        growth_risk_for_s=forecast_state.bucket_start_s)
    risk, risk_why = state.growth_risk
    level = fc.level_now(forecast_state, clean.arrival_rate_per_s)
    risk_n = replicas_for_rate(spec, level * (1.0 + risk) * sizing, service_s) if level > 0 else None
    stuck, why = unplaceable(spec, cluster, node_s)
    reasons += why
    warm, why = warm_slots(spec, replicas=replicas, peak_replicas=peak_n, risk_replicas=risk_n,
                           risk_why=f"+{risk:.0%}: {risk_why}", idle_slots=cluster.idle_slots)
    if stuck:
        warm = 0
    else:
        reasons += why
    replicas, warm, capped, why = within_budget(cluster, replicas=replicas, warm=warm)
    reasons += why
    shed, why = shed_levels(spec, clean, service_s)
    reasons += why
    if cluster.gpus_held:
        cost = f", {cluster.gpu_cost_per_hour:.2f} per hour" if cluster.gpu_cost_per_hour is not None else ""
        reasons.append(f"cost: {cluster.gpus_held:g} GPUs held by replicas and warm slots{cost}")

    decision = Decision(
        replicas=replicas,
        warm_slots=warm,
        shed=shed,
        saturation_queue_depth=saturation_depths(spec, cluster.ready_replicas, service_s),
        saturation_slots=cluster.ready_replicas * spec.replica_concurrency,
        saturation_drain_per_s=round(cluster.ready_replicas * spec.replica_concurrency / service_s, 3),
        forecast_rate_per_s=predicted[0] if predicted else None,
        forecast_upper_rate_per_s=predicted[1] if predicted else None,
        lead_time_s=lead,
        node_provisioning_s=node_s,
        refitted=refitted,
        unplaceable_replicas=stuck,
        capped_by_budget=capped,
        reasons=tuple(reasons),
    )
    state = replace(
        state,
        last_replicas=replicas,
        recommendations=recommendations,
        reactive_recent=recent,
        shed=shed,
    )
    return decision, state
