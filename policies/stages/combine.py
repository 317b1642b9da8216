"""Stage 8, combine: max(reactive, predictive), where reactive need above the forecast must be sustained.

A burst shorter than the cold-start window is over before a replica ordered for it could serve, so it is
queued or shed, not provisioned: the reactive figure only counts at the level it has held for the
confirmation window (the minimum over it): `burst_confirm_s`, by default the pod start-up time (a
replica ordered for a burst that ends sooner would arrive after it). Demand that climbs steadily (see
`forecast.climb`) is not a burst: there the reactive figure counts at once.
E.g. start-up 120 s, 15-s ticks: a 60-s spike to twice the load never holds for 120 s, so it is queued
and shed; a five-minute ramp is a climb and is followed tick by tick."""

from __future__ import annotations

from dataclasses import replace

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
    now: float,
) -> tuple[int | None, list[str]]:
    held = [r for t, r in recent if now - t < window_s] or ([reactive] if reactive is not None else [])
    sustained = min(held) if reactive is not None else None
    if sustained is None and predictive is None:
        return None, []
    if predictive is None:
        return sustained, []
    if sustained is None or predictive >= sustained:
        return predictive, [f"combine: forecast needs {predictive}"]
    reasons = [f"combine: current load needs {sustained}"]
    if reactive is not None and reactive > sustained:
        reasons.append(f"combine: burst to {reactive} not yet sustained {window_s:.0f} s; queue/shed")
    return sustained, reasons


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """The replicas wanted, and the reactive figure remembered; neither figure: hold."""
    window = confirm_window_s(spec, tick.startup_s, climbing=tick.rising is not None)
    recent = remember_reactive(tick.state.reactive_recent, tick.reactive, tick.now,
                               keep_s=max(window, tick.startup_s, spec.tick_s))
    wanted, why = combine(reactive=tick.reactive, recent=recent, predictive=tick.predictive, window_s=window,
                          now=tick.now)
    if wanted is None:
        return tick.then(hold="nothing to size on")
    return tick.then(why, replicas=wanted, state=replace(tick.state, reactive_recent=recent))
