"""Stage 2, learn: fold this tick's measurements into what the policy remembers; without demand, hold.

What is learned here is learned whatever the rest of the tick decides, even on a tick that holds: the
service time (`reactive.learn_service_time`), the demand history and its model (`forecast.observe`), pod
start-ups and node waits (`leadtime`). Neither an arrival rate nor in-flight requests usable: nothing
to size on, the decision holds (`valid=False`).

Service time through a silence. When traffic stops, the requests that complete are the drain of those that
came before it, and the longest of them finish last: a mean by completion (vLLM's inference-time histogram
over a minute) reads them length-biased. Live (closed loop `silence`): 11.6 to 26.5 s for a 10.1 s mean,
the learned value at 12.4 to 15.4 s depending on which completions the last scrape caught, and the outage
hold and the capacity kept through the silence sized on it (10 replicas in one run, 7 in another). So from
the tick a silence begins (`forecast.silence_since`: a drop the forecaster takes for an outage), the service
time is the one learned before the drain: the value of `ceil(window / tick) + 1` ticks earlier
(`recent_service_s`; the window is the arrival rate's, `rate_window_s`, or a tick). The drop is read only
once the rate's window has (nearly) emptied, so the traffic stopped up to a window before, and its drain
may already be in the readings of the window's ticks; the tick more allows for the scrape's offset between
the two queries. Nothing is folded in while the silence lasts (nothing arrives: there is nothing steady to
learn from, only the drain and stragglers); from the return on, learning is as usual.

Only a drop the forecaster finds implausible acts: arrivals under 5 % of an expected 20 or more a tick, on
traffic whose recent ticks were rarely that low. A slow decline (the model follows it) and an on/off
trace's quiet ticks (routine in its recent ratios) learn as before, whatever their readings. In a history's
first hour an on/off trace's drops can be taken for outages (17 in the bundled Azure trace's hour, seed 1:
held ticks are not scored, so its lows never enter the ratios); their drains are drains too: read by
completion, that seed takes 115.3 GPU-h learning them, 59.5 without. The ticks between the stop and the
drop being read cannot know it yet: what they order on the drain's first readings is kept one
stabilization window, not the hold. A tick the loop skips (no cluster state: sanitize holds before this
stage) makes the remembered value older, never younger than a window and a tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.stages.leadtime import remember_node_waits, remember_startups
from policies.stages.reactive import learn_service_time
from policies.stages.shedding import protected_share
from policies.types import Clean, ForecastState, PolicyState, Tick


def _protected(spec: PolicySpec, rates: Mapping[str, float]) -> float | None:
    """The share of arrivals in the classes that are never shed, only when measured per class."""
    return protected_share(spec, rates) if sum(rates.values()) > 0 else None


def remembered_ticks(spec: PolicySpec) -> int:
    """How many learned service times `recent_service_s` keeps: a rate window's ticks and one more (at
    least two: without a window the rate is a tick's)."""
    window_s = max(spec.rate_window_s or spec.tick_s, spec.tick_s)
    return math.ceil(window_s / spec.tick_s - 1e-9) + 1


def service_time(
    spec: PolicySpec, state: PolicyState, clean: Clean, fs: ForecastState, now: float
) -> tuple[float | None, list[str]]:
    """The service time learned by this tick and a reason line when a silence sets it back (see the module
    docstring); `fs` is the forecaster after this tick's rate."""
    since = fc.silence_since(spec, fs, now)
    if since is None:
        return learn_service_time(spec, state.service_time_s, clean), []
    if since != now:  # the silence goes on: nothing learned
        return state.service_time_s, []
    before = state.recent_service_s[0] if state.recent_service_s else state.service_time_s
    if before is None:
        return None, []
    folded = learn_service_time(spec, state.service_time_s, clean)
    read = f"{folded:.2f} s with this tick's reading" if folded is not None else "none read"
    return before, [f"learn: traffic stopped: service time {before:.2f} s as learned before it ({read}); what "
                    "completes until traffic is back is the drain, the longest requests last: not learned"]


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Service time, forecaster, start-ups and node waits updated; no demand signal: hold."""
    clean, state = tick.clean, tick.state
    assert clean is not None
    forecast = fc.observe(spec, state.forecast, clean.arrival_rate_per_s, tick.now,
                          _protected(spec, clean.arrival_rate_by_priority), fit=tick.fit)
    service_s, why = service_time(spec, state, clean, forecast, tick.now)
    recent = state.recent_service_s
    if service_s is not None:
        recent = (recent + (service_s,))[-remembered_ticks(spec):]
    state = state.changed(
        service_time_s=service_s,
        recent_service_s=recent,
        forecast=forecast,
        startup_samples_s=remember_startups(spec, state.startup_samples_s, clean),
        node_wait_samples_s=remember_node_waits(spec, state.node_wait_samples_s, clean),
    )
    hold = None
    if clean.arrival_rate_per_s is None and clean.in_flight is None:
        hold = "no demand signal (arrival rate and in-flight both unusable)"
    return tick.then(why, state=state, service_s=service_s or spec.initial_service_time_s, hold=hold)
