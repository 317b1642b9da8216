"""Run one closed-loop scenario (`loadtest.scenarios`): the stack, the load, the actions the scenario takes,
the figures and the simulator's prediction of them, and the scenario's checks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from autoscaler.kube.cluster import provisioner_cannot
from autoscaler.sim.run import initial_replicas, needed_replicas
from loadtest import scenarios
from loadtest.e2e import checks
from loadtest.e2e.checks import CheckContext
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.fleetrun import run_fleet_scenario
from loadtest.e2e.figures import annotate_holds, client_figures, gaps, gpu_hours, holds, node_timings, wake
from loadtest.e2e.kedamode import wake_figures
from loadtest.e2e.stack import Stack, stack
from loadtest.e2e.twin import requests_of, simulate, twin
from loadtest.loadgen import write_requests

SAMPLE_EVERY_S = 0.5  # wall clock


def _act(st: Stack, action: str, state: dict) -> str:
    if action in ("lower-gpu-limit", "raise-gpu-limit"):
        gpus = state["limits"][action]
        st.karpenter.set_gpu_limit(gpus)
        return f"NodePool GPU limit set to {gpus}"
    if action == "kill-leader":
        leader = st.leader()
        if leader is None:
            return "no leader to kill"
        leader.kill()
        state["killed"] = leader
        return f"{leader.name} killed (SIGKILL)"
    if action == "restart-killed":
        killed = state.get("killed")
        if killed is None:
            return "nothing to restart"
        killed.start(st.cp.kubeconfig)
        return f"{killed.name} restarted"
    raise ValueError(f"unknown action {action!r}")


def run_scenario(name: str, *, factor: float = 10.0, out: Path) -> dict:
    scenario = scenarios.SCENARIOS[name]
    if scenario.models:  # a fleet of models under one fleet controller
        return run_fleet_scenario(name, factor=factor, out=out)
    config = replace(E2EConfig(factor=factor), **scenario.config)
    actions = [(minute * 60.0, action) for minute, action in scenario.actions]
    workload, requests = requests_of(name, config)
    sim_config = config.sim_config()
    needed = needed_replicas(workload, sim_config)
    initial = initial_replicas(needed, sim_config)
    timeline, notes, state = [], [], {}
    gpu_limits: tuple[tuple[float, int], ...] = ()
    if scenario.limit_steady_at_min is not None:
        config = replace(config, gpu_limit=initial + 1)
        steady = simulate(config, workload, initial, config.sim_config())
        at = scenario.limit_steady_at_min * 60.0
        lowered = int(next(r["replicas"] for r in steady.timeline if r["t_s"] >= at)) + 1
        state["limits"] = {"lower-gpu-limit": lowered, "raise-gpu-limit": 4 * config.gpu_limit}
        gpu_limits = tuple((t, state["limits"][a]) for t, a in actions if a in state["limits"])
    out.mkdir(parents=True, exist_ok=True)
    write_requests(out / "requests.jsonl", requests)
    with stack(config, out / "work", initial_replicas=initial, controllers=scenario.controllers) as st:
        start_at = time.time() + 2.0
        st.started = start_at
        loadgen = subprocess.Popen(
            [sys.executable, "-m", "loadtest.loadgen", "--requests", str(out / "requests.jsonl"), "--url",
             st.gateway_url, "--factor", str(factor), "--out", str(out / "records.jsonl"), "--start-at",
             str(start_at), *config.loadgen_args()], stdout=(out / "loadgen.log").open("w"), stderr=subprocess.STDOUT)
        pending = list(actions)
        try:
            while loadgen.poll() is None:
                if time.time() >= start_at:
                    timeline.append(st.sample())
                    while pending and st.t() >= pending[0][0]:
                        _, action = pending.pop(0)
                        notes.append({"t_s": round(st.t(), 1), "action": action, "result": _act(st, action, state)})
                time.sleep(SAMPLE_EVERY_S)
        finally:
            if loadgen.poll() is None:
                loadgen.kill()
        end = start_at + workload.span_s / factor
        timeline.append(st.sample())
        events = st.events()
        lifetimes = dict(st.lifetimes)
        replica_changes = list(st.keda.watch.changes) if st.keda else None
        logs = {c.name: c.log.read_text() for c in st.controllers}
        endpoint_holds = sum(v for c in st.controllers for k, v in c.metrics().items()
                             if k.startswith("autoscaler_admission_hold_seconds_count"))
    fleet_file = out / "work" / "fleet.jsonl"
    fleet_events = ([json.loads(x) for x in fleet_file.read_text().splitlines() if x.strip()]
                    if fleet_file.exists() else [])
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    annotate_holds(records, {r.i: r for r in requests}, server=config.server, factor=factor,
                   holding=config.holding)
    live = client_figures(records, workload.classes, config.slo_s)
    cost = gpu_hours(lifetimes, start=start_at, end=end, factor=factor)
    live["gpu_hours"] = cost["nodes"]
    live["gpu_hours_by_use"] = cost
    live["max_pending_replicas"] = max((r["model"]["pending"] + r["model"]["starting"] for r in timeline), default=0)
    # The twin runs on the node timings the live cluster showed (Karpenter's real-time batching and
    # consolidation checks are not compressed), so the comparison is of the policy and the fleet.
    capped = frozenset(e["involvedObject"]["name"] for e in events if e.get("involvedObject", {}).get("kind") == "Pod"
                       and provisioner_cannot(e.get("reason"), (e.get("source") or {}).get("component")
                                              or e.get("reportingComponent") or ""))
    timing = node_timings(lifetimes, factor=factor, idle_s=config.node_idle_s, capped=capped, start=start_at)
    sim, simulated = twin(config, workload, initial, timing, gpu_limits=gpu_limits)
    doc = {
        "scenario": name, "factor": factor, "started_at": start_at, "initial_replicas": initial,
        "requests": live["requests"],
        "slo_attainment": live["slo_attainment"], "p99_latency_s": live["p99_latency_s"],
        "p99_queue_wait_s": live["p99_queue_wait_s"], "shed_fraction": live["shed_fraction"],
        "gpu_hours": live["gpu_hours"], "gpu_hours_by_use": live["gpu_hours_by_use"],
        "lost_requests": live["lost_requests"], "late_sends": live["late_sends"],
        "max_pending_replicas": live["max_pending_replicas"], "simulated": simulated,
        "sim_gap": gaps(live, simulated), "actions": notes,
        **holds(records), "held_requests_endpoint": endpoint_holds,
    }
    if "burst" in scenario.windows:  # scale to zero: the burst after the silence wakes the model
        doc.update(wake(records, timeline, after_s=scenario.windows["burst"][0] * 60.0))
        if replica_changes is not None:  # KEDA mode: the wake pushed through StreamIsActive, on the wall clock
            doc.update(wake_figures(records, replica_changes, start_at=start_at, factor=factor,
                                    after_s=scenario.windows["burst"][0] * 60.0))
    context = CheckContext(doc=doc, timeline=timeline, events=events, records=records, logs=logs,
                           fleet_events=fleet_events, config=config, sim=sim, windows=scenario.windows)
    doc["checks"] = scenario.check(context) + checks.common(context, twin=scenario.twin_checked)
    doc["passed"] = all(c["passed"] for c in doc["checks"])
    (out / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timeline))
    (out / "lifetimes.jsonl").write_text("".join(json.dumps({"kind": kind, "uid": uid, **life}) + "\n"
                                                 for (kind, uid), life in lifetimes.items()))
    (out / "result.json").write_text(json.dumps(doc, indent=2))
    from loadtest.e2e.report import plot

    plot(out / f"{name}.png", context)
    return doc
