"""Stage 11, warmpool: how many free, ready GPU slots (placeholder pods) to keep.

A replica that lands on a warm slot serves after its start-up time; one that needs a new node waits for
node provisioning too. The pool is insurance, sized for two risks beyond the replicas already decided:
- the growth the upper forecast itself expects over the next start-up + node-provisioning window;
- the growth it cannot see: demand now (the forecast's level) grown by the growth risk (`growth.py`: an
  upper quantile of past increases over one node-provisioning time, at this time of day), sized with the
  same queueing model as the replicas.
Free capacity that already exists (idle node slots) counts against the pool; the pool stays within
`max_warm_slots` and the replica bound. E.g. 20 replicas decided for 26 req/s, a p99 growth of +40 %:
36 req/s needs 27 replicas, so 7 warm slots, or 4 if 3 idle node slots exist."""

from __future__ import annotations

from policies.sizing import replicas_for_rate
from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.stages.growth import growth_risk
from policies.types import Tick


def warm_slots(
    spec: PolicySpec, *, replicas: int, peak_replicas: int | None, risk_replicas: int | None = None,
    risk_why: str = "", idle_slots: int = 0,
) -> tuple[int, list[str]]:
    if spec.max_warm_slots == 0:
        return 0, []
    room = max(0, min(spec.max_warm_slots, spec.max_replicas - replicas))
    needs = []
    if peak_replicas is not None:
        needs.append((peak_replicas - replicas, f"forecast peak of {peak_replicas} within node provisioning"))
    if risk_replicas is not None:
        needs.append((risk_replicas - replicas, f"{risk_replicas} replicas if demand grows as it has ({risk_why})"))
    if not needs:
        return 0, []
    growth, why = max(needs, key=lambda n: n[0])
    slots = max(0, min(room, growth - idle_slots))
    if slots == 0:
        return 0, []
    idle = f", less {idle_slots} idle node slots" if idle_slots else ""
    capped = " (capped)" if growth - idle_slots > room else ""
    return slots, [f"warm pool: {slots} slots{capped} beyond {replicas} replicas for {why}{idle}"]


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Warm slots for the forecast peak within start-up + node provisioning and for the growth risk (computed
    once per forecast bucket); none while replicas cannot be placed (a placeholder would take their GPUs)."""
    assert tick.clean is not None and tick.clean.cluster is not None
    state, fs, sizing, service_s = tick.state, tick.state.forecast, tick.sizing, tick.service_s
    peak = fc.forecast(spec, fs, now=tick.now, start_s=0.0, end_s=tick.startup_s + tick.node_s,
                       quantiles=tick.quantiles)
    peak_n = replicas_for_rate(spec, peak[1] * sizing, service_s) if peak else None
    if state.growth_risk is None or state.growth_risk_for_s != fs.bucket_start_s:
        state = state.changed(growth_risk=growth_risk(spec, fs, tick.now, tick.node_s),
                              growth_risk_for_s=fs.bucket_start_s)
    assert state.growth_risk is not None
    risk, risk_why = state.growth_risk
    level = fc.level_now(fs, tick.clean.arrival_rate_per_s)
    risk_n = replicas_for_rate(spec, level * (1.0 + risk) * sizing, service_s) if level > 0 else None
    warm, why = warm_slots(spec, replicas=tick.replicas, peak_replicas=peak_n, risk_replicas=risk_n,
                           risk_why=f"+{risk:.0%}: {risk_why}", idle_slots=tick.clean.cluster.idle_slots)
    if tick.unplaceable:
        return tick.then(state=state, warm=0)
    return tick.then(why, state=state, warm=warm)
