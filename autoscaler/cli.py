"""The `autoscaler` command.

    autoscaler run --config CONFIG.yaml [--kubeconfig FILE]
    autoscaler replay INPUT [--mode open-loop|simulated] [--format auto|csv|jsonl|prometheus|trace]
                            [--policy POLICY.yaml] [--out DIR]
    autoscaler analyze INPUT [--format ...] [--out DIR] [--json] [--write-config FILE]
    autoscaler record --config CONFIG.yaml --start T --end T [--step-s 15] --out FILE.json
    autoscaler serve --replay RECORDING [--speed 60] [--grpc-port 9090] [--admission-port 8081]

`run` is the controller. `replay` is the dry run: it reads recorded signals (a Prometheus query_range
export, CSV or JSONL) or a trace, runs the very same `policies.decide` the controller runs, and writes a
CSV timeline and a PNG plot. `analyze` is the preflight: the demand's floor, bursts, residency and what can
wait, and a recommended policy section. `record` exports a time range from Prometheus for both. `serve`
runs the KEDA scaler and the admission endpoint locally on decisions replayed from a recording.

Each command imports what it needs when it runs: `run` never loads the simulator, the trace readers or
the plotting library. Every error the shell raises on purpose is an `AutoscalerError`: bad input exits
with status 2 and a message naming the file, line or field; an unreachable server exits with status 1.
Numeric flags are checked by the parser (`autoscaler.flags`: also status 2, naming the flag and value), and
inputs beyond the caps of `autoscaler.limits` are refused before they run; docs/faults.md lists it all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoscaler.errors import AutoscalerError, ConfigError
from autoscaler.flags import number


EXAMPLE_CONFIG = "deploy/base/configmap.yaml"
NO_CLUSTER_TRY = "to see its decisions without a cluster: autoscaler replay loadtest/recordings/fleet-3h/recording.json"


def _check_config_given(args: argparse.Namespace) -> None:
    import os

    if args.config is None and not any(name.startswith("AUTOSCALER_") for name in os.environ):
        raise ConfigError(f"run needs a config: --config FILE (a complete, tested example is the config.yaml key of "
                          f"{EXAMPLE_CONFIG}) or AUTOSCALER_* variables; {NO_CLUSTER_TRY}")


def _check_cluster_given(args: argparse.Namespace) -> None:
    import os

    if args.kubeconfig is None and "KUBERNETES_SERVICE_HOST" not in os.environ:
        raise ConfigError("run needs a cluster: not running in a pod (KUBERNETES_SERVICE_HOST is unset) and no "
                          f"--kubeconfig FILE given (e.g. --kubeconfig ~/.kube/config); {NO_CLUSTER_TRY}")


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from autoscaler.config import load_config
    from autoscaler.runtime import configure_logging, run

    _check_config_given(args)  # say what is missing before anything starts: a config, then a cluster
    settings = load_config(args.config)  # an invalid config exits 2 before anything starts
    _check_cluster_given(args)
    configure_logging()
    if settings.fleet.enabled:  # every ModelAutoscaler object (docs/fleet-controller.md)
        from autoscaler.fleet.runtime import run_fleet

        asyncio.run(run_fleet(settings, kubeconfig=args.kubeconfig))
    else:
        asyncio.run(run(settings, kubeconfig=args.kubeconfig))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from autoscaler.blas import cap_this_process

    cap_this_process()  # before numpy loads: the replay's fits run here, one BLAS thread (autoscaler.blas)
    from autoscaler.replay.command import replay

    return replay(args)


def _analyze(args: argparse.Namespace) -> int:
    from autoscaler.analyze.command import analyze

    return analyze(args)


def _record(args: argparse.Namespace) -> int:
    from autoscaler.record import record_command

    return record_command(args)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from autoscaler.replay.serve import serve

    return asyncio.run(serve(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoscaler", description="Predictive autoscaling for GPU model servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("run", help="run the controller for one target, or every ModelAutoscaler (fleet.enabled)")
    c.add_argument("--config", default=None,
                   help="YAML config (the ConfigMap; example: deploy/base/configmap.yaml); AUTOSCALER_* variables "
                   "override it (default: the AUTOSCALER_* variables alone)")
    c.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: the in-cluster service account)")
    c.set_defaults(handler=_run)
    p = sub.add_parser("replay", help="dry run: what the policy would have done for recorded signals or a trace")
    p.add_argument("input", help="recording (.csv, .jsonl, Prometheus .json or folder of <signal>.json) or trace")
    p.add_argument("--format", default="auto", choices=["auto", "csv", "jsonl", "prometheus", "trace"],
                   help="input format (default: %(default)s, from the file name and content)")
    p.add_argument("--mode", default="open-loop", choices=["open-loop", "simulated"],
                   help="open-loop: the decisions for the recorded signals; simulated: the policy driving the "
                        "simulated cluster on the recorded demand (default: %(default)s)")
    p.add_argument("--policy", default=None,
                   help="YAML file of policy fields, or a controller config (its policy section); default: built-in")
    p.add_argument("--tick-s", type=number(at_least=1, at_most=300), default=None,
                   help="control-loop period (default: the policy's)")
    p.add_argument("--default-priority", default="standard",
                   help="simulated: the class of requests a recording has no per-priority rates for "
                   "(default: %(default)s)")
    p.add_argument("--priority-mix", default=None,
                   help="trace: shares of the policy's classes, highest first (default 0.2,0.5,0.3)")
    p.add_argument("--out", default=None,
                   help="folder for timeline.csv and timeline.png (default: ./replay-out, or a temporary folder "
                        "when the working directory is not writable)")
    p.add_argument("--no-plot", action="store_true", help="write timeline.csv only (default: also timeline.png)")
    p.add_argument("--all", action="store_true",
                   help="print every tick in the decision table (default: only the ticks where something changed)")
    p.set_defaults(handler=_replay)
    a = sub.add_parser("analyze", help="preflight: floor, bursts, residency, what can wait; a recommended policy")
    a.add_argument("input", help="a recording (as for replay) or a trace (Azure/Mooncake file, ServeGen folder)")
    a.add_argument("--format", default="auto", choices=["auto", "csv", "jsonl", "prometheus", "trace"],
                   help="input format (default: %(default)s, from the file name and content)")
    a.add_argument("--policy", default=None,
                   help="policy fields (slots per replica, SLO, priorities) to size with (default: built-in)")
    a.add_argument("--startup-s", type=number(above=0), default=None,
                   help="pod start-up (default: measured, else the policy's)")
    a.add_argument("--node-provisioning-s", type=number(at_least=0), default=None,
                   help="a new node's arrival (default: the policy's)")
    a.add_argument("--scale", type=number(above=0), default=None, help="traces: multiply the load (default 1)")
    a.add_argument("--peak-replicas", type=number(int, at_least=1), default=None,
                   help="traces: scale so the busiest minute needs this many replicas, as the benchmark does "
                        "(default: unscaled, or --scale)")
    a.add_argument("--out", type=Path, default=None, help="folder for report.html (default ./analyze-out)")
    a.add_argument("--json", action="store_true",
                   help="print one JSON document instead of the summary (default: the summary)")
    a.add_argument("--write-config", type=Path, default=None,
                   help="write the recommended policy section here (default: not written)")
    a.set_defaults(handler=_analyze)
    v = sub.add_parser("serve",
                       help="the KEDA gRPC scaler and the admission endpoint on this machine, from a recording")
    v.add_argument("--replay", required=True, help="recording whose decisions are served (as for replay; required)")
    v.add_argument("--format", default="auto", choices=["auto", "csv", "jsonl", "prometheus"],
                   help="input format (default: %(default)s, from the file name and content)")
    v.add_argument("--policy", default=None,
                   help="YAML file of policy fields, or a controller config (default: built-in)")
    v.add_argument("--tick-s", type=float, default=None, help="control-loop period (default: the policy's)")
    v.add_argument("--speed", type=float, default=60.0,
                   help="seconds of recording per second of wall time, 1 = its own pace "
                        "(default: %(default)s: a 15-s tick every 0.25 s)")
    v.add_argument("--host", default="127.0.0.1", help="address both servers listen on (default: %(default)s)")
    v.add_argument("--grpc-port", type=int, default=9090, help="KEDA external scaler port (default: %(default)s)")
    v.add_argument("--admission-port", type=int, default=8081, help="admission endpoint port (default: %(default)s)")
    v.add_argument("--namespace", default="llm",
                   help="the ScaledObject's namespace KEDA asks for (default: %(default)s)")
    v.add_argument("--scaled-object", default="model",
                   help="the ScaledObject's name KEDA asks for (default: %(default)s)")
    v.add_argument("--exit-at-end", action="store_true",
                   help="stop after the last tick (default: keep serving the last decision until Ctrl-C)")
    v.set_defaults(handler=_serve)
    r = sub.add_parser("record", help="export a time range of the configured signals from Prometheus")
    r.add_argument("--config", required=True,
                   help="the controller's YAML config (target, preset, Prometheus; required)")
    r.add_argument("--prometheus-url", default=None, help="Prometheus to query (default: the config's prometheus.url)")
    r.add_argument("--start", required=True, help="unix seconds, ISO 8601, or now-<N>[smhd] (required)")
    r.add_argument("--end", default="now", help="unix seconds, ISO 8601, or now-<N>[smhd] (default: %(default)s)")
    r.add_argument("--step-s", type=number(above=0), default=15.0,
                   help="seconds between samples; fractions allowed (default: %(default)s, the control tick)")
    r.add_argument("--out", required=True, help="JSON file, readable by `autoscaler replay` (required)")
    r.set_defaults(handler=_record)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except AutoscalerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_status


if __name__ == "__main__":
    sys.exit(main())
