"""Stage 2, learn: fold this tick's measurements into what the policy remembers; without demand, hold.

What is learned here is learned whatever the rest of the tick decides, even on a tick that holds: the
service time (`reactive.learn_service_time`), the demand history and its model (`forecast.observe`), pod
start-ups and node waits (`leadtime`). Neither an arrival rate nor in-flight requests usable: nothing
to size on, the decision holds (`valid=False`)."""

from __future__ import annotations

from collections.abc import Mapping

from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.stages.leadtime import remember_node_waits, remember_startups
from policies.stages.reactive import learn_service_time
from policies.stages.shedding import protected_share
from policies.types import Tick


def _protected(spec: PolicySpec, rates: Mapping[str, float]) -> float | None:
    """The share of arrivals in the classes that are never shed, only when measured per class."""
    return protected_share(spec, rates) if sum(rates.values()) > 0 else None


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Service time, forecaster, start-ups and node waits updated; no demand signal: hold."""
    clean, state = tick.clean, tick.state
    assert clean is not None
    service_s = learn_service_time(spec, state.service_time_s, clean)
    state = state.changed(
        service_time_s=service_s,
        forecast=fc.observe(spec, state.forecast, clean.arrival_rate_per_s, tick.now,
                            _protected(spec, clean.arrival_rate_by_priority), fit=tick.fit),
        startup_samples_s=remember_startups(spec, state.startup_samples_s, clean),
        node_wait_samples_s=remember_node_waits(spec, state.node_wait_samples_s, clean),
    )
    hold = None
    if clean.arrival_rate_per_s is None and clean.in_flight is None:
        hold = "no demand signal (arrival rate and in-flight both unusable)"
    return tick.then(state=state, service_s=service_s or spec.initial_service_time_s, hold=hold)
