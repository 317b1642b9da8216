"""Stage 8, combine: max(reactive, predictive), where reactive need above the forecast must be sustained.

A burst shorter than the cold-start window is over before a replica ordered for it could serve, so it is
queued or shed, not provisioned: the reactive figure only counts at the level it has held for the
confirmation window (the minimum over it): `burst_confirm_s`, by default the pod start-up time (a
replica ordered for a burst that ends sooner would arrive after it). Demand that climbs steadily (see
`forecast.climb`) is not a burst: there the reactive figure counts at once.
E.g. start-up 120 s, 15-s ticks: a 60-s spike to twice the load never holds for 120 s, so it is queued
and shed; a five-minute ramp is a climb and is followed tick by tick.

Free slots are the exception: what the confirmation saves is the GPUs of replicas ordered for a burst that
ends. Warm and idle slots (placeholders and empty nodes) are GPUs already paid for, and a replica ordered
onto one serves after a pod start-up, with no node to wait for. So the unconfirmed need counts at once up
to the replicas running plus the free slots. The cost of each mistake: a burst that ends leaves those
replicas until the scale-down window lets them go (the warm pool refills its slots meanwhile); a ramp that
holds, confirmed first, is served one confirmation window later, all of it queued or shed (on
`scenario:doubling` with a warm pool, rises read as bursts for 90-120 s while 8 warm slots stood free).
"""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.types import Tick


def confirm_window_s(spec: PolicySpec, startup_s: float, *, climbing: bool) -> float:
    if climbing:
        return 0.0
    return spec.burst_confirm_s if spec.burst_confirm_s is not None else startup_s


def remember_reactive(
    recent: tuple[tuple[float, int], ...], reactive: int | None, now: float, *, keep_s: float
) -> tuple[tuple[float, int], ...]:
    kept = tuple(e for e in recent if now - e[0] < keep_s)
    return kept + ((now, reactive),) if reactive is not None else kept


def combine(
    *, reactive: int | None, recent: tuple[tuple[float, int], ...], predictive: int | None, window_s: float,
    now: float, onto_free: int = 0,
) -> tuple[int | None, list[str]]:
    """`onto_free`: replicas the running ones and the free warm and idle slots hold (0: none free)."""
    held = [r for t, r in recent if now - t < window_s] or ([reactive] if reactive is not None else [])
    sustained = min(held) if reactive is not None else None
    if sustained is None and predictive is None:
        return None, []
    if predictive is None:
        wanted, reasons = sustained, []
    elif sustained is None or predictive >= sustained:
        wanted, reasons = predictive, [f"combine: forecast needs {predictive}"]
    else:
        wanted, reasons = sustained, [f"combine: current load needs {sustained}"]
    if reactive is None or wanted is None or reactive <= wanted:
        return wanted, reasons
    early = min(reactive, onto_free)
    if early > wanted:
        return early, reasons + [
            f"combine: burst to {reactive} not yet sustained {window_s:.0f} s; {early - wanted} replicas ordered "
            f"now onto free warm or idle slots (paid for already: if it ends they wait out the scale-down window; "
            f"if it holds they serve a confirmation window sooner)"]
    return wanted, reasons + [f"combine: burst to {reactive} not yet sustained {window_s:.0f} s; queue/shed"]


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The replicas wanted, and the reactive figure remembered; neither figure: hold."""
    window = confirm_window_s(spec, tick.startup_s, climbing=tick.rising is not None)
    recent = remember_reactive(tick.state.reactive_recent, tick.reactive, tick.now,
                               keep_s=max(window, tick.startup_s, spec.tick_s))
    assert tick.clean is not None and tick.clean.cluster is not None
    cluster = tick.clean.cluster
    wanted, why = combine(reactive=tick.reactive, recent=recent, predictive=tick.predictive, window_s=window,
                          now=tick.now, onto_free=tick.current + cluster.warm_slots_ready + cluster.idle_slots)
    if wanted is None:
        return tick.then(hold="nothing to size on")
    return tick.then(why, replicas=wanted, state=tick.state.changed(reactive_recent=recent))
