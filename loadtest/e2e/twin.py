"""The simulated twin of a single-model closed-loop scenario, and its re-run on a finished run's folder.

The twin is the predictive policy in the request-level simulator on the scenario's own requests, policy and
cluster, on the node timings the live cluster showed (`figures.node_timings`, kept in result.json as
`simulated.node_timings`): so a finished run's twin can be recomputed from its folder alone, e.g. after a
change to the simulator, without running the scenario again:

    python -m loadtest.e2e.twin DIR [DIR ...]

prints, per folder, the live figures and the recorded twin's against the recomputed twin's (critical
attainment and GPU-hours); `--json` prints them as one document. The folder is only read. The recomputed
twin runs the scenario's configuration as it is now (a run made before a change to it is recomputed with the
change). What-ifs on the same requests and node timings: `--dispatch least-conn` serves a queue per replica
(nginx's least_conn), `--policy-set FIELD=VALUE` (repeatable) changes a policy field, e.g.

    python -m loadtest.e2e.twin DIR --dispatch least-conn --policy-set gateway_queues=per-replica

`--from-lifetimes` replays the wait and start-up series derived again from the folder's `lifetimes.jsonl`
(kept from 6c8440d) with the harness's code as it is now, e.g. a run recorded before node waits carried
their pod's start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from autoscaler.errors import ConfigError
from autoscaler.sim.cluster import timed_pair
from autoscaler.sim.dispatch import DISPATCHES, Dispatch
from autoscaler.sim.run import PolicyRun, RunResult, initial_replicas, needed_replicas, run
from autoscaler.sim.workload import WorkloadConfig, build
from loadtest import scenarios
from loadtest.bench import policy_overrides
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.figures import node_timings, simulated_figures
from loadtest.e2e.fleettrace import read_lifetimes
from loadtest.loadgen import Request
from policies import decide, initial_state


def requests_of(name: str, config: E2EConfig):
    """The scenario's workload (for the twin) and its requests (for the load generator)."""
    trace = scenarios.synthetic(scenarios.SCENARIOS[name].trace_name if name in scenarios.SCENARIOS else name)
    workload = build(trace, WorkloadConfig(scale=1.0, server=config.server))
    classes = workload.classes
    requests = [Request(i, float(t), classes[int(p)], int(a), int(b)) for i, (t, p, a, b) in
                enumerate(zip(workload.arrival_s, workload.priority, trace.input_tokens, trace.output_tokens))]
    return workload, requests


def simulate(config: E2EConfig, workload, initial: int, sim_config, *,
             node_learned_s: float | None = None) -> RunResult:
    """The predictive policy in the simulator; `node_learned_s`: the node provisioning the live controller
    learns (the policy's `node_provisioning_s` in the twin, which sees no node waits of its own)."""
    spec = config.spec()
    if node_learned_s is not None:
        spec = spec.model_copy(update={"node_provisioning_s": node_learned_s})
    return run(PolicyRun("predictive", spec, decide, initial_state()), workload, sim_config,
               initial_replicas=initial, keep_timeline=True)


def twin(config: E2EConfig, workload, initial: int, timing: dict, *,
         gpu_limits: tuple[tuple[float, int], ...] = ()) -> tuple[RunResult, dict]:
    """The twin on the live node timings (`timing`: `figures.node_timings`; a None figure is the configured
    one; its `wait_series` and `startup_series`, where the run recorded them, replayed): the run and its
    figures (`simulated` in result.json)."""
    cluster = replace(config, node_provisioning_s=timing["provisioning_s"] or config.node_provisioning_s)

    def series(key: str) -> tuple[tuple[float, ...], ...]:
        values, waits = timing.get(key) or (), key == "wait_series"
        if not isinstance(values, list | tuple) or not all(timed_pair(v, with_startup=waits) for v in values):
            raise ConfigError(f"node_timings.{key}: expected a list of [scenario seconds, seconds >= 0"
                              f"{', start-up s >= 0 if known' if waits else ''}] of finite numbers, "
                              f"got {str(values)[:80]}")
        return tuple(tuple(float(x) for x in v) for v in values)

    sim = simulate(cluster, workload, initial,
                   cluster.sim_config(gpu_limits=gpu_limits, node_idle_extra_s=timing["removal_extra_s"] or 0.0,
                                      node_waits=series("wait_series"), startups=series("startup_series")),
                   node_learned_s=timing["provisioning_p90_s"])
    return sim, {**simulated_figures(sim), "node_timings": timing}


def rerun(folder: Path, *, dispatch: Dispatch | None = None, policy: Mapping[str, Any] | None = None,
          from_lifetimes: bool = False) -> dict:
    """Recompute the twin of the run whose result.json is in `folder` (a single-model scenario without GPU-limit
    actions); the live figures, the recorded twin's and the recomputed twin's. `dispatch`, `policy`: the twin's
    gateway queues and policy fields over the scenario's (what-ifs)."""
    doc = json.loads((folder / "result.json").read_text())
    scenario = scenarios.SCENARIOS[doc["scenario"]]
    if scenario.models or scenario.limit_steady_at_min is not None:
        raise ValueError(f"{doc['scenario']}: only single-model scenarios without GPU-limit actions are re-run")
    config = replace(E2EConfig(factor=doc["factor"]), **scenario.config)
    config = replace(config, dispatch=dispatch or config.dispatch, policy={**config.policy, **(policy or {})})
    workload, _ = requests_of(doc["scenario"], config)
    initial = initial_replicas(needed_replicas(workload, config.sim_config()), config.sim_config())
    if initial != doc["initial_replicas"]:
        raise ValueError(f"{folder}: the run started from {doc['initial_replicas']} replicas, the twin from {initial}")
    timing = doc["simulated"]["node_timings"]
    if from_lifetimes:
        if not (folder / "lifetimes.jsonl").is_file():
            raise ConfigError(f"{folder}: no lifetimes.jsonl (kept by runs from 6c8440d) to derive the series from")
        lifetimes = read_lifetimes(folder / "lifetimes.jsonl")
        derived = node_timings(lifetimes, factor=doc["factor"], idle_s=config.node_idle_s, start=doc["started_at"])
        timing = {**timing, "wait_series": derived["wait_series"], "startup_series": derived["startup_series"]}
    _, simulated = twin(config, workload, initial, timing)
    return {"folder": str(folder), "scenario": doc["scenario"], "live": _pick(doc), "recorded": _pick(doc["simulated"]),
            "recomputed": _pick(simulated), "hold": simulated.get("hold")}


def _pick(figures: dict) -> dict:
    return {"critical": figures["slo_attainment"].get("critical"), "gpu_hours": figures["gpu_hours"]}


def _line(r: dict) -> str:
    live, old, new = r["live"], r["recorded"], r["recomputed"]

    def gap(twin: dict) -> str:
        return (f"critical {twin['critical']:.4%} ({100 * (live['critical'] - twin['critical']):+.3f} points), "
                f"{twin['gpu_hours']:.3f} GPU-h ({100 * (live['gpu_hours'] / twin['gpu_hours'] - 1):+.2f} %)")

    return (f"{r['folder']} ({r['scenario']}): live critical {live['critical']:.4%}, {live['gpu_hours']:.3f} GPU-h\n"
            f"  recorded twin:   {gap(old)}\n  recomputed twin: {gap(new)}"
            + (f"\n  recomputed hold: {r['hold']}" if r.get("hold") else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.e2e.twin", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="a finished run's --out folder of one scenario")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--dispatch", choices=DISPATCHES, default=None,
                   help="the twin's gateway queues (default: the scenario's)")
    p.add_argument("--from-lifetimes", action="store_true",
                   help="derive the wait and start-up series again from the folder's lifetimes.jsonl")
    p.add_argument("--policy-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="one policy field (YAML value) over the scenario's; repeatable")
    args = p.parse_args(argv)
    try:
        policy = policy_overrides(argparse.Namespace(policy_config=None, policy_set=args.policy_set))
        results = [rerun(folder, dispatch=args.dispatch, policy=policy, from_lifetimes=args.from_lifetimes)
                   for folder in args.folders]
    except (ConfigError, ValidationError) as e:
        print(f"python -m loadtest.e2e.twin: {e}", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=2) if args.json else "\n".join(_line(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
