"""The `autoscaler` command.

    autoscaler replay INPUT [--mode open-loop|simulated] [--format auto|csv|jsonl|prometheus|trace]
                            [--policy POLICY.yaml] [--out DIR]
    autoscaler record --config CONFIG.yaml --start T --end T [--step-s 15] --out FILE.json
    autoscaler run --config CONFIG.yaml [--kubeconfig FILE]

`replay` is the dry run: it reads recorded signals (a Prometheus query_range export, CSV or JSONL) or a
trace, runs the very same `policies.decide` the controller runs, and writes a CSV timeline and a PNG plot.
Bad input exits with status 2 and a message naming the file, the line and the field.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from autoscaler.policyfile import ConfigError, load_policy_spec
from autoscaler.replay.output import write_csv, write_plot
from autoscaler.replay.recording import RecordingError, read_recording
from loadtest.traces import TraceError


def _progress(total: int, label: str):
    bar = tqdm(total=total, desc=label, unit="tick", disable=None, leave=False, mininterval=0.5)
    return bar, bar.update


def replay(args: argparse.Namespace) -> int:
    spec = load_policy_spec(args.policy, tick_s=args.tick_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.format == "trace":
        return _replay_trace(args, spec, out)
    recording = read_recording(args.input, args.format)
    step = recording.step_s()
    ticks = int((recording.end_s - recording.start_s) // spec.tick_s) + 1
    print(
        f"recording {recording.source}: {len(recording.series)} signals, {(recording.end_s - recording.start_s) / 3600:.2f} h, "
        f"sampled every {step:.0f} s; {ticks} ticks of {spec.tick_s:.0f} s"
    )
    if args.mode == "open-loop":
        from autoscaler.replay.openloop import open_loop

        bar, update = _progress(ticks, "replay")
        rows = open_loop(recording, spec, progress=update)
        bar.close()
        valid = sum(1 for r in rows if r["valid"])
        changes = sum(1 for a, b in zip(rows, rows[1:]) if a["replicas"] != b["replicas"])
        print(f"{len(rows)} decisions, {valid} valid, {len(rows) - valid} held; {changes} replica changes")
        print(f"replicas decided: min {min(r['replicas'] for r in rows)}, max {max(r['replicas'] for r in rows)}")
    else:
        from autoscaler.replay.simulated import simulate

        bar, update = _progress(ticks, "simulate")
        ours, actual, info = simulate(recording, spec, progress=update)
        bar.close()
        print(f"demand reconstructed for {info['ticks']} ticks ({info['demand_gaps']} gaps filled), "
              f"service time {info['service_time_s']} s")
        for name, result in (("predictive", ours), ("recorded", actual)):
            if result is None:
                continue
            a = result.outcome["slo_attainment"]
            print(
                f"{name:<11} SLO critical {a['critical']:.3%} standard {a['standard']:.3%} | "
                f"p99 wait {result.outcome['p99_queue_wait_s']:.2f} s | GPU-h {result.costs.total_gpu_hours:.2f} | "
                f"shed {result.outcome['shed_fraction']:.2%} | actions {result.scaling_actions}"
            )
        rows = ours.timeline
        if actual is not None:
            recorded = {r["t_s"]: r["replicas"] for r in actual.timeline}
            rows = [dict(r, recorded_replicas=recorded.get(r["t_s"], "")) for r in rows]
    write_csv(out / "timeline.csv", rows)
    if not args.no_plot:
        write_plot(out / "timeline.png", rows, title=f"{args.mode} replay of {Path(args.input).name}")
    print(f"wrote {out / 'timeline.csv'}" + ("" if args.no_plot else f" and {out / 'timeline.png'}"))
    return 0


def _replay_trace(args: argparse.Namespace, spec, out: Path) -> int:
    from loadtest.sim.run import PolicyRun, initial_replicas, needed_replicas, run, sim_config_for, ticks
    from loadtest.traces import read_trace
    from loadtest.workload import WorkloadConfig, build
    from policies import decide, initial_state

    config = sim_config_for(spec)
    workload = build(read_trace(args.input), WorkloadConfig(server=config.server))
    initial = initial_replicas(needed_replicas(workload, config), config)
    bar, update = _progress(ticks(workload, config.tick_s), "simulate")
    result = run(
        PolicyRun("predictive", spec, decide, initial_state()), workload, config,
        initial_replicas=initial, keep_timeline=True, progress=update,
    )
    bar.close()
    a = result.outcome["slo_attainment"]
    print(
        f"trace {workload.name} (scale x{workload.scale:.3g}): SLO critical {a['critical']:.3%} "
        f"standard {a['standard']:.3%} | GPU-h {result.costs.total_gpu_hours:.2f} | shed {result.outcome['shed_fraction']:.2%}"
    )
    write_csv(out / "timeline.csv", result.timeline)
    if not args.no_plot:
        write_plot(out / "timeline.png", result.timeline, title=f"simulated replay of {workload.name}")
    print(f"wrote {out / 'timeline.csv'}" + ("" if args.no_plot else f" and {out / 'timeline.png'}"))
    return 0


def _when(text: str) -> float:
    """Unix seconds, ISO 8601, 'now', or 'now-<N>h/m/s'."""
    import time as _time
    from datetime import datetime, timezone

    text = text.strip()
    if text.startswith("now"):
        rest = text[3:]
        if not rest:
            return _time.time()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        if rest[0] == "-" and rest[-1] in units:
            try:
                return _time.time() - float(rest[1:-1]) * units[rest[-1]]
            except ValueError:
                pass
        raise ConfigError(f"time {text!r}: expected now, now-<N>[smhd], unix seconds or ISO 8601")
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"time {text!r}: expected now, now-<N>[smhd], unix seconds or ISO 8601") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp()


def record_command(args: argparse.Namespace) -> int:
    from autoscaler.config import load_config
    from autoscaler.errors import EdgeError
    from autoscaler.record import record, replica_queries

    settings = load_config(args.config)
    url = args.prometheus_url or settings.prometheus.url
    if not url:
        raise ConfigError("record needs prometheus.url in the config or --prometheus-url")
    queries = dict(settings.queries)
    queries.update(replica_queries(settings.target.namespace, settings.target.kind, settings.target.name))
    try:
        counts = record(url, queries, start=_when(args.start), end=_when(args.end), step_s=args.step_s,
                        out=Path(args.out))
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, count in counts.items():
        print(f"{name:<28} {count} points")
    print(f"wrote {args.out}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    import asyncio

    from autoscaler.config import load_config
    from autoscaler.runtime import configure_logging, run

    settings = load_config(args.config)  # an invalid config exits 2 before anything starts
    configure_logging()
    asyncio.run(run(settings, kubeconfig=args.kubeconfig))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoscaler", description="Predictive autoscaling for GPU model servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="dry run: what the policy would have done for recorded signals or a trace")
    p.add_argument("input", help="recording (.csv, .jsonl, Prometheus .json or folder of <signal>.json) or trace")
    p.add_argument("--format", default="auto", choices=["auto", "csv", "jsonl", "prometheus", "trace"])
    p.add_argument("--mode", default="open-loop", choices=["open-loop", "simulated"])
    p.add_argument("--policy", default=None, help="YAML file of policy fields (default: built-in defaults)")
    p.add_argument("--tick-s", type=float, default=None, help="control-loop period (default: the policy's)")
    p.add_argument("--out", default="replay-out", help="folder for timeline.csv and timeline.png")
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(handler=replay)
    r = sub.add_parser("record", help="export a time range of the configured signals from Prometheus")
    r.add_argument("--config", required=True, help="the controller's YAML config (target, preset, Prometheus)")
    r.add_argument("--prometheus-url", default=None, help="override prometheus.url")
    r.add_argument("--start", required=True, help="unix seconds, ISO 8601, or now-<N>[smhd]")
    r.add_argument("--end", default="now")
    r.add_argument("--step-s", type=float, default=15.0)
    r.add_argument("--out", required=True, help="JSON file, readable by `autoscaler replay`")
    r.set_defaults(handler=record_command)
    c = sub.add_parser("run", help="run the controller for one target")
    c.add_argument("--config", default=None, help="YAML config (the ConfigMap); AUTOSCALER_* variables override it")
    c.add_argument("--kubeconfig", default=None, help="default: in-cluster service account")
    c.set_defaults(handler=run_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, RecordingError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
