"""Cost-versus-attainment frontiers: every policy at a range of its own knob, on the same workload.

    python -m loadtest.bench --trace PATH --frontier [--json] [--frontier-png FILE] [--workers N]

One operating point cannot say whether a baseline tuned differently would reach our attainment, and at what
cost; a frontier can. Each policy runs at each value of its knob (`policyset.KNOBS`): the HPA, KEDA and
the KPA at target utilizations 0.2-0.9, static at replica counts from the median to 1.2 x the peak need,
ours at `capacity_ratio` 0.6-1.5 (the multiple of what the queueing model asks for); the clairvoyant and
the floor once.
Points run in parallel processes.

`gpu_hours_at_target`: the fewest GPU-hours (node GPU-hours when a node has more than one GPU, see
`measure.billed`; the document's `measure` says which) at which a policy meets the class targets (the highest class
>= 99.9 %, the other unshed classes >= 99 %, sheddable shed <= 5 %). Over the points ordered by GPU-hours,
the target is met first between a point that misses and one that meets: the GPU-hours there are
interpolated linearly on the binding margin (the smallest of attainment - target and 5 % - shed). "never"
(null) if no point meets the targets. The margin is not monotone in GPU-hours for every policy; the
interpolation is between the cheapest meeting point and the most expensive missing point below it.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from autoscaler.progress import bar as progress_bar
from autoscaler.sim.run import run
from loadtest import policyset
from loadtest.measure import billed, figures, floor_gpu_hours, margin, targets

UTILIZATIONS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CAPACITY_RATIOS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)
STATIC_STEPS = 8

_SETUP = None  # per worker process: the benchmark's setup, sent once to each


def _init(setup) -> None:
    global _SETUP
    _SETUP = setup


def _point(task: tuple[str, float | None]) -> dict:
    name, knob = task
    setup = _SETUP
    runner = policyset.policy(name, setup.config, setup.needed, predictive=setup.spec, max_replicas=setup.bound,
                              knob=knob)
    start = int(knob) if name == "static" and knob is not None else setup.start(name)
    result = run(runner, setup.workload, setup.config, initial_replicas=start)
    row = figures(result, None, gpu_hour_price=setup.gpu_hour_price)
    row["knob"] = policyset.KNOBS.get(name)
    row["value"] = knob
    return row


def knob_values(name: str, needed: np.ndarray) -> tuple[float | None, ...]:
    if name in ("hpa", "kpa", "keda"):
        return UTILIZATIONS
    if name == "predictive":
        return CAPACITY_RATIOS
    if name == "static":
        lo, hi = int(np.median(needed)), int(np.ceil(1.2 * needed.max()))
        return tuple(sorted({int(round(x)) for x in np.linspace(max(1, lo), hi, STATIC_STEPS)}))
    return (None,)


def at_target(points: list[dict], classes: tuple[str, ...], sheddable: tuple[str, ...],
              key: str = "gpu_hours") -> float | None:
    ordered = sorted(points, key=lambda p: p[key])
    for i, p in enumerate(ordered):
        m = margin(p, classes, sheddable)
        if m < 0:
            continue
        below = [q for q in ordered[:i] if margin(q, classes, sheddable) < 0]
        if not below:
            return round(p[key], 3)
        q = below[-1]
        mq = margin(q, classes, sheddable)
        share = -mq / (m - mq) if m != mq else 1.0
        return round(q[key] + share * (p[key] - q[key]), 3)
    return None


def sweep(args: argparse.Namespace, setup, names: tuple[str, ...]) -> dict[str, list[dict]]:
    tasks = [(name, value) for name in names for value in knob_values(name, setup.needed)]
    workers = args.workers or os.cpu_count() or 1
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), initializer=_init, initargs=(setup,)) as pool:
        bar = progress_bar(total=len(tasks), label="frontier", unit="point")
        rows = []
        for row in pool.map(_point, tasks):  # in order, as they finish
            rows.append(row)
            bar.update()
        bar.close()
    out: dict[str, list[dict]] = {name: [] for name in names}
    for (name, _), row in zip(tasks, rows):
        out[name].append(row)
    return out


def plot(path: str, frontier: dict[str, list[dict]], at: dict[str, float | None], *, title: str, floor: float,
         top: str, targets: dict[str, float], key: str = "gpu_hours", unit: str = "GPU-h") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, cls in zip(axes, list(targets)[:2]):
        for name, points in frontier.items():
            ordered = sorted(points, key=lambda p: p[key])
            xs = [p[key] for p in ordered]
            ys = [100 * p["slo_attainment"][cls] for p in ordered]
            label = f"{name} (at target: {at[name]:.0f} {unit})" if at.get(name) is not None else f"{name} (never)"
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.axhline(100 * targets[cls], color="grey", linestyle="--", linewidth=0.8)
        ax.axvline(floor, color="black", linestyle=":", linewidth=0.8, label=f"floor {floor:.0f} GPU-h")
        ax.set_xscale("log")
        ax.set_ylim(max(0, 100 * targets[cls] - 10), 100.2)
        ax.set_xlabel(f"{unit} (log)")
        ax.set_ylabel(f"{cls} within SLO (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def frontier_main(args: argparse.Namespace, setup) -> int:
    names = tuple(n.strip() for n in args.policies.split(",") if n.strip())
    if "clairvoyant" not in names:
        names += ("clairvoyant",)
    frontier = sweep(args, setup, names)
    wanted = targets(setup.classes, setup.sheddable)
    key, unit = billed(setup.config.cluster)
    at = {name: at_target(points, setup.classes, setup.sheddable, key) for name, points in frontier.items()}
    floor = floor_gpu_hours(setup.workload, setup.config)
    clairvoyant = frontier["clairvoyant"][0][key] if frontier.get("clairvoyant") else None
    doc = {
        "trace": setup.workload.name, "replica_bound": setup.bound, "measure": key, "floor_gpu_hours": round(floor, 3),
        "clairvoyant_gpu_hours": clairvoyant, "frontier": frontier, "gpu_hours_at_target": at,
        "vs_floor": {n: (round(v / floor, 3) if v is not None and floor else None) for n, v in at.items()},
        "vs_clairvoyant": {n: (round(v / clairvoyant, 3) if v is not None and clairvoyant else None)
                           for n, v in at.items()},
    }
    if args.frontier_png:
        plot(args.frontier_png, frontier, at, title=f"{setup.workload.name}: attainment against {unit}",
             floor=floor, top=setup.classes[0], targets=wanted, key=key, unit=unit)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"trace {setup.workload.name}: floor {floor:.2f} GPU-h, clairvoyant {clairvoyant:.2f} {unit}, "
          f"replica bound {setup.bound}")
    print(f"{'policy':<12} {'knob':<22} {unit + ' at target':>16} {'x floor':>8} {'x clairv':>9}  "
          f"points (value: {unit} crit%)")
    for name, points in frontier.items():
        value = at[name]
        shown = f"{value:.2f}" if value is not None else "never"
        ratio_f = f"{value / floor:.2f}" if value is not None and floor else "-"
        ratio_c = f"{value / clairvoyant:.3f}" if value is not None and clairvoyant else "-"
        pts = "; ".join(f"{p['value']:g}: {p[key]:.0f} {100 * p['slo_attainment'][setup.classes[0]]:.2f}"
                        if p["value"] is not None else f"{p[key]:.0f} {100 * p['slo_attainment'][setup.classes[0]]:.2f}"
                        for p in sorted(points, key=lambda p: p[key]))
        print(f"{name:<12} {str(policyset.KNOBS.get(name, '-')):<22} {shown:>16} {ratio_f:>8} {ratio_c:>9}  {pts}")
    return 0
