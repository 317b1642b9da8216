"""python -m loadtest.e2e --scenario NAME [--factor K] [--json] [--out DIR] [--repeat N]

Runs one closed-loop scenario (or `all`) on loopback: a real control plane with Karpenter, the model
Deployment driven by `autoscaler run`, a fleet of fake vLLM servers behind nginx, Prometheus, and an
open-loop load generator; prints the figures, the simulator's prediction and the scenario's checks, and
writes result.json, the timeline and a PNG into --out. Exit status 1 when a check fails.

`--repeat N` runs the scenario N times one after the other (each into `--out/NAME/run-K`), prints each
run's checks as it ends, then the pass count: a live drill's verdict is a count over runs, not one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loadtest.e2e.run import run_scenario
from loadtest.scenarios import SCENARIOS


def _fleet_summary(doc: dict) -> str:
    """A fleet scenario: per model its tier, attainment by class (the twin's in brackets), shed, GPU-hours of
    its pods and the replicas seen; then the fleet's totals and the checks."""
    f = doc["fleet"]
    lines = [f"scenario {doc['scenario']} at factor {doc['factor']:g}: {f['requests']} requests, {f['lost_requests']} "
             f"lost, {f['gpu_hours']:.2f} GPU-h (simulated {f['simulated']['gpu_hours']:.2f}), at most "
             f"{f['max_nodes']} nodes under a {doc['gpu_limit']}-GPU limit"]
    for key, m in doc["models"].items():
        a, s = m["slo_attainment"], m["simulated"]["slo_attainment"]
        within = ", ".join(f"{c} {a[c]:.3%} ({s.get(c, float('nan')):.3%})" for c in a)
        shed = ", ".join(f"{c} {v:.2%}" for c, v in m["shed_fraction"].items() if v)
        seen = m["replicas_seen"]
        lines.append(f"  {key} (tier {m['tier']}): within SLO {within}; shed {shed or 'none'}; "
                     f"{m['gpu_hours']:.2f} GPU-h of pods; replicas {seen['min']}-{seen['max']}")
    for check in doc["checks"]:
        lines.append(f"  [{'ok' if check['passed'] else 'FAIL'}] {check['check']}: {check['detail']}")
    return "\n".join(lines)


def _summary(doc: dict) -> str:
    if "models" in doc:
        return _fleet_summary(doc)
    a, s = doc["slo_attainment"], doc["simulated"]["slo_attainment"]
    lines = [f"scenario {doc['scenario']} at factor {doc['factor']:g}: {doc['requests']} requests, "
             f"{doc['lost_requests']} lost, {doc['gpu_hours']:.2f} GPU-h "
             f"(simulated {doc['simulated']['gpu_hours']:.2f})"]
    for cls in a:
        lines.append(f"  {cls:<10} within SLO {a[cls]:.4%} (simulated {s.get(cls, float('nan')):.4%}), "
                     f"shed {doc['shed_fraction'][cls]:.2%} "
                     f"(simulated {doc['simulated']['shed_fraction'].get(cls, 0):.2%}), "
                     f"p99 latency {doc['p99_latency_s'][cls] or 0:.2f} s")
    if "cold_start_s" in doc:
        lines.append(_wake_line(doc))
    t = doc["simulated"].get("node_timings")
    if t:
        lines.append(f"  simulated on the live node timings: provisioning {t['provisioning_s']} s median, "
                     f"{t['provisioning_p90_s']} s p90 ({t['waits']} pod waits); removal {t['removal_extra_s']} s "
                     f"after consolidateAfter ({t['removals']} nodes); None = the configured figure"
                     + ("; each wait and start-up replayed where the twin's request meets a live one"
                        if "wait_series" in t else ""))
    for check in doc["checks"]:
        lines.append(f"  [{'ok' if check['passed'] else 'FAIL'}] {check['check']}: {check['detail']}")
    return "\n".join(lines)


def _wake_line(doc: dict) -> str:
    """Scale to zero: the cold start, the holds and the replicas, at factor 1."""
    return (f"  {doc['scenario']}: cold start {doc['cold_start_s']} s (first answer {doc['first_answer_s']} s); "
            f"replicas {doc['min_replicas_seen']} -> {doc['replicas_after_wake']}; held {doc['held_requests']} "
            f"(endpoint: {doc.get('held_requests_endpoint', 0):g}), hold p50 {doc['hold_p50_s']} s, "
            f"p99 {doc['hold_p99_s']} s, dropped {doc['dropped_held']}")


def _pair(live: float, sim: float, fmt: str, width: int) -> str:
    return f"{live:{fmt}} ({sim:{fmt}})".rjust(width)


def table(docs: list[dict]) -> str:
    """One row per scenario: live figures with the simulator's beside them, and the checks passed."""
    head = (f"{'scenario':<19}{'critical (sim)':>20}{'standard (sim)':>20}{'sheddable shed (sim)':>22}"
            f"{'GPU-h (sim)':>16}{'lost':>6}  checks")
    rows = [head, "-" * len(head)]
    for d in (d for d in docs if "models" not in d):  # a fleet's figures are per model: its own summary
        a, sa = d["slo_attainment"], d["simulated"]["slo_attainment"]
        shed, sshed = d["shed_fraction"], d["simulated"]["shed_fraction"]
        passed = sum(c["passed"] for c in d["checks"])
        failed = [c["check"] for c in d["checks"] if not c["passed"]]
        rows.append(
            f"{d['scenario']:<19}"
            + _pair(a.get("critical", 0), sa.get("critical", 0), ".3%", 20)
            + _pair(a.get("standard", 0), sa.get("standard", 0), ".3%", 20)
            + _pair(shed.get("sheddable", 0), sshed.get("sheddable", 0), ".2%", 22)
            + _pair(d["gpu_hours"], d["simulated"]["gpu_hours"], ".1f", 16)
            + f"{d['lost_requests']:>6}  {passed}/{len(d['checks'])}"
            + (f" (failed: {'; '.join(failed)})" if failed else ""))
    rows += [_wake_line(d) for d in docs if "cold_start_s" in d]
    return "\n".join(rows)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return n


def _repeat(name: str, *, factor: float, out: Path, runs: int) -> int:
    """`runs` runs of one scenario in a row; every run counts (none is retried or left out)."""
    passed = []
    for k in range(1, runs + 1):
        try:
            doc = run_scenario(name, factor=factor, out=out / f"run-{k}")
        except Exception as exc:  # a run that breaks (set-up timed out, a server died) is a failed run
            passed.append(False)
            print(f"run {k} of {runs}: FAILED, it did not complete: {type(exc).__name__}: {exc}", flush=True)
            continue
        passed.append(bool(doc["passed"]))
        print(f"run {k} of {runs}: {'passed' if doc['passed'] else 'FAILED'}", flush=True)
        print(_summary(doc), flush=True)
    streak = next((k for k, ok in enumerate(passed) if not ok), runs)
    print(f"{name}: {sum(passed)} of {runs} runs passed every check; the first {streak} in a row", flush=True)
    return 0 if all(passed) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.e2e", description=" ".join(__doc__.split("\n\n")[1].split()))
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS) + ["all"],
                   help="the scenario to run, or `all` (required; choices: %(choices)s)")
    p.add_argument("--factor", type=float, default=10.0,
                   help="time compression: K simulated seconds per real second (1 = real time; default: %(default)s)")
    # absolute: nginx, started with its own prefix, would resolve a relative path against that prefix
    p.add_argument("--out", type=lambda text: Path(text).resolve(), default=Path("e2e-out").resolve(),
                   help="folder for each scenario's result.json, timeline and PNG (default: ./e2e-out)")
    p.add_argument("--json", action="store_true", help="print one JSON document (a list for `all`; default: a summary)")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing: print the table of the result.json files already in --out (default: run)")
    p.add_argument("--repeat", type=_positive, default=1, metavar="N",
                   help="run one scenario N times in a row, each into --out/NAME/run-K, and print the pass count "
                        "(default: %(default)s)")
    args = p.parse_args(argv)
    if args.repeat > 1:
        if args.scenario == "all" or args.table_only or args.json:
            p.error("--repeat runs one scenario, printing summaries: not with `all`, --table-only or --json")
        return _repeat(args.scenario, factor=args.factor, out=args.out / args.scenario, runs=args.repeat)
    names = sorted(SCENARIOS) if args.scenario == "all" else [args.scenario]
    docs = []
    for name in names:
        if args.table_only:
            path = args.out / name / "result.json"
            if path.exists():
                docs.append(json.loads(path.read_text()))
            continue
        doc = run_scenario(name, factor=args.factor, out=args.out / name)
        docs.append(doc)
        if not args.json:
            print(_summary(doc), flush=True)
    if args.table_only or (len(docs) > 1 and not args.json):
        print(table(docs))
        if args.table_only:
            return 0 if docs and all(d["passed"] for d in docs) else 1
    if args.json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    return 0 if all(d["passed"] for d in docs) else 1


if __name__ == "__main__":
    sys.exit(main())
