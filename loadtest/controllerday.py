"""A controller run through simulated days (fake sources, a manual clock), for its resident memory.

Imports nothing the controller does not (`autoscaler run` imports all of these modules): a fresh process that
imports `autoscaler.runtime` and then this module and runs a day holds what the controller would, plus the
day's state. `controller_bench.py` (`make bench-controller`) runs it in its own process and in a fresh one.

    python -m loadtest.controllerday [--ticks 5760] [--fit-in-process]

prints the resident memory after `autoscaler run`'s imports, after the simulated ticks, whether statsmodels
was imported, and the refit child's fits and peak memory, as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys

import structlog

from autoscaler.board import DecisionBoard
from autoscaler.clock import ManualClock
from autoscaler.config import Settings
from autoscaler.fitchild import ProcessFitter
from autoscaler.loop import Controller
from autoscaler.metrics import ControllerMetrics
from autoscaler.signals.prometheus import QueryResult
from policies import ClusterState, Sample

TICK_S = 15.0
# What a refit imports into the process that runs it (docs/speed.md, fourth pass).
FIT_STACK = ("statsmodels", "pandas", "patsy", "scipy.optimize", "scipy.stats")


def quiet_logs() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def fit_stack_loaded() -> list[str]:
    """The packages of the refit's stack (FIT_STACK) this process has imported."""
    return sorted(p for p in FIT_STACK if any(m == p or m.startswith(p + ".") for m in sys.modules))


class StaticCluster:
    def __init__(self, replicas: int = 8) -> None:
        self.replicas = replicas

    async def read(self, now: float) -> ClusterState:
        return ClusterState(spec_replicas=self.replicas, ready_replicas=self.replicas, at_s=now)

    async def pod_template(self):
        return None


def settings(url: str = "http://127.0.0.1:9") -> Settings:
    return Settings(target={"namespace": "llm", "name": "model"}, mode="shadow",
                    prometheus={"url": url, "selector": 'namespace="llm"'})


class SyntheticSource:
    """Diurnal-ish demand, so the forecaster has something to fit."""

    async def collect(self, now: float) -> QueryResult:
        rate = 40 + 20 * math.sin(2 * math.pi * now / 86400.0)
        return QueryResult(samples={"arrival_rate_per_s": Sample(rate, now), "in_flight": Sample(rate, now),
                                    "queue_depth": Sample(0.0, now), "service_time_s": Sample(1.0, now),
                                    "p99_latency_s": Sample(0.2, now)})


def controller(clock: ManualClock, fit: ProcessFitter | None) -> Controller:
    return Controller(settings=settings(), sources=[SyntheticSource()], cluster=StaticCluster(),
                      board=DecisionBoard(), metrics=ControllerMetrics(), clock=clock, fit=fit)


async def run(one: Controller, clock: ManualClock, ticks: int) -> None:
    for _ in range(ticks):
        await one.tick()
        await clock.advance(TICK_S)


async def memory(ticks_per_report: list[int],
                 fit: ProcessFitter | None = None) -> tuple[list[tuple[int, float]], float]:
    """RSS after each count of simulated ticks, and the RSS a second controller adds over as many ticks; the
    refits in `fit`'s child process (as `autoscaler run`), or in this one when None."""
    clock = ManualClock()
    first = controller(clock, fit)
    out, done = [], 0
    for target in ticks_per_report:
        await run(first, clock, target - done)
        done = target
        out.append((done, rss_mb()))
    before = rss_mb()
    second_clock = ManualClock()
    await run(controller(second_clock, fit), second_clock, done)
    return out, rss_mb() - before


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.controllerday", description=__doc__.splitlines()[0])
    p.add_argument("--ticks", type=int, default=5760, help="simulated 15 s ticks (default: %(default)s, a day)")
    p.add_argument("--fit-in-process", action="store_true",
                   help="run the refits in this process (default: in a child process, as `autoscaler run`)")
    args = p.parse_args(argv)
    import autoscaler.runtime  # noqa: F401 - what `autoscaler run` imports, before anything is measured

    imports_mb = rss_mb()
    quiet_logs()
    fit = None if args.fit_in_process else ProcessFitter()
    clock = ManualClock()
    asyncio.run(run(controller(clock, fit), clock, args.ticks))
    if fit is not None:
        fit.close()
    print(json.dumps({"imports_mb": round(imports_mb, 1), "after_ticks_mb": round(rss_mb(), 1), "ticks": args.ticks,
                      "fit_stack_loaded": fit_stack_loaded(), "child_fits": fit.fits if fit else None,
                      "child_peak_mb": round(fit.peak_rss_mb, 1) if fit and fit.peak_rss_mb else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
