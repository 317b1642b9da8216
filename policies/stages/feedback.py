"""Stage 5, feedback: calibrate the queueing model against the latency users actually get.

Erlang C sizes capacity as if arrivals were Poisson at the measured rate. Real traffic is burstier inside
a tick (a client submits a batch at once), so the model's capacity can be right on average and still miss
the SLO. When the measured p99 is above its target, the sizing headroom grows by `slo_feedback_step_ratio`
per tick (up to `max_headroom_ratio`), but only when the replicas the policy last decided are all ready
(a miss while ordered capacity is still landing is lateness, not a sizing error); while p99 stays under half
the target it decays by `slo_feedback_decay_ratio` per tick back towards 1. Multiplicative increase and slow
decay: it learns a workload's burstiness in minutes and forgets it over about an hour. E.g. five violating ticks
in a row take 1.0 to 1.05^5 ~ 1.28; with a 0.002 decay it then takes ~120 quiet ticks (30 min at 15 s) to return to 1.0.
"""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.types import Clean, Tick


def slo_feedback(
    spec: PolicySpec, headroom: float, clean: Clean, *, model_satisfied: bool
) -> tuple[float, list[str]]:
    target, p99 = spec.p99_latency_target_s, clean.p99_latency_s
    if target is None or p99 is None:
        return headroom, []
    if p99 > target and model_satisfied:
        grown = min(spec.max_headroom_ratio, headroom * (1 + spec.slo_feedback_step_ratio))
        return grown, [f"slo feedback: p99 {p99:.2f} s > {target} s, headroom {headroom:.2f} -> {grown:.2f}"]
    if p99 < 0.5 * target and headroom > 1.0:
        return max(1.0, headroom * (1 - spec.slo_feedback_decay_ratio)), []
    return headroom, []


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The sizing headroom learned from p99, and what capacity is sized for (`capacity_ratio` x headroom)."""
    assert tick.clean is not None and tick.clean.cluster is not None
    cluster = tick.clean.cluster
    # A miss while capacity the policy already ordered is still landing says it was late, which more
    # headroom would not fix; a miss with its own last decision ready says the sizing was wrong.
    model_satisfied = cluster.ready_replicas >= (tick.state.last_replicas or cluster.spec_replicas)
    learned, why = slo_feedback(spec, tick.state.headroom_ratio, tick.clean, model_satisfied=model_satisfied)
    state = tick.state.changed(headroom_ratio=learned)
    return tick.then(why, state=state, sizing=spec.capacity_ratio * learned)
