"""Stage 5: max(reactive, predictive), where reactive need above the forecast must be sustained.

A burst shorter than the cold-start window is over before a replica ordered for it could serve, so it is
queued or shed, not provisioned: the reactive figure only counts at the level it has held for
`burst_confirm_s` (the minimum over that window)."""

from __future__ import annotations

from policies.spec import PolicySpec


def remember_reactive(
    spec: PolicySpec, recent: tuple[tuple[float, int], ...], reactive: int | None, now: float
) -> tuple[tuple[float, int], ...]:
    kept = tuple(e for e in recent if now - e[0] < spec.burst_confirm_s)
    return kept + ((now, reactive),) if reactive is not None else kept


def combine(
    spec: PolicySpec, *, reactive: int | None, recent: tuple[tuple[float, int], ...], predictive: int | None
) -> tuple[int | None, list[str]]:
    sustained = min((r for _, r in recent), default=reactive) if reactive is not None else None
    if sustained is None and predictive is None:
        return None, []
    if predictive is None:
        return sustained, []
    if sustained is None or predictive >= sustained:
        return predictive, [f"combine: forecast needs {predictive}"]
    reasons = [f"combine: current load needs {sustained}"]
    if reactive is not None and reactive > sustained:
        reasons.append(f"combine: burst to {reactive} not yet sustained {spec.burst_confirm_s:.0f} s; queue/shed")
    return sustained, reasons
