"""One controller replica reduced to its sharding: `python -m loadtest.shard_writer` holds its share of the
shard Leases (`autoscaler.fleet.shards.ShardLeases`) and, every tick, writes each model it owns: a fenced
write (`owns` checked just before it) that stamps the writer and time on the model's ConfigMap
(`model-<i>`, standing for its Deployment), and appends a line `{"model", "writer", "t"}` to its write log.

Several of these against one apiserver show what sharding guarantees: each model written by one replica at
a time, a SIGKILLed replica's models written again by another within the Lease duration, and a replica that
joins taking its share. SIGTERM releases the shards (a hand-over) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

from autoscaler.clock import SystemClock
from autoscaler.fleet.shards import ShardLeases
from autoscaler.kube.client import Kube
from autoscaler.errors import EdgeError

WRITER_ANNOTATION = "shard-test.inference-autoscaler.io/writer"
AT_ANNOTATION = "shard-test.inference-autoscaler.io/at"


def model_name(i: int) -> str:
    return f"model-{i}"


async def write_owned(kube: Kube, gate: ShardLeases, *, namespace: str, models: int, identity: str,
                      clock: SystemClock) -> list[dict]:
    """One tick: a fenced write to every owned model; the log lines of those that landed."""

    async def write(name: str) -> dict | None:
        if not gate.owns((namespace, name)):
            return None
        at = clock.now()
        body = {"metadata": {"annotations": {WRITER_ANNOTATION: identity, AT_ANNOTATION: f"{at:.3f}"}}}
        try:
            await kube.call("write model", kube.core.patch_namespaced_config_map, name, namespace, body)
        except EdgeError:
            return None
        return {"model": name, "writer": identity, "t": at}

    done = await asyncio.gather(*(write(model_name(i)) for i in range(models)))
    return [line for line in done if line is not None]


async def main(args: argparse.Namespace) -> None:
    clock = SystemClock()
    kube = await Kube.connect(args.kubeconfig, clock=clock)
    gate = ShardLeases(kube, namespace=args.namespace, identity=args.identity, shards=args.shards,
                       lease_duration_s=args.lease_duration_s, renew_deadline_s=args.renew_deadline_s,
                       retry_period_s=args.retry_period_s, clock=clock)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    leases = asyncio.create_task(gate.run(stop))
    with Path(args.log).open("a") as log:
        while not stop.is_set():
            for line in await write_owned(kube, gate, namespace=args.namespace, models=args.models,
                                          identity=args.identity, clock=clock):
                log.write(json.dumps(line) + "\n")
            log.flush()
            await clock.wait(stop, args.tick_s)
    await leases
    await kube.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtest.shard_writer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True, help="of the models' ConfigMaps and the Leases")
    parser.add_argument("--identity", required=True)
    parser.add_argument("--models", type=int, default=60)
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--lease-duration-s", type=float, default=4.0)
    parser.add_argument("--renew-deadline-s", type=float, default=3.0)
    parser.add_argument("--retry-period-s", type=float, default=0.5)
    parser.add_argument("--tick-s", type=float, default=1.0)
    parser.add_argument("--log", required=True, help="write log, one JSON line per write that landed")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
