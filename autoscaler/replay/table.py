"""The decision table `autoscaler replay` prints: the ticks where something changed, each with one reason.

A row of the timeline (`autoscaler.timeline.timeline_row`) carries every reason the policy gave, joined by
" | ", one per stage. A person wants the one that explains the change, so each kind of change picks its
stage: a scale-up or scale-down the demand estimate that drove it (the `combine` stage names which:
forecast or current load) and the bound that limited it; warm slots the `warm pool` stage; shedding the
`shedding` stage; a held tick its `hold:` reason, as "held (reason)". Same columns for open-loop and
simulated rows, so the table reads the same in both modes.

The summary's shed figure is the share of each sheddable class's requests, as the benchmark reports it:
simulated runs take it from the simulator's outcome; open loop has no outcome, so it weights each tick's
decided fraction by the recorded arrival rate (the class's share of traffic taken as constant) and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

REASON_SEPARATOR = " | "
MAX_REASON_CHARS = 160


@dataclass(frozen=True)
class Change:
    t_s: float
    replicas: int
    previous: int | None
    ready: object
    warm_slots: int
    shedding: str
    what: str
    reason: str


def _reasons(row: dict) -> list[str]:
    return [r for r in str(row.get("reasons", "")).split(REASON_SEPARATOR) if r]


def _stage(reasons: list[str], prefix: str) -> str | None:
    return next((r for r in reasons if r.startswith(prefix)), None)


def _valid(row: dict) -> bool:
    return row.get("valid") not in (False, "False", "false", 0)


def _shed(row: dict) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if key.startswith("shed_") and value not in ("", None) and float(value) > 0:
            out[key.removeprefix("shed_")] = float(value)
    return out


def _shedding_text(row: dict) -> str:
    shed = _shed(row)
    return ", ".join(f"{name} {fraction:.0%}" for name, fraction in shed.items()) or "-"


def _demand_reason(reasons: list[str]) -> str:
    """What drove the replica count: the forecast or the current load, and any bound applied to it."""
    combine = _stage(reasons, "combine:") or ""
    source = "predictive:" if "forecast" in combine else "reactive:"
    parts = [_stage(reasons, source) or combine]
    parts += [r for r in reasons if r.startswith(("bounds:", "capped by quota", "capacity:", "slo feedback:"))]
    return "; ".join(p for p in parts if p)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def what_changed(row: dict, before: dict | None) -> list[tuple[str, str]]:
    """(what, reason) for each change at this row against the one before (the first row: the start)."""
    reasons = _reasons(row)
    if not _valid(row):
        hold = _stage(reasons, "hold:") or (reasons[0] if reasons else "no reason given")
        if before is None or _valid(before):
            return [(f"held ({hold.removeprefix('hold: ')})", hold)]
        return []
    if before is None:
        return [("start", _demand_reason(reasons))]
    out = []
    if not _valid(before):
        out.append(("resumed", _demand_reason(reasons)))
    replicas, previous = int(row["replicas"]), int(before["replicas"])
    if replicas != previous:
        out.append(("scale up" if replicas > previous else "scale down", _demand_reason(reasons)))
    if int(row.get("warm_slots") or 0) != int(before.get("warm_slots") or 0):
        out.append(("warm slots", _stage(reasons, "warm pool:") or "warm pool: no slots needed"))
    shed_now, shed_before = _shed(row), _shed(before)
    if bool(shed_now) != bool(shed_before):
        reason = "; ".join(r for r in reasons if r.startswith("shedding:")) or "shedding: ready capacity meets demand"
        out.append(("shedding on" if shed_now else "shedding off", reason))
    return out


def changes(rows: list[dict], *, every_tick: bool = False) -> list[Change]:
    """The rows where something changed (or, `every_tick`, every row), each with its one-line reason."""
    out: list[Change] = []
    before: dict | None = None
    for row in rows:
        found = what_changed(row, before)
        if every_tick and not found:
            reasons = _reasons(row)
            found = [("held" if not _valid(row) else "-", _demand_reason(reasons) if _valid(row) else
                      (_stage(reasons, "hold:") or ""))]
        if found:
            what = ", ".join(w for w, _ in found)
            reason = "; ".join(dict.fromkeys(r for _, r in found if r))
            out.append(Change(float(row["t_s"]), int(row["replicas"]),
                              int(before["replicas"]) if before is not None else None, row.get("ready", ""),
                              int(row.get("warm_slots") or 0), _shedding_text(row), what, _clip(reason)))
        before = row
    return out


def clock(seconds: float) -> str:
    """Time from the start as h:mm:ss."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_table(found: list[Change], *, start_s: float) -> str:
    head = f"{'time':>8}  {'replicas':>9}  {'ready':>5}  {'warm':>4}  {'shedding':<16}  {'what':<22}  reason"
    lines = [head, "-" * len(head)]
    for c in found:
        changed = c.previous is not None and c.previous != c.replicas
        replicas = f"{c.previous}->{c.replicas}" if changed else str(c.replicas)
        ready = "" if c.ready in ("", None) else str(c.ready)
        lines.append(f"{clock(c.t_s - start_s):>8}  {replicas:>9}  {ready:>5}  {c.warm_slots:>4}  {c.shedding:<16}  "
                     f"{c.what:<22}  {c.reason}")
    return "\n".join(lines)


def open_loop_shed(rows: list[dict], classes: tuple[str, ...]) -> dict[str, float]:
    """Per class, the decided shed fraction weighted by the recorded arrival rate (0 where no rate)."""
    total = sum(float(r["arrival_rate_per_s"]) for r in rows if r.get("arrival_rate_per_s") not in ("", None))
    out = {}
    for name in classes:
        shed = sum(float(r["arrival_rate_per_s"]) * float(r.get(f"shed_{name}") or 0.0)
                   for r in rows if r.get("arrival_rate_per_s") not in ("", None))
        out[name] = shed / total if total > 0 else 0.0
    return out


def summary(rows: list[dict], *, tick_s: float, sheddable: tuple[str, ...], shed_by_class: dict[str, float],
            shed_basis: str) -> str:
    """Counts of each kind of change, replica-hours decided (and recorded), and the shed share per class."""
    found = changes(rows)
    count = {kind: sum(1 for c in found if kind in c.what.split(", ") or c.what.startswith(kind))
             for kind in ("scale up", "scale down", "warm slots", "shedding on", "held")}
    held = sum(1 for r in rows if not _valid(r))
    valid = [int(r["replicas"]) for r in rows if _valid(r)]
    lines = [f"{len(rows)} ticks of {tick_s:g} s ({len(rows) * tick_s / 3600:.2f} h): {count['scale up']} scale-ups, "
             f"{count['scale down']} scale-downs, {count['warm slots']} warm-slot changes, "
             f"{count['shedding on']} shedding episodes, {held} ticks held ({count['held']} times)"]
    if valid:
        hours = sum(int(r["replicas"]) for r in rows) * tick_s / 3600
        text = f"replicas decided: {min(valid)} to {max(valid)}, {hours:.1f} replica-hours"
        recorded = [r.get("recorded_replicas") for r in rows if r.get("recorded_replicas") not in ("", None)]
        if len(recorded) == len(rows):
            ran = sum(int(float(v)) for v in recorded) * tick_s / 3600
            text += (f" (recorded: {ran:.1f} replica-hours, {min(map(float, recorded)):.0f} to "
                     f"{max(map(float, recorded)):.0f} replicas)")
        lines.append(text)
    for name in sheddable:
        lines.append(f"shed: {shed_by_class.get(name, 0.0):.2%} of {name} requests ({shed_basis})")
    return "\n".join(lines)
