"""`autoscaler serve --replay RECORDING`: the KEDA external scaler (gRPC) and the admission endpoint (HTTP)
on this machine, answering from decisions replayed from a recording, so KEDA's client, grpcurl or curl can
be pointed at them without a cluster.

The servers are the controller's own (`autoscaler.external_scaler.server`, `autoscaler.admission`), reading
the same `DecisionBoard`; only the writer differs: instead of the control loop, the open-loop replay
publishes one decision per tick of the recording, `--speed` seconds of recording per second of wall time
(1 = the recording's own pace). What runs is what the recording said ran (its spec replicas), so a held
decision publishes those, as the controller does. The admission endpoint's queue reading is the recorded
queue depth at the tick (there are no pods to probe). After the last tick the last decision stays
published until interrupted (Ctrl-C), or the command ends with `--exit-at-end`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
from typing import Callable

from aiohttp import web

from autoscaler.board import DecisionBoard, Published
from autoscaler.config import AdmissionConfig
from autoscaler.config import Keda as KedaSettings
from autoscaler.config import load_policy_spec
from autoscaler.errors import ConfigError
from autoscaler.replay import table
from autoscaler.replay.recording import Recording, read_recording
from autoscaler.timeline import timeline_row
from policies import PolicySpec, decide, initial_state


async def publish_ticks(recording: Recording, spec: PolicySpec, board: DecisionBoard, *, speed: float,
                        stop: asyncio.Event, clock: Callable[[], float],
                        on_change: Callable[[str], None] = print) -> int:
    """Decide and publish every tick of the recording at `speed` x its pace; returns the ticks published.
    Each change (as the decision table shows it) is reported through `on_change`."""
    state, before, start = initial_state(), None, recording.start_s
    count = int(math.floor((recording.end_s - start) / spec.tick_s)) + 1
    for i in range(count):
        now = start + i * spec.tick_s
        signals = recording.signals_at(now)
        decision, state = decide(spec, state, signals, now)
        cluster = signals.cluster
        queue = signals.queue_depth.value if signals.queue_depth is not None else None
        await board.publish(Published(decision, cluster.spec_replicas if cluster else decision.replicas, queue,
                                      clock()))
        row = timeline_row(now, signals, decision, replicas=decision.replicas, warm_slots=decision.warm_slots,
                           shed=decision.shed, classes=spec.classes)
        for what, reason in table.what_changed(row, before):
            on_change(f"{table.clock(now - start):>8}  replicas {decision.replicas:>3}  {what}: {reason}")
        before = row
        try:
            await asyncio.wait_for(stop.wait(), timeout=spec.tick_s / speed)
            return i + 1
        except asyncio.TimeoutError:
            pass
    return count


async def _start_admission(board: DecisionBoard, spec: PolicySpec, *, host: str, port: int) -> web.AppRunner:
    from autoscaler.admission import Admission

    defaults = AdmissionConfig()
    admission = Admission(board, priorities=spec.priorities, header=defaults.priority_header,
                          default_class=defaults.default_priority, retry_after_s=defaults.retry_after_s)
    runner = web.AppRunner(admission.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def serve(args: argparse.Namespace, *, stop: asyncio.Event | None = None) -> int:
    from autoscaler.external_scaler.server import start as start_scaler

    spec = load_policy_spec(args.policy, tick_s=args.tick_s)
    recording = read_recording(args.replay, args.format)
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass  # not the main thread (tests)
    board = DecisionBoard()
    try:
        scaler = await start_scaler(board, host=args.host, port=args.grpc_port, namespace=args.namespace,
                                    scaled_object=args.scaled_object, metric_name=KedaSettings().metric_name)
    except (OSError, RuntimeError) as exc:  # grpc reports a port in use as RuntimeError or OSError
        raise ConfigError(f"--grpc-port {args.grpc_port}: cannot listen on {args.host}: {exc}") from None
    try:
        runner = await _start_admission(board, spec, host=args.host, port=args.admission_port)
    except OSError as exc:
        await scaler.stop(grace=None)
        raise ConfigError(f"--admission-port {args.admission_port}: cannot listen on {args.host}: "
                          f"{exc.strerror or exc}") from None
    print(f"KEDA external scaler on {args.host}:{args.grpc_port} (ScaledObject {args.namespace}/{args.scaled_object}),"
          f" admission endpoint on http://{args.host}:{args.admission_port}/auth_request and /ext_authz;"
          f" replaying {recording.source} at {args.speed:g}x", flush=True)
    try:
        loop = asyncio.get_running_loop()
        ticks = await publish_ticks(recording, spec, board, speed=args.speed, stop=stop, clock=loop.time,
                                    on_change=lambda line: print(line, flush=True))
        print(f"{ticks} ticks published; " + ("stopping" if args.exit_at_end or stop.is_set() else
                                               "the last decision stays published until Ctrl-C"), flush=True)
        if not args.exit_at_end:
            await stop.wait()
    finally:
        await runner.cleanup()
        await scaler.stop(grace=1.0)
    return 0
