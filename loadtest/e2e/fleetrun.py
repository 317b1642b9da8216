"""Run one closed-loop fleet scenario (`loadtest.scenarios.Scenario.models`): the fleet stack
(`loadtest.e2e.fleetstack`), one load generator per model sending that model's requests through the one
gateway, per-model and fleet figures, the simulated twin (`loadtest.e2e.fleettwin`), and the checks.

result.json: `started_unix_s` (the wall clock of scenario second 0) and `factor`; `models` (per model: tier,
requests, `slo_attainment` and `shed_fraction` by class, lost requests, `gpu_hours` of its pods, the replicas
seen, its twin's figures); `fleet` (requests, lost, GPU-hours of the nodes and by use, the most GPUs held, the
twin's GPU-hours); `drained_s` (when each model's replicas drained); `pooled_taken` (which model's replica took
a pooled placeholder, when); `first_needing_pool` (the models of the first creation second whose replicas,
while a pooled slot was Ready, found too few free GPUs outside the pool); `sim_gap` and the checks.
lifetimes.jsonl: every pod's, node's and claim's lifetime; events.jsonl: the models' and the pool's
namespaces' Events (both wall clock; `loadtest.e2e.fleettrace` reads them back).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from autoscaler.kube.cluster import provisioner_cannot
from autoscaler.times import parse_time
from loadtest import scenarios
from loadtest.e2e import fleettwin
from loadtest.e2e.checks import CheckContext
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.figures import client_figures, gpu_hours, node_timings
from loadtest.e2e.fleetstack import POOL_NAMESPACE, FleetStack, fleet_stack
from loadtest.loadgen import write_requests

SAMPLE_EVERY_S = 0.5  # wall clock
CREATED_RESOLUTION_S = 1.0  # wall clock: a creationTimestamp is whole seconds


def loadgen_command(config: E2EConfig, model, out: Path, *, url: str, start_at: float) -> list[str]:
    """The command line of the model's load generator (`python -m loadtest.loadgen`), the config's load
    generator arguments (the priority in the body) included."""
    ns = model.namespace
    return [sys.executable, "-m", "loadtest.loadgen", "--requests", str(out / f"requests-{ns}.jsonl"), "--url", url,
            "--factor", str(config.factor), "--out", str(out / f"records-{ns}.jsonl"), "--start-at", str(start_at),
            "--model", model.key, *config.loadgen_args()]


def _loadgen(st: FleetStack, model, out: Path, *, start_at: float) -> subprocess.Popen:
    return subprocess.Popen(loadgen_command(st.config, model, out, url=st.gateway_url, start_at=start_at),
                            stdout=(out / f"loadgen-{model.namespace}.log").open("w"), stderr=subprocess.STDOUT)


def _read_jsonl(path: Path, **tag) -> list[dict]:
    """One dict per line (each with `tag`'s fields added); [] when the file is not there."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [{**json.loads(x), **tag} for x in lines if x.strip()]


def _replicas_seen(timeline: list[dict], key: str) -> dict:
    spec = [r["models"][key]["spec_replicas"] for r in timeline if r["models"][key]["spec_replicas"] is not None]
    ready = [r["models"][key]["pods"]["ready"] for r in timeline]
    return {"min": min(spec, default=None), "max": max(spec, default=None), "ready_max": max(ready, default=0)}


def preemptions(events: list[dict], lifetimes: dict, models, *, started: float, factor: float) -> list[dict]:
    """Pooled placeholders preempted, in order: when (scenario seconds) and for which model's replica (the
    event's `related` pod, the preemptor; else the pod UID its message names)."""
    by_uid = {uid: life.get("namespace") for (kind, uid), life in lifetimes.items() if kind == "model"}
    by_namespace = {m.namespace: m.key for m in models}
    out = []
    for e in events:
        involved = e.get("involvedObject", {})
        if e.get("reason") != "Preempted" or involved.get("namespace") != POOL_NAMESPACE:
            continue
        namespace = (e.get("related") or {}).get("namespace")
        if namespace is None:
            words = (e.get("message") or "").split()
            namespace = next((by_uid[w] for w in words if w in by_uid), None)
        stamp = e.get("eventTime") or e.get("firstTimestamp") or e.get("lastTimestamp")
        out.append({"t_s": round((parse_time(stamp) - started) * factor, 1) if stamp else None,
                    "model": by_namespace.get(namespace), "placeholder": involved.get("name"),
                    "message": e.get("message")})
    return sorted(out, key=lambda p: (p["t_s"] is None, p["t_s"] or 0.0))


def _alive(life: dict, since: str, at: float) -> bool:
    return life.get(since) is not None and life[since] <= at and (life["gone"] is None or life["gone"] > at)


def _holds(kind: str, pod: dict, at: float) -> bool:
    """The pod holds its node's GPUs at `at`: placed, and not yet vanished (a draining pod holds them through
    its grace period, after its deletion was seen; a run without `vanished` falls back to `gone`). A Ready
    placeholder holds them a creationTimestamp's resolution longer: withdrawn in the tick a model grows, it goes
    a moment before that model's replica is created, for that replica."""
    until = pod.get("vanished") or pod["gone"]
    if until is not None and kind == "placeholder" and pod.get("ready") is not None:
        until += CREATED_RESOLUTION_S
    return pod.get("placed") is not None and pod["placed"] <= at and (until is None or until > at)


def _free_gpus(lifetimes: dict, at: float) -> int:
    """GPUs of the nodes up and schedulable at `at` (not yet disrupted: Karpenter taints a node it removes) that
    no pod (a model's replica or a placeholder) holds, less those the model replicas created before `at` and not
    yet placed will take (the scheduler gives a pending pod free room before it preempts a placeholder). The
    replicas created in the second `at` itself are the ones the room is for: one placed in that same second
    (times are whole seconds) does not hold it yet (run 25)."""
    nodes = {life["name"]: life["gpus"] for (kind, _), life in lifetimes.items()
             if kind == "node" and _alive(life, "created", at)
             and (life.get("disrupted") is None or life["disrupted"] > at)}
    held = sum(life["gpus"] for (kind, _), life in lifetimes.items()
               if kind in ("model", "placeholder") and life.get("node") in nodes and _holds(kind, life, at)
               and not (kind == "model" and life["created"] >= at))
    waiting = sum(life["gpus"] for (kind, _), life in lifetimes.items()
                  if kind == "model" and life["created"] < at and (life["gone"] is None or life["gone"] > at)
                  and (life.get("placed") is None or life["placed"] > at))
    return sum(nodes.values()) - held - waiting


def _second_needs_pool(lifetimes: dict, at: float) -> bool:
    """The model replicas created in the (whole) second `at` do not all fit in the free GPUs, the pooled
    placeholders' held: one of them needed a pooled slot. A creationTimestamp does not order replicas within its
    second (a fleet tick creates several), so each counts the others as waiting: the verdict is the same in any
    order."""
    created = sum(life["gpus"] for (kind, _), life in lifetimes.items()
                  if kind == "model" and life["created"] == at and (life["gone"] is None or life["gone"] > at))
    return _free_gpus(lifetimes, at) < created


def _slot_ready(lifetimes: dict, at: float) -> bool:
    """A pooled placeholder was Ready in the second `at` and still held its GPUs (`_holds`)."""
    return any(kind == "placeholder" and life["ready"] is not None and life["ready"] < at + CREATED_RESOLUTION_S
               and _holds(kind, life, at) for (kind, _), life in lifetimes.items())


def handovers(lifetimes: dict, models, *, started: float, factor: float) -> list[dict]:
    """Pooled placeholders whose node a model's replica took as they went (the pool shrinks in the tick a model
    grows into it, or the scheduler preempts one for a pending replica): per placeholder, the next pod placed on
    its node, if that is a model's replica created by the time the placeholder went whose creation second found
    too few free GPUs outside the pool (`first_needing_pool`'s test). A node the placeholder left to a refill
    placeholder (run 19), that sat free until a later replica came (run 20: 52 s), or that the scheduler chose
    while free room was left elsewhere (a placeholder only scaled down) was not handed to a model."""
    by_namespace = {m.namespace: m.key for m in models}
    pods = sorted((life["placed"], kind, life.get("namespace"), life["node"], uid, life.get("created"))
                  for (kind, uid), life in lifetimes.items() if kind in ("model", "placeholder") and life.get("node"))
    out = []
    for (kind, uid), slot in lifetimes.items():
        if kind != "placeholder" or not slot.get("node") or slot["gone"] is None or slot["ready"] is None:
            continue
        # the pod may be placed a moment before the sampler saw the placeholder go (a preemption)
        taker = next(((at, k, ns, created) for at, k, ns, node, other, created in pods
                      if node == slot["node"] and at >= slot["ready"] and other != uid), None)
        if taker is not None and taker[1] == "model" and taker[3] <= slot["gone"] + CREATED_RESOLUTION_S \
                and _second_needs_pool(lifetimes, taker[3]):
            out.append({"t_s": round((taker[0] - started) * factor, 1), "model": by_namespace.get(taker[2]),
                        "placeholder": slot["name"]})
    return sorted(out, key=lambda p: p["t_s"])


def pooled_taken(events: list[dict], lifetimes: dict, models, *, started: float, factor: float) -> list[dict]:
    """Every pooled placeholder a model took, in time order: preempted (its Event) or released to it (its node)."""
    preempted = preemptions(events, lifetimes, models, started=started, factor=factor)
    names = {p["placeholder"] for p in preempted}
    taken = preempted + [h for h in handovers(lifetimes, models, started=started, factor=factor)
                         if h["placeholder"] not in names]
    return sorted(taken, key=lambda p: (p["t_s"] is None, p["t_s"] or 0.0))


def first_needing_pool(lifetimes: dict, models, *, started: float, factor: float) -> dict:
    """The models that needed a pooled slot first: the first creation second in which a Ready placeholder was
    alive and that second's model replicas found too few free GPUs outside the pool (`_second_needs_pool`); every
    model with a replica created in that second, as their order within it is unknown. A replica that finds free
    room lands there and takes no placeholder (run 19: chat's first replica after the pool was Ready went to the
    node its own drain had just freed)."""
    by_namespace = {m.namespace: m.key for m in models}
    seconds = sorted({life["created"] for (kind, _), life in lifetimes.items() if kind == "model"})
    for at in seconds:
        if _slot_ready(lifetimes, at) and _second_needs_pool(lifetimes, at):
            names = {by_namespace[life["namespace"]] for (kind, _), life in lifetimes.items()
                     if kind == "model" and life["created"] == at}
            return {"models": [m.key for m in models if m.key in names], "t_s": round((at - started) * factor, 1)}
    return {}


def _model_figures(m, records: list[dict], classes, st_lifetimes: dict, timeline: list[dict], *, config: E2EConfig,
                   start: float, end: float, twin: dict) -> dict:
    live = client_figures(records, classes, config.slo_s)
    mine = {k: v for k, v in st_lifetimes.items() if k[0] == "model" and v.get("namespace") == m.namespace}
    sim = twin["models"][m.key]
    return {
        "tier": m.tier, "weight": m.weight, "requests": live["requests"], "slo_attainment": live["slo_attainment"],
        "shed_fraction": live["shed_fraction"], "p99_latency_s": live["p99_latency_s"],
        "lost_requests": live["lost_requests"], "late_sends": live["late_sends"],
        "gpu_hours": gpu_hours(mine, start=start, end=end, factor=config.factor)["model"],
        "replicas_seen": _replicas_seen(timeline, m.key),
        "simulated": {"slo_attainment": sim["slo_attainment"], "shed_fraction": sim["shed_by_class"],
                      "gpu_hours": sim["gpu_hours"], "peak_gpus": sim["peak_gpus"]},
        "sim_gap": {"slo_attainment_points": {
            c: round(100 * (v - sim["slo_attainment"][c]), 3) for c, v in live["slo_attainment"].items()
            if c in sim["slo_attainment"]}},
    }


def _sample_until_done(st: FleetStack, loadgens: list[subprocess.Popen], start_at: float) -> list[dict]:
    timeline = []
    try:
        while any(p.poll() is None for p in loadgens):
            if time.time() >= start_at:
                timeline.append(st.sample())
            time.sleep(SAMPLE_EVERY_S)
    finally:
        for p in loadgens:
            if p.poll() is None:
                p.kill()
    timeline.append(st.sample())
    return timeline


def run_fleet_scenario(name: str, *, factor: float = 10.0, out: Path) -> dict:
    scenario = scenarios.SCENARIOS[name]
    config = replace(E2EConfig(factor=factor), **scenario.config)
    models = scenario.models
    out.mkdir(parents=True, exist_ok=True)
    workloads = {}
    for i, m in enumerate(models):
        workloads[m.key], requests = fleettwin.requests_of(m, config, seed=i)
        write_requests(out / f"requests-{m.namespace}.jsonl", requests)
    initial = fleettwin.starts(models, workloads, config)
    span_s = max(w.span_s for w in workloads.values())
    with fleet_stack(config, models, out / "work", initial=initial) as st:
        start_at = time.time() + 2.0
        st.started = start_at
        loadgens = [_loadgen(st, m, out, start_at=start_at) for m in models]
        timeline = _sample_until_done(st, loadgens, start_at)
        events = st.events()
        lifetimes = dict(st.lifetimes)
        logs = {c.name: c.log.read_text() for c in st.controllers}
    end = start_at + span_s / factor
    capped = frozenset(e["involvedObject"]["name"] for e in events if e.get("involvedObject", {}).get("kind") == "Pod"
                       and provisioner_cannot(e.get("reason"), (e.get("source") or {}).get("component")
                                              or e.get("reportingComponent") or ""))
    timing = node_timings(lifetimes, factor=factor, idle_s=config.node_idle_s, capped=capped)
    twin = fleettwin.simulate(models, workloads, config, starts=initial, node_provisioning_s=timing["provisioning_s"],
                              node_learned_s=timing["provisioning_p90_s"],
                              node_idle_extra_s=timing["removal_extra_s"] or 0.0)
    records = {m.key: _read_jsonl(out / f"records-{m.namespace}.jsonl", model=m.key) for m in models}
    fleet_events = {m.key: _read_jsonl(out / "work" / f"fleet-{m.namespace}.jsonl") for m in models}
    per_model = {m.key: _model_figures(m, records[m.key], workloads[m.key].classes, lifetimes, timeline,
                                       config=config, start=start_at, end=end, twin=twin) for m in models}
    cost = gpu_hours(lifetimes, start=start_at, end=end, factor=factor)
    doc = {
        # the wall clock of scenario second 0: lifetimes.jsonl and events.jsonl are wall clock, t_s = (wall -
        # started_unix_s) * factor
        "scenario": name, "factor": factor, "started_unix_s": start_at, "gpu_limit": config.gpu_limit,
        "initial_replicas": initial,
        "models": per_model,
        "fleet": {"requests": sum(x["requests"] for x in per_model.values()),
                  "lost_requests": sum(x["lost_requests"] for x in per_model.values()),
                  "gpu_hours": cost["nodes"], "gpu_hours_by_use": cost,
                  "max_nodes": max((r["nodes"] for r in timeline), default=0),
                  "simulated": {"gpu_hours": twin["gpu_hours"], "peak_gpus": twin["peak_gpus"],
                                "priority_inversions": twin["priority_inversions"], "node_timings": timing}},
        "pooled_taken": pooled_taken(events, lifetimes, models, started=start_at, factor=factor),
        "first_needing_pool": first_needing_pool(lifetimes, models, started=start_at, factor=factor),
        # when each model's replicas drained (scenario seconds), within the run: not the tear-down's
        "drained_s": {k: [round((e["t"] - start_at) * factor, 1) for e in v if e.get("event") == "drained"
                          and start_at <= e["t"] <= end] for k, v in fleet_events.items()},
    }
    if twin["gpu_hours"]:
        doc["fleet"]["sim_gap_gpu_hours_percent"] = round(100 * (cost["nodes"] / twin["gpu_hours"] - 1), 2)
    context = CheckContext(doc=doc, timeline=timeline, events=events, records=[r for x in records.values() for r in x],
                           logs=logs, fleet_events=[e for x in fleet_events.values() for e in x], config=config,
                           sim=twin, windows=scenario.windows)
    doc["checks"] = scenario.check(context)
    doc["passed"] = all(c["passed"] for c in doc["checks"])
    write_outputs(out, doc=doc, timeline=timeline, lifetimes=lifetimes, events=events)
    return doc


def write_outputs(out: Path, *, doc: dict, timeline: list[dict], lifetimes: dict, events: list[dict]) -> None:
    """result.json, timeline.jsonl, and every pod's, node's and claim's lifetime and the namespaces' Events (wall
    clock), so the pooled attribution can be traced afterwards (`python -m loadtest.e2e.fleettrace`)."""
    (out / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timeline))
    (out / "lifetimes.jsonl").write_text("".join(json.dumps({"kind": kind, "uid": uid, **life}) + "\n"
                                                 for (kind, uid), life in lifetimes.items()))
    (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (out / "result.json").write_text(json.dumps(doc, indent=2))
