"""What each closed-loop scenario must show, checked on what the client, the apiserver and the controllers
recorded. Each check is {"check", "passed", "detail"}; times are scenario times at factor 1."""

from __future__ import annotations

import json

from autoscaler.sim.workload import CLASSES
from loadtest.measure import TOP_TARGET, targets

SIM_CRITICAL_POINTS, SIM_GPU_PERCENT = 0.5, 10.0


def _check(name: str, passed: bool, detail: str) -> dict:
    return {"check": name, "passed": bool(passed), "detail": detail}


def none(context: dict) -> list[dict]:
    return []


def _window(records: list[dict], cls: str, lo: float, hi: float) -> list[dict]:
    return [r for r in records if r["class"] == cls and lo <= r["sent_s"] < hi]


def _shed(rows: list[dict]) -> float:
    return sum(1 for r in rows if r["status"] == 429) / len(rows) if rows else 0.0


def _decided(timeline: list[dict], lo: float, hi: float) -> list[float]:
    return [r["decided"] for r in timeline if lo <= r["t_s"] < hi and r["decided"] is not None]


def _decisions(log: str) -> list[dict]:
    out = []
    for line in log.splitlines():
        if '"event": "decision"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def common(context: dict) -> list[dict]:
    doc = context["doc"]
    gap = doc["sim_gap"]
    critical_gap = gap["slo_attainment_points"].get("critical")
    return [
        _check("no admitted request lost", doc["lost_requests"] == 0, f"{doc['lost_requests']} lost"),
        _check("simulator predicts critical attainment within 0.5 points",
               critical_gap is not None and abs(critical_gap) <= SIM_CRITICAL_POINTS, f"gap {critical_gap} points"),
        _check("simulator predicts GPU-hours within 10 %",
               "gpu_hours_percent" in gap and abs(gap["gpu_hours_percent"]) <= SIM_GPU_PERCENT,
               f"live {doc['gpu_hours']} vs simulated {doc['simulated']['gpu_hours']} GPU-h "
               f"({gap.get('gpu_hours_percent')} %)"),
    ]


def _targets(doc: dict) -> list[dict]:
    """The benchmark's class targets (`measure.targets`) on the live attainment."""
    a = doc["slo_attainment"]
    return [_check(f"{c} >= {100 * t:g} % within the SLO", a.get(c, 0) >= t,
                   f"{a.get(c, 0):{'.4%' if t == TOP_TARGET else '.3%'}}")
            for c, t in targets(CLASSES, ("sheddable",)).items()]


def _no_piling_on(context: dict) -> dict:
    needed = int(max(context["sim"].timeline, key=lambda r: r["replicas"])["replicas"]) if context["sim"].timeline else 0
    peak = max(_decided(context["timeline"], 0, 1e12), default=0)
    return _check("no piling on: never more replicas decided than the simulated policy's peak + 25 %",
                  peak <= 1.25 * needed + 1, f"peak decided {peak:.0f}, simulated peak {needed}")


def doubling(context: dict) -> list[dict]:
    doc, records, timeline = context["doc"], context["records"], context["timeline"]
    ramp = _window(records, "sheddable", 20 * 60, 35 * 60)
    settled = _window(records, "sheddable", 50 * 60, 60 * 60)
    preempted = [e for e in context["events"] if e.get("reason") == "Preempted"
                 and "warm-pool" in e["involvedObject"]["name"]]
    first_preempt = min((r["t_s"] for r in timeline if r["warm"]["ready"] > 0), default=None)
    refilled = any(r["warm"]["ready"] > 0 for r in timeline if r["t_s"] > 27 * 60)
    return _targets(doc) + [
        _check("sheddable traffic shed while capacity is on its way", _shed(ramp) > 0,
               f"{_shed(ramp):.2%} of sheddable shed in minutes 20-35"),
        _check("sheddable admitted again once capacity is Ready", _shed(settled) < 0.01,
               f"{_shed(settled):.2%} shed in minutes 50-60"),
        _check("placeholders preempted by the scheduler and re-created", bool(preempted) and refilled,
               f"{len(preempted)} placeholder pods preempted; warm slots ready again after minute 27: {refilled}"
               f" (first warm slot ready at {first_preempt})"),
        _no_piling_on(context),
    ]


def short_burst(context: dict) -> list[dict]:
    doc, timeline = context["doc"], context["timeline"]
    before = max(_decided(timeline, 14 * 60, 20 * 60), default=0)
    after = max(_decided(timeline, 20 * 60, 30 * 60), default=0)
    return _targets(doc) + [
        _check("replicas do not chase a burst shorter than the start-up", after <= before + 1,
               f"most decided 6 min before the burst {before:.0f}, in the 10 min from it {after:.0f}"),
    ]


def diurnal_down(context: dict) -> list[dict]:
    doc, timeline = context["doc"], context["timeline"]
    start = max(_decided(timeline, 0, 15 * 60), default=0)
    end = min(_decided(timeline, 80 * 60, 90 * 60), default=start)
    drained = 0
    fleet = context.get("fleet_events", [])
    for e in fleet:
        if e.get("event") == "drained" and e.get("in_flight", 0) > 0:
            drained += 1
    return _targets(doc) + [
        _check("replicas follow demand down", end < start, f"decided {start:.0f} at the start, {end:.0f} at the end"),
        _check("removed pods drain their requests", doc["lost_requests"] == 0,
               f"{drained} pods removed while serving, all their requests answered"),
    ]


def no_capacity(context: dict) -> list[dict]:
    doc, timeline, records = context["doc"], context["timeline"], context["records"]
    limited = [r for r in timeline if 30 * 60 <= r["t_s"] < 45 * 60]
    pending = max((r["model"]["pending"] for r in limited), default=0)
    seen = max((r["unschedulable"] or 0 for r in limited), default=0)
    decisions = [d for log in context["logs"].values() for d in _decisions(log)]
    said = any(any("capacity" in reason and "cannot" in reason for reason in d.get("reasons", [])) for d in decisions)
    ours = [e for e in context["events"] if e.get("reportingComponent") == "inference-autoscaler"
            and e.get("reason") == "CapacityUnavailable"]
    shed = _shed(_window(records, "sheddable", 30 * 60, 45 * 60))
    recovered = [r for r in timeline if r["t_s"] >= 55 * 60]
    late = _window(records, "critical", 55 * 60, 65 * 60)
    late_ok = sum(1 for r in late if r["status"] == 200 and r["queue_s"] <= context["config"].slo_s) / max(1, len(late))
    return [
        _check("pods stay Pending at the GPU limit", pending > 0, f"up to {pending} model pods Pending"),
        _check("the controller sees them (metric)", seen > 0, f"autoscaler_unschedulable_replicas up to {seen:.0f}"),
        _check("...says so in its reasons and Events", said and bool(ours),
               f"reason in decisions: {said}; CapacityUnavailable events: {len(ours)}"),
        _check("sheds instead of waiting", shed > 0, f"{shed:.2%} of sheddable shed while capped"),
        _check("recovers when the limit is raised",
               bool(recovered) and all(r["model"]["pending"] == 0 for r in recovered[-5:]) and late_ok >= TOP_TARGET,
               f"critical {late_ok:.3%} within the SLO in minutes 55-65; pending at the end "
               f"{recovered[-1]['model']['pending'] if recovered else '?'}"),
    ]


def controller_restart(context: dict) -> list[dict]:
    doc, timeline = context["doc"], context["timeline"]
    leaders = [r["leader"] for r in timeline if r["leader"]]
    changed = len(set(leaders)) > 1
    around = [r["spec_replicas"] for r in timeline if 20 * 60 <= r["t_s"] <= 35 * 60 and r["spec_replicas"]]
    no_drop = all(b >= a for a, b in zip(around, around[1:]))
    restarted = next((a["result"].split()[0] for a in doc["actions"] if a["action"] == "restart-killed"), None)
    first_after = None
    if restarted and restarted in context["logs"]:
        # the restarted process appends to the same log: its lines after the last "started"
        lines = context["logs"][restarted].splitlines()
        starts = [i for i, line in enumerate(lines) if '"event": "started"' in line]
        if len(starts) > 1:
            fresh = [d for d in _decisions("\n".join(lines[starts[-1]:])) if d.get("valid")]
            first_after = fresh[0].get("lead_time_s") if fresh else None
    default_lead = (context["config"].startup_s + context["config"].node_start_s) / context["config"].factor
    return _targets(doc) + [
        _check("the other replica on the Lease takes over", changed, f"leaders seen: {sorted(set(leaders))}"),
        _check("no scale-down across the kill and restart", no_drop, f"spec replicas in minutes 20-35: {around}"),
        _check("the restarted controller gets its start-up times back from the cluster",
               first_after is not None and abs(first_after - default_lead) > 1e-6,
               f"its first lead time {first_after} s (compressed) vs the untrained default {default_lead} s"),
    ]
