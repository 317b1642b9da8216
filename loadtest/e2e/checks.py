"""What each closed-loop scenario must show, checked on what the client, the apiserver and the controllers
recorded (a `CheckContext`). Each check is {"check", "passed", "detail"}; times are scenario times at factor
1, and the windows a check reads are its scenario's (`loadtest.scenarios.Scenario.windows`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Mapping

from loadtest.e2e.figures import within_slo
from loadtest.measure import TOP_TARGET, targets

if TYPE_CHECKING:
    from autoscaler.sim.run import RunResult
    from loadtest.e2e.config import E2EConfig

SIM_CRITICAL_POINTS, SIM_GPU_PERCENT = 0.5, 10.0


@dataclass(frozen=True)
class CheckContext:
    """What one closed-loop run recorded, as the checks read it."""

    doc: dict  # the run's figures (result.json): live, simulated, their gaps, the actions taken
    timeline: list[dict]  # the sampler's rows, `t_s` in scenario seconds at factor 1
    events: list[dict]  # Kubernetes Events
    records: list[dict]  # one per request, as the client saw it
    logs: Mapping[str, str]  # each controller process's log
    fleet_events: list[dict]  # the fake fleet's (pods drained, ...)
    config: E2EConfig
    sim: RunResult  # the simulated twin
    windows: Mapping[str, tuple[float, float]]  # the scenario's check windows, in minutes

    def window_s(self, name: str) -> tuple[float, float]:
        lo, hi = self.windows[name]
        return lo * 60.0, hi * 60.0

    @property
    def sheddable(self) -> tuple[str, ...]:
        spec = self.config.spec()
        return tuple(c for c in spec.classes if spec.priorities[c] < spec.shed_priority_below)


def _check(name: str, passed: bool, detail: str) -> dict:
    return {"check": name, "passed": bool(passed), "detail": detail}


def none(context: CheckContext) -> list[dict]:
    return []


def _window(records: list[dict], cls: str, window_s: tuple[float, float]) -> list[dict]:
    lo, hi = window_s
    return [r for r in records if r["class"] == cls and lo <= r["sent_s"] < hi]


def _shed(rows: list[dict]) -> float:
    return sum(1 for r in rows if r["status"] == 429) / len(rows) if rows else 0.0


def _decided(timeline: list[dict], window_s: tuple[float, float]) -> list[float]:
    lo, hi = window_s
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


def common(context: CheckContext, *, twin: bool = True) -> list[dict]:
    """No request lost; with `twin`, the simulated twin's prediction (a scenario the simulator does not
    model, such as a warm slot pooled outside the policy, has its twin printed but not checked)."""
    doc = context.doc
    gap = doc["sim_gap"]
    critical_gap = gap["slo_attainment_points"].get("critical")
    lost = _check("no admitted request lost", doc["lost_requests"] == 0, f"{doc['lost_requests']} lost")
    if not twin:
        return [lost]
    return [
        lost,
        _check("simulator predicts critical attainment within 0.5 points",
               critical_gap is not None and abs(critical_gap) <= SIM_CRITICAL_POINTS, f"gap {critical_gap} points"),
        _check("simulator predicts GPU-hours within 10 %",
               "gpu_hours_percent" in gap and abs(gap["gpu_hours_percent"]) <= SIM_GPU_PERCENT,
               f"live {doc['gpu_hours']} vs simulated {doc['simulated']['gpu_hours']} GPU-h "
               f"({gap.get('gpu_hours_percent')} %)"),
    ]


def _targets(context: CheckContext) -> list[dict]:
    """The benchmark's class targets (`measure.targets`) on the live attainment."""
    a = context.doc["slo_attainment"]
    return [_check(f"{c} >= {100 * t:g} % within the SLO", a.get(c, 0) >= t,
                   f"{a.get(c, 0):{'.4%' if t == TOP_TARGET else '.3%'}}")
            for c, t in targets(context.config.spec().classes, context.sheddable).items()]


def _no_piling_on(context: CheckContext) -> dict:
    sim = context.sim.timeline
    needed = int(max(sim, key=lambda r: r["replicas"])["replicas"]) if sim else 0
    peak = max(_decided(context.timeline, (0, 1e12)), default=0)
    return _check("no piling on: never more replicas decided than the simulated policy's peak + 25 %",
                  peak <= 1.25 * needed + 1, f"peak decided {peak:.0f}, simulated peak {needed}")


def _minutes(context: CheckContext, name: str) -> str:
    lo, hi = context.windows[name]
    return f"minutes {lo:g}-{hi:g}"


def doubling(context: CheckContext) -> list[dict]:
    records, timeline = context.records, context.timeline
    ramp = _window(records, "sheddable", context.window_s("ramp"))
    settled = _window(records, "sheddable", context.window_s("settled"))
    preempted = [e for e in context.events if e.get("reason") == "Preempted"
                 and "warm-pool" in e["involvedObject"]["name"]]
    first_preempt = min((r["t_s"] for r in timeline if r["warm"]["ready"] > 0), default=None)
    after, _ = context.window_s("refilled")
    refilled = any(r["warm"]["ready"] > 0 for r in timeline if r["t_s"] > after)
    return _targets(context) + [
        _check("sheddable traffic shed while capacity is on its way", _shed(ramp) > 0,
               f"{_shed(ramp):.2%} of sheddable shed in {_minutes(context, 'ramp')}"),
        _check("sheddable admitted again once capacity is Ready", _shed(settled) < 0.01,
               f"{_shed(settled):.2%} shed in {_minutes(context, 'settled')}"),
        _check("placeholders preempted by the scheduler and re-created", bool(preempted) and refilled,
               f"{len(preempted)} placeholder pods preempted; warm slots ready again after minute "
               f"{after / 60:g}: {refilled} (first warm slot ready at {first_preempt})"),
        _no_piling_on(context),
    ]


def short_burst(context: CheckContext) -> list[dict]:
    before = max(_decided(context.timeline, context.window_s("before")), default=0)
    after = max(_decided(context.timeline, context.window_s("after")), default=0)
    return _targets(context) + [
        _check("replicas do not chase a burst shorter than the start-up", after <= before + 1,
               f"most decided in {_minutes(context, 'before')} (before the burst) {before:.0f}, "
               f"in {_minutes(context, 'after')} {after:.0f}"),
    ]


def diurnal_down(context: CheckContext) -> list[dict]:
    doc, timeline = context.doc, context.timeline
    start = max(_decided(timeline, context.window_s("start")), default=0)
    end = min(_decided(timeline, context.window_s("end")), default=start)
    drained = sum(1 for e in context.fleet_events if e.get("event") == "drained" and e.get("in_flight", 0) > 0)
    return _targets(context) + [
        _check("replicas follow demand down", end < start, f"decided {start:.0f} at the start, {end:.0f} at the end"),
        _check("removed pods drain their requests", doc["lost_requests"] == 0,
               f"{drained} pods removed while serving, all their requests answered"),
    ]


def no_capacity(context: CheckContext) -> list[dict]:
    timeline, records = context.timeline, context.records
    capped_lo, capped_hi = context.window_s("capped")
    limited = [r for r in timeline if capped_lo <= r["t_s"] < capped_hi]
    pending = max((r["model"]["pending"] for r in limited), default=0)
    seen = max((r["unschedulable"] or 0 for r in limited), default=0)
    decisions = [d for log in context.logs.values() for d in _decisions(log)]
    said = any(any("capacity" in reason and "cannot" in reason for reason in d.get("reasons", [])) for d in decisions)
    ours = [e for e in context.events if e.get("reportingComponent") == "inference-autoscaler"
            and e.get("reason") == "CapacityUnavailable"]
    shed = _shed(_window(records, "sheddable", context.window_s("capped")))
    recovered = [r for r in timeline if r["t_s"] >= context.window_s("recovered")[0]]
    late = _window(records, "critical", context.window_s("recovered"))
    late_ok = sum(1 for r in late if r["status"] == 200 and r["queue_s"] <= context.config.slo_s) / max(1, len(late))
    return [
        _check("pods stay Pending at the GPU limit", pending > 0, f"up to {pending} model pods Pending"),
        _check("the controller sees them (metric)", seen > 0, f"autoscaler_unschedulable_replicas up to {seen:.0f}"),
        _check("...says so in its reasons and Events", said and bool(ours),
               f"reason in decisions: {said}; CapacityUnavailable events: {len(ours)}"),
        _check("sheds instead of waiting", shed > 0, f"{shed:.2%} of sheddable shed while capped"),
        _check("recovers when the limit is raised",
               bool(recovered) and all(r["model"]["pending"] == 0 for r in recovered[-5:]) and late_ok >= TOP_TARGET,
               f"critical {late_ok:.3%} within the SLO in {_minutes(context, 'recovered')}; pending at the end "
               f"{recovered[-1]['model']['pending'] if recovered else '?'}"),
    ]


def controller_restart(context: CheckContext) -> list[dict]:
    doc, timeline = context.doc, context.timeline
    leaders = [r["leader"] for r in timeline if r["leader"]]
    changed = len(set(leaders)) > 1
    lo, hi = context.window_s("around")
    around = [r["spec_replicas"] for r in timeline if lo <= r["t_s"] <= hi and r["spec_replicas"]]
    no_drop = all(b >= a for a, b in zip(around, around[1:]))
    restarted = next((a["result"].split()[0] for a in doc["actions"] if a["action"] == "restart-killed"), None)
    first_after = None
    if restarted and restarted in context.logs:
        # the restarted process appends to the same log: its lines after the last "started"
        lines = context.logs[restarted].splitlines()
        starts = [i for i, line in enumerate(lines) if '"event": "started"' in line]
        if len(starts) > 1:
            fresh = [d for d in _decisions("\n".join(lines[starts[-1]:])) if d.get("valid")]
            first_after = fresh[0].get("lead_time_s") if fresh else None
    config = context.config
    default_lead = (config.startup_s + config.node_provisioning_s) / config.factor
    return _targets(context) + [
        _check("the other replica on the Lease takes over", changed, f"leaders seen: {sorted(set(leaders))}"),
        _check("no scale-down across the kill and restart", no_drop,
               f"spec replicas in {_minutes(context, 'around')}: {around}"),
        _check("the restarted controller gets its start-up times back from the cluster",
               first_after is not None and abs(first_after - default_lead) > 1e-6,
               f"its first lead time {first_after} s (compressed) vs the untrained default {default_lead} s"),
    ]


# Scale to zero. A cold start is the wait for a node (as the live cluster showed it: Karpenter's real-time
# batching makes it longer than configured) and a pod start-up, plus this much for the controller to see the
# replica Ready and release the held requests (a tick every second of wall clock while requests are held,
# 10 s at factor 10) and for the fleet to put its server behind the gateway.
WAKE_MARGIN_S = 60.0


def _answers(records: list[dict]) -> dict:
    """Each request's outcome: answered (200), shed (429), deliberately dropped (503 with Retry-After), or
    failed by accident (anything else: no answer, any other 5xx, a 503 without Retry-After)."""
    out = {"answered": 0, "shed": 0, "dropped with Retry-After": 0, "failed": 0}
    for r in records:
        if r["status"] == 200:
            out["answered"] += 1
        elif r["status"] == 429:
            out["shed"] += 1
        elif r["status"] == 503 and r.get("retry_after") is not None:
            out["dropped with Retry-After"] += 1
        else:
            out["failed"] += 1
    return out


def _to_zero(context: CheckContext) -> list[dict]:
    """Every request answered or deliberately refused; the model at zero and its node gone before the burst
    (the pooled warm slots' nodes stay); 0 -> N replicas after it."""
    doc, timeline = context.doc, context.timeline
    answers = _answers(context.records)
    lo, hi = context.window_s("silence")
    silence = [r for r in timeline if lo <= r["t_s"] < hi]
    kept = context.config.pooled_warm_slots
    gone = [r for r in silence if r["spec_replicas"] == 0 and r["model"]["ready"] == 0 and r["nodes"] <= kept]
    last = silence[-1] if silence else None
    n = doc.get("replicas_after_wake")
    return [
        _check("every request answered, shed, or dropped with Retry-After (no accidental failure)",
               answers["failed"] == 0 and answers["answered"] > 0, ", ".join(f"{v} {k}" for k, v in answers.items())),
        _check(f"at zero with its node gone ({kept} pooled warm node(s) kept) before the burst",
               bool(gone) and last is not None and last in gone,
               (f"first at zero with {kept} node(s) at minute {gone[0]['t_s'] / 60:.1f}; " if gone else "never; ")
               + (f"at the burst: {last['spec_replicas']} replicas, {last['nodes']} nodes" if last else "no sample")),
        _check("replicas go 0 -> N after the silence", doc.get("min_replicas_seen") == 0 and bool(n),
               f"min replicas seen {doc.get('min_replicas_seen')}, most ordered after the silence {n}"),
    ]


def _cold_start(context: CheckContext, *, node_s: float) -> dict:
    """The first request after the silence admitted within one cold start: a node's wait (`node_s`, 0 on a
    warm slot), a pod start-up, and the margin; not before the fastest pod start-up."""
    config = context.config
    fastest = config.startup_s * (1 - config.startup_jitter_ratio / 2)
    bound = node_s + config.startup_s * (1 + config.startup_jitter_ratio) + WAKE_MARGIN_S
    took = context.doc.get("cold_start_s")
    return _check(f"first request admitted after one cold start ({fastest:.0f}-{bound:.0f} s)",
                  took is not None and fastest <= took <= bound,
                  f"{took} s from the first request after the silence (first answer after "
                  f"{context.doc.get('first_answer_s')} s); held {context.doc.get('held_requests')}, hold p99 "
                  f"{context.doc.get('hold_p99_s')} s, dropped {context.doc.get('dropped_held')}")


def scale_to_zero(context: CheckContext) -> list[dict]:
    timings = context.doc.get("simulated", {}).get("node_timings") or {}
    node_s = max(context.config.node_provisioning_s, timings.get("provisioning_p90_s") or 0.0)
    return _to_zero(context) + [_cold_start(context, node_s=node_s)]


def scale_to_zero_warm(context: CheckContext) -> list[dict]:
    return _to_zero(context) + [_cold_start(context, node_s=0.0)]


MAX_WAKE_S = 1.0  # wall clock: KEDA mode scales a model at zero within this of a held request (issue 26)


def scale_to_zero_keda(context: CheckContext) -> list[dict]:
    """`scale_to_zero`, and the wake pushed through StreamIsActive within `MAX_WAKE_S` of wall clock
    (`wake_to_scale_s`, `loadtest.e2e.kedamode.wake_figures`)."""
    took, replicas = context.doc.get("wake_to_scale_s"), context.doc.get("replicas_at_first_held")
    return scale_to_zero(context) + [_check(
        f"a held request scales the Deployment from 0 within {MAX_WAKE_S:g} s of wall clock (StreamIsActive)",
        took is not None and took <= MAX_WAKE_S,
        f"{took} s from the first held request to spec.replicas > 0 ({replicas} replicas when it was sent)")]


# --- Recovery after a silence (`silence`) ------------------------------------------------------------------
# The policy's rule (policies/stages/forecast.py, "Silence"): through the outage hold the forecast holds;
# after it, the capacity for the rate the classes that are never shed sent before the silence is kept, and
# the reasons say "silence: keeping capacity for the R req/s". Traffic back after it is the interrupted level
# returning, and until the replicas ordered for it are Ready (at most a start-up plus a node's provisioning)
# the guarded classes are rejected at a queue of 1 (stage shedding).
KEPT_REASON = "silence: keeping capacity for the "
GUARD_REASON = "traffic back after a silence, its capacity on the way"


def _met(rows: list[dict], slo_s: float) -> float:
    """The share of `rows` answered within the SLO (queue wait plus any hold at the gateway)."""
    return sum(1 for r in rows if within_slo(r, slo_s)) / len(rows) if rows else 0.0


def _scenario_s(decision: dict, *, started_at: float, factor: float) -> float:
    """A decision's scenario time at factor 1, from its log line's wall-clock timestamp."""
    wall = datetime.fromisoformat(decision["timestamp"].replace("Z", "+00:00")).timestamp()
    return (wall - started_at) * factor


def _timed_decisions(context: CheckContext) -> list[tuple[float, dict]]:
    """The leader's decisions with their scenario times, in time order."""
    started_at, factor = context.doc["started_at"], context.config.factor
    return sorted(((_scenario_s(d, started_at=started_at, factor=factor), d)
                   for log in context.logs.values() for d in _decisions(log) if d.get("leader", True)),
                  key=lambda pair: pair[0])


def _kept_rate(reasons: list[str], *, factor: float) -> float | None:
    """R of the reason "silence: keeping capacity for the R req/s ..." if the decision gives it, at factor 1
    (the controller runs compressed: its rates are `factor` x those of the scenario)."""
    for reason in reasons:
        at = reason.find(KEPT_REASON)
        if at >= 0:
            return float(reason[at + len(KEPT_REASON):].split()[0]) / factor
    return None


def _service_s(records: list[dict]) -> float:
    """The median time an answered request held a slot (its latency less its queue wait)."""
    times = sorted(r["latency_s"] - r["queue_s"] for r in records
                   if r["status"] == 200 and r.get("latency_s") is not None and r["queue_s"] is not None)
    return times[len(times) // 2] if times else 0.0


def _kept_through_silence(context: CheckContext) -> list[dict]:
    """Replicas through the silence (after the tick that sees it begin) never below the slots the kept rate
    keeps busy (R x service time / slots per replica: a fleet with fewer cannot serve R at all), and the
    reasons keep that rate after the outage hold."""
    config = context.config
    lo, hi = context.window_s("silence")
    hold_end = lo + config.spec().outage_hold_s
    decisions = _timed_decisions(context)
    kept = [rate for t, d in decisions if hold_end <= t < hi
            if (rate := _kept_rate(d.get("reasons", []), factor=config.factor)) is not None]
    service_s = _service_s(context.records)
    floor = math.ceil(min(kept) * service_s / config.concurrency) if kept else None
    decided = _decided(context.timeline, (lo + config.tick_s + config.rate_window_s, hi))
    least = min(decided, default=None)
    return [
        _check("after the outage hold, the reasons keep capacity for the classes that are never shed", bool(kept),
               f"{len(kept)} decisions from minute {hold_end / 60:g} to the return keep "
               f"{min(kept, default=0):.2f}-{max(kept, default=0):.2f} req/s (at factor 1)"),
        _check("replicas through the silence never below what the kept rate needs",
               floor is not None and least is not None and least >= max(floor, config.spec().min_replicas + 1),
               f"least decided {least} in {_minutes(context, 'silence')}; the kept rate needs at least {floor} "
               f"({min(kept, default=0):.2f} req/s x {service_s:.1f} s / {config.concurrency} slots); "
               f"floor {config.spec().min_replicas}"),
    ]


GUARDED_CHECK = "the lower classes guarded hard after the return until its replicas are Ready, at most one lead time"
_WAITING_FOR = re.compile(r"\(\d+ of (\d+) replicas Ready\)")


def _waited_for(decision: dict) -> int | None:
    """The replicas a guarded decision waited for: N of its guard reason's "(R of N replicas Ready)"."""
    found = (_WAITING_FOR.search(reason) for reason in decision.get("reasons", []) if GUARD_REASON in reason)
    return next((int(m.group(1)) for m in found if m), None)


def _ready_at(timeline: list[dict], replicas: int, since_s: float) -> float | None:
    """The first sample from `since_s` on with at least `replicas` of the model's replicas Ready."""
    return next((r["t_s"] for r in timeline if r["t_s"] >= since_s and r["model"]["ready"] >= replicas), None)


def _guarded_after_return(context: CheckContext) -> dict:
    """The guarded classes rejected at a queue of 1 from the return (within a rate window, a scrape and two
    ticks of it, the time the windowed rate takes to show it) while its capacity comes, and not after: the
    guard ends when the replicas its last decision waited for are Ready (the timeline's, to within two
    ticks), or else after at most a start-up plus a node's provisioning, the lead time of a tick with no
    free slot as at this scenario's return (within the lead times of the decisions, to within two ticks)."""
    config = context.config
    back, _ = context.window_s("return")
    after = [(t, d) for t, d in _timed_decisions(context) if t >= back]
    marked = [any(GUARD_REASON in reason for reason in d.get("reasons", [])) for _, d in after]
    guarded = [pair for pair, on in zip(after, marked) if on]
    if not guarded:
        return _check(GUARDED_CHECK, False, "no decision after the return guards them at a queue of 1")
    first, last = guarded[0][0], guarded[-1][0]
    # a slot freed meanwhile shortens the ticks' lead times, not the guard: the span lies within the leads of
    # the guarded decisions and of the one that ended it, unless the replicas it waited for came sooner
    ending = after[len(marked) - marked[::-1].index(True):][:1]
    leads = [(d.get("lead_time_s") or 0.0) * config.factor for _, d in guarded + ending]
    slack_s = 2 * config.tick_s
    waited = _waited_for(guarded[-1][1])
    ready_s = _ready_at(context.timeline, waited, first) if waited is not None else None
    rows = [r for r in context.records if first <= r["sent_s"] <= last + config.tick_s]
    rejected = {c: sum(1 for r in rows if r["class"] == c and r["status"] == 429) for c in config.spec().classes}
    in_time = first <= back + config.rate_window_s + config.scrape_s + slack_s
    on_ready = ready_s is not None and ready_s - slack_s <= last <= ready_s + slack_s
    lasted = (on_ready or min(leads) - slack_s <= last - first) and last - first <= max(leads) + slack_s
    lead = f"{min(leads):.0f}" if min(leads) == max(leads) else f"{min(leads):.0f}-{max(leads):.0f}"
    if waited is None:
        ready = "its reasons name no replicas it waited for"
    elif ready_s is None:
        ready = f"the {waited} replicas it waited for never Ready"
    else:
        ready = f"the {waited} replicas it waited for Ready {ready_s - back:.0f} s after the return"
    return _check(GUARDED_CHECK, in_time and lasted,
                  f"{len(guarded)} decisions guard them at a queue of 1, from {first - back:.0f} s after the "
                  f"return for {last - first:.0f} s (lead time {lead} s; {ready}); rejected meanwhile: {rejected}")


def _return_holds(context: CheckContext) -> dict:
    """Critical and standard at their targets among the requests sent from the return on."""
    window = context.window_s("return")
    got = {c: _met(_window(context.records, c, window), context.config.slo_s)
           for c in targets(context.config.spec().classes, context.sheddable)}
    want = targets(context.config.spec().classes, context.sheddable)
    return _check("from the return on, every class that is never shed at its target",
                  all(got[c] >= t for c, t in want.items()),
                  ", ".join(f"{c} {got[c]:.3%} (target {t:.1%})" for c, t in want.items())
                  + f" in {_minutes(context, 'return')}")


def silence(context: CheckContext) -> list[dict]:
    """The capacity the silence interrupted kept by the policy's rule, the return at the targets with the
    lower classes guarded hard while its capacity comes; the run's targets."""
    return (_targets(context) + _kept_through_silence(context)
            + [_return_holds(context), _guarded_after_return(context)])


# --- A fleet (`fleet`): several models under one fleet controller, one GPU limit --------------------------
# The run's `doc` is `loadtest.e2e.fleetrun`'s: per-model figures under "models", the fleet's under "fleet";
# timeline rows hold "models" (per model: spec_replicas, decided, pods), records carry their "model".

def _tiers(doc: dict) -> tuple[str, str]:
    """The top tier's model and the lowest tier's (the one that borrows)."""
    by_tier = sorted(doc["models"], key=lambda k: doc["models"][k]["tier"])
    return by_tier[0], by_tier[-1]


def _spec_replicas(timeline: list[dict], key: str, window_s: tuple[float, float]) -> list[int]:
    lo, hi = window_s
    return [r["models"][key]["spec_replicas"] for r in timeline
            if lo <= r["t_s"] < hi and r["models"][key]["spec_replicas"] is not None]


def _fleet_lost(context: CheckContext) -> dict:
    lost = {k: m["lost_requests"] for k, m in context.doc["models"].items()}
    return _check("no request lost", sum(lost.values()) == 0, f"lost per model {lost}")


def _borrowed_then_reclaimed(context: CheckContext) -> list[dict]:
    doc, timeline = context.doc, context.timeline
    _, low = _tiers(doc)
    start = doc["initial_replicas"][low]
    borrowed = _spec_replicas(timeline, low, context.window_s("borrowed"))
    reclaimed = _spec_replicas(timeline, low, context.window_s("reclaimed"))
    peak = max(borrowed, default=0)
    # drained once the top tier's traffic grows (before: the replicas it gave up on its own)
    lo, hi = context.window_s("doubled")[0], context.window_s("reclaimed")[1]
    drained = sum(1 for t in doc.get("drained_s", {}).get(low, []) if lo <= t < hi)
    return [
        _check(f"the lowest tier ({low}) borrows", peak > start,
               f"{low}: {start} replicas at the start, up to {peak} in {_minutes(context, 'borrowed')}"),
        _check(f"the lowest tier ({low}) is reclaimed, drained, nothing lost",
               bool(reclaimed) and min(reclaimed) < peak and drained > 0 and doc["models"][low]["lost_requests"] == 0,
               f"{low}: down to {min(reclaimed, default=None)} in {_minutes(context, 'reclaimed')} "
               f"(from {peak}); {drained} replicas drained from minute {lo / 60:g}; "
               f"{doc['models'][low]['lost_requests']} requests lost"),
    ]


def _top_holds(context: CheckContext) -> dict:
    top, _ = _tiers(context.doc)
    lo, hi = context.window_s("doubled")
    rows = [r for r in context.records if r.get("model") == top and r["class"] == "critical" and lo <= r["sent_s"] < hi]
    whole = context.doc["models"][top]["slo_attainment"].get("critical", 0.0)
    window = _met(rows, context.config.slo_s)
    return _check(f"the top tier's ({top}) critical class holds", whole >= TOP_TARGET and window >= TOP_TARGET,
                  f"{top} critical within SLO {whole:.3%} over the run, {window:.3%} of {len(rows)} in "
                  f"{_minutes(context, 'doubled')} (target {TOP_TARGET:.1%})")


def _within_budget(context: CheckContext) -> dict:
    limit = context.doc["gpu_limit"]
    sums = [sum(m["decided"] for m in r["models"].values() if m["decided"] is not None) for r in context.timeline]
    return _check("the fleet's decisions stay within the GPU limit", max(sums, default=0) <= limit,
                  f"the models' decided replicas together: at most {max(sums, default=0)} (limit {limit})")


def _pooled_first(context: CheckContext) -> dict:
    taken = context.doc.get("pooled_taken", [])
    first = context.doc.get("first_needing_pool", {})
    taker = taken[0]["model"] if taken else None
    return _check("a pooled placeholder goes to the model that needed it first",
                  taker is not None and taker in first.get("models", []),
                  f"{len(taken)} pooled placeholders taken by a model's replica, the first by {taker} at "
                  f"{taken[0]['t_s'] if taken else None} s; the models whose replicas, created in the first second "
                  f"a Ready slot was alive and too few GPUs were free outside the pool, needed it: "
                  f"{first.get('models')} at {first.get('t_s')} s")


def _fleet_twin(context: CheckContext) -> list[dict]:
    doc = context.doc
    gaps = {k: m["sim_gap"]["slo_attainment_points"].get("critical") for k, m in doc["models"].items()}
    gpu = doc["fleet"].get("sim_gap_gpu_hours_percent")
    return [
        _check(f"twin: every model's critical within {SIM_CRITICAL_POINTS} points",
               all(g is not None and abs(g) <= SIM_CRITICAL_POINTS for g in gaps.values()),
               f"live minus simulated, points: {gaps}"),
        _check(f"twin: fleet GPU-hours within {SIM_GPU_PERCENT:g} %", gpu is not None and abs(gpu) <= SIM_GPU_PERCENT,
               f"live {doc['fleet']['gpu_hours']} GPU-h, simulated {doc['fleet']['simulated']['gpu_hours']} "
               f"({gpu:+.1f} %)" if gpu is not None else "no simulated GPU-hours"),
    ]


def fleet(context: CheckContext) -> list[dict]:
    """The lowest tier borrows then is reclaimed (drained, nothing lost), the top tier's critical class holds,
    the fleet stays within its limit, the pooled slot goes to the first model to need it; the twin's figures."""
    return ([_fleet_lost(context)] + _borrowed_then_reclaimed(context) + [_top_holds(context), _within_budget(context),
            _pooled_first(context)] + _fleet_twin(context))


def _fleet_served(context: CheckContext) -> dict:
    served = {k: m["requests"] - m["lost_requests"] for k, m in context.doc["models"].items()}
    return _check("every model is served through the gateway", all(v > 0 for v in served.values()),
                  f"requests answered per model {served}")


def fleet_smoke(context: CheckContext) -> list[dict]:
    """The harness on its own: every model served, nothing lost, the decisions within the limit."""
    return [_fleet_served(context), _fleet_lost(context), _within_budget(context)]
