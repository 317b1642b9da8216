"""A fingerprint of every replay's full result, to show that a change for speed changed no decision.

    python -m loadtest.replay_digest [--trace PATH] [--policies a,b,...] (the bench's trace and cluster flags)

Replays each policy (default: predictive, clairvoyant, hpa, static) as the bench does and prints one line per
policy: a SHA-256 of the `repr` of its outcome, costs, scaling actions, refit flags, time to capacity and
the timeline of every tick (signals, decision, reasons, replicas, warm slots, shed levels). `repr` prints
floats exactly, so two runs print the same digest only if every figure of every tick is the same double;
wall times are left out. Run it before and after a change and diff the output.
"""

from __future__ import annotations

import hashlib
import sys

from autoscaler.errors import InputError
from autoscaler.sim.run import RunResult, run
from loadtest import bench, policyset

DEFAULT_POLICIES = "predictive,clairvoyant,hpa,static"


def digest(result: RunResult) -> str:
    """SHA-256 of everything a replay produced but its timings."""
    text = repr((result.outcome, result.costs, result.scaling_actions, result.refit, result.capacity_lags_s,
                 result.timeline))
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--policies" not in argv:
        argv += ["--policies", DEFAULT_POLICIES]
    args = bench.parse_args(argv, prog="python -m loadtest.replay_digest", description=__doc__.splitlines()[0])
    try:
        setup = bench.prepare(args)
        names = tuple(n.strip() for n in args.policies.split(",") if n.strip())
        runs = policyset.build(setup.config, setup.needed, names, predictive=setup.spec, max_replicas=setup.bound)
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for policy in runs:
        result = run(policy, setup.workload, setup.config, initial_replicas=setup.start(policy.name),
                     keep_timeline=True)
        print(f"{policy.name} {digest(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
