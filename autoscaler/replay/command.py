"""`autoscaler replay`: the dry run, from the command line.

A recording (CSV, JSONL or Prometheus query_range export) is replayed open loop (the decisions, tick by
tick) or simulated (the policy driving the simulated cluster on the recorded demand, against what actually
ran); a trace is replayed on the simulated cluster. Either way the output is a timeline CSV and PNG in
`--out`: the working directory's `replay-out` by default, or a fresh temporary folder when the working
directory cannot be written (a read-only container). `--out` is checked before the run and the folder made
only when there are results to write: bad input writes nothing."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from autoscaler.config import load_policy_spec
from autoscaler.errors import ConfigError, RecordingError, TraceError
from autoscaler.limits import check_ticks
from autoscaler.progress import bar as progress_bar
from autoscaler.replay import table
from autoscaler.replay.output import write_csv, write_plot
from autoscaler.replay.recording import read_recording
from policies import PolicySpec

DEFAULT_OUT = "replay-out"
SIMULATED_BASIS = "simulated: shed requests over the class's requests, as the benchmark counts them"


def _progress(total: int, label: str):
    progress = progress_bar(total=total, label=label)
    return progress, progress.update


def output_path(requested: str | Path | None, default: str = DEFAULT_OUT) -> Path:
    """`--out`, else ./<default>, else (the working directory is read-only) a new temporary folder: checked
    before the run (its nearest existing folder must be writable) and made only when results are written."""
    if requested is not None:
        out = Path(requested)
    elif os.access(".", os.W_OK):
        out = Path(default)
    else:
        out = Path(tempfile.mkdtemp(prefix=f"{default}-"))
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: cannot create the output folder: {existing} is a file")
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"--out {out}: not writable")
    return out


def output_folder(requested: str | Path | None, default: str = DEFAULT_OUT) -> Path:
    """`output_path`, made."""
    out = output_path(requested, default)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the output folder: {exc.strerror}") from None
    return out


def _write(out: Path, rows: list[dict], *, title: str, plot: bool) -> None:
    out = output_folder(out)
    write_csv(out / "timeline.csv", rows)
    if plot:
        try:
            write_plot(out / "timeline.png", rows, title=title)
        except ImportError:
            plot = False
            print("no plot: matplotlib is not installed (pip install 'inference-autoscaler[replay]')")
    print(f"wrote {out / 'timeline.csv'}" + (f" and {out / 'timeline.png'}" if plot else ""))


def replay(args: argparse.Namespace) -> int:
    spec = load_policy_spec(args.policy, tick_s=args.tick_s)
    out = output_path(args.out)
    if args.format == "trace":
        return _replay_trace(args, spec, out)
    recording = read_recording(args.input, args.format)
    step = recording.step_s()
    ticks = check_ticks(span_s=recording.end_s - recording.start_s, tick_s=spec.tick_s, source=recording.source,
                        error=RecordingError)
    print(
        f"recording {recording.source}: {len(recording.series)} signals, "
        f"{(recording.end_s - recording.start_s) / 3600:.2f} h, sampled every {step:.0f} s; "
        f"{ticks} ticks of {spec.tick_s:.0f} s"
    )
    if args.mode == "open-loop":
        from autoscaler.replay.openloop import open_loop

        bar, update = _progress(ticks, "replay")
        rows = open_loop(recording, spec, progress=update)
        bar.close()
        shed = table.open_loop_shed(rows, spec.classes)
        _print_table(rows, spec, every_tick=args.all, shed_by_class=shed,
                     shed_basis="open loop: each tick's decided fraction weighted by the recorded arrival rate")
    else:
        from autoscaler.replay.simulated import simulate

        bar, update = _progress(ticks, "simulate")
        ours, actual, info = simulate(recording, spec, default_class=args.default_priority, progress=update)
        bar.close()
        print(f"demand reconstructed for {info['ticks']} ticks ({info['demand_gaps']} gaps filled), "
              f"service time {info['service_time_s']} s; priorities: {info['priorities']}")
        for name, result in (("predictive", ours), ("recorded", actual)):
            if result is None:
                continue
            print(f"{name:<11} {_summary(result, spec)} | actions {result.scaling_actions}")
        rows = ours.timeline
        if actual is not None:
            recorded = {r["t_s"]: r["replicas"] for r in actual.timeline}
            rows = [dict(r, recorded_replicas=recorded.get(r["t_s"], "")) for r in rows]
        _print_table(rows, spec, every_tick=args.all, shed_by_class=ours.outcome["shed_by_class"],
                     shed_basis=SIMULATED_BASIS)
    _write(out, rows, title=f"{args.mode} replay of {Path(args.input).name}", plot=not args.no_plot)
    return 0


def sheddable_classes(spec: PolicySpec) -> tuple[str, ...]:
    """The classes the policy may shed (priority below `shed_priority_below`), as the benchmark counts them."""
    return tuple(c for c in spec.classes if spec.priorities[c] < spec.shed_priority_below)


def _print_table(rows: list[dict], spec: PolicySpec, *, every_tick: bool, shed_by_class: dict[str, float],
                 shed_basis: str) -> None:
    if not rows:
        print("no ticks to show")
        return
    found = table.changes(rows, every_tick=every_tick)
    print(("every tick" if every_tick else "the ticks where something changed (--all: every tick)") + ":")
    print(table.format_table(found, start_s=float(rows[0]["t_s"])))
    print(table.summary(rows, tick_s=spec.tick_s, sheddable=sheddable_classes(spec), shed_by_class=shed_by_class,
                        shed_basis=shed_basis))


def _summary(result, spec: PolicySpec) -> str:
    attainment = result.outcome["slo_attainment"]
    per_class = " ".join(f"{name} {attainment[name]:.3%}" for name in spec.classes)
    shed = ", ".join(f"{result.outcome['shed_by_class'][c]:.2%} of {c}" for c in sheddable_classes(spec)) or "none"
    return (f"SLO {per_class} | p99 wait {result.outcome['p99_queue_wait_s']:.2f} s | "
            f"GPU-h {result.costs.replica_gpu_hours:.2f} | shed {shed} requests")


def _mix(text: str | None, classes: tuple[str, ...]) -> tuple[float, ...]:
    from autoscaler.sim.workload import CLASSES, DEFAULT_MIX

    if text is None:
        if classes != CLASSES:
            raise ConfigError(f"--priority-mix: the policy's classes are {list(classes)}; give one share each")
        return DEFAULT_MIX
    try:
        mix = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--priority-mix: expected numbers like 0.2,0.5,0.3, got {text!r}") from None
    if len(mix) != len(classes) or min(mix) < 0 or sum(mix) <= 0:
        raise ConfigError(f"--priority-mix: need {len(classes)} non-negative shares for {list(classes)}, got {text!r}")
    return mix


def _replay_trace(args: argparse.Namespace, spec: PolicySpec, out: Path) -> int:
    from autoscaler.sim.run import PolicyRun, initial_replicas, needed_replicas, run, sim_config_for, ticks
    from autoscaler.sim.workload import WorkloadConfig, build
    from autoscaler.traces import read_trace
    from policies import decide, initial_state

    config = sim_config_for(spec)
    mix = _mix(args.priority_mix, spec.classes)
    workload = build(read_trace(args.input),
                     WorkloadConfig(server=config.server, classes=spec.classes, priority_mix=mix))
    check_ticks(span_s=workload.span_s, tick_s=config.tick_s, source=args.input, error=TraceError)
    initial = initial_replicas(needed_replicas(workload, config), config)
    bar, update = _progress(ticks(workload, config.tick_s), "simulate")
    result = run(
        PolicyRun("predictive", spec, decide, initial_state()), workload, config,
        initial_replicas=initial, keep_timeline=True, progress=update,
    )
    bar.close()
    _print_table(result.timeline, spec, every_tick=args.all, shed_by_class=result.outcome["shed_by_class"],
                 shed_basis=SIMULATED_BASIS)
    print(f"trace {workload.name} (scale x{workload.scale:.3g}): {_summary(result, spec)}")
    _write(out, result.timeline, title=f"simulated replay of {workload.name}", plot=not args.no_plot)
    return 0
