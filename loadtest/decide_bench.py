"""What the predictive policy costs on a trace's replay, in CPU time as well as wall time.

    python -m loadtest.decide_bench [--trace PATH] (the bench's trace and cluster flags)

Replays the predictive policy and the clairvoyant on the same simulated cluster in one process (as the bench
does) and prints decide()'s median and 99th percentile per tick (scheduled statsmodels refits included)
and each replay's time, each twice: wall time, and the CPU time of this process (decide(): of the calling
thread). On a shared, loaded machine the wall figures carry the scheduler's preemption (a thread that
loses its core mid-call waits tens of ms), which says nothing about the code; the CPU figures do not.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np

from autoscaler.errors import InputError
from autoscaler.sim.run import PolicyRun, run
from loadtest import bench, policyset


def timed(policy: PolicyRun, wall_s: list[float], cpu_s: list[float]) -> PolicyRun:
    decide = policy.decide

    def measured(spec, state, signals, now):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = decide(spec, state, signals, now)
        cpu_s.append(time.thread_time() - c0)
        wall_s.append(time.perf_counter() - t0)
        return out

    return replace(policy, decide=measured)


def _ms(values: list[float], q: float) -> str:
    return f"{float(np.percentile(values, q)) * 1e3:.3f}"


DESCRIPTION = (__doc__.splitlines()[0] + " It takes the benchmark's flags: the trace, cluster and policy flags "
               "apply; it always replays the predictive policy and the clairvoyant, and prints its own figures "
               "(--policies, --frontier, --json and the output flags are not used).")


def main(argv: list[str] | None = None) -> int:
    args = bench.parse_args(argv, prog="python -m loadtest.decide_bench", description=DESCRIPTION)
    try:
        setup = bench.prepare(args)
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs = policyset.build(setup.config, setup.needed, ("predictive", "clairvoyant"), predictive=setup.spec,
                           max_replicas=setup.bound)
    wall_s: list[float] = []
    cpu_s: list[float] = []
    replay: dict[str, tuple[float, float]] = {}
    for policy in runs:
        if policy.name == "predictive":
            policy = timed(policy, wall_s, cpu_s)
        t0, c0 = time.perf_counter(), time.process_time()
        run(policy, setup.workload, setup.config, initial_replicas=setup.start(policy.name))
        replay[policy.name] = (time.perf_counter() - t0, time.process_time() - c0)
    print(f"trace {setup.workload.name}: {len(wall_s)} ticks")
    print(f"predictive decide(): wall median {_ms(wall_s, 50)} ms, p99 {_ms(wall_s, 99)} ms; "
          f"thread CPU median {_ms(cpu_s, 50)} ms, p99 {_ms(cpu_s, 99)} ms (scheduled refits included)")
    (ours_wall, ours_cpu), (theirs_wall, theirs_cpu) = replay["predictive"], replay["clairvoyant"]
    print(f"replay: predictive {ours_wall:.1f} s wall, {ours_cpu:.1f} s CPU; clairvoyant {theirs_wall:.1f} s wall, "
          f"{theirs_cpu:.1f} s CPU; predictive / clairvoyant {ours_wall / theirs_wall:.2f}x wall, "
          f"{ours_cpu / theirs_cpu:.2f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
