"""`python -m loadtest.bench --seeds A-B`: the predictive policy once per seed, and the worst seed's verdict.

A seed changes the traffic, not the policy: on a rate trace (ServeGen) each client's per-tick arrivals, on a
request trace (CSV, Mooncake, `scenario:`) the class each request is drawn into and the copies a scale above
1 adds. Every seed is a full `--seed S` run of the predictive policy and the clairvoyant (for GPU-hours vs
clairvoyant); each seed's row is printed as it finishes, then the table of all seeds, then the targets'
verdict of the worst seed (the smallest margin: attainment minus target, or the shed allowance left; a tie
goes to the next smallest) and how many seeds met them.
"""

from __future__ import annotations

import argparse

from loadtest.bench import prepare, replay_rows, table, verdict
from loadtest.measure import margins, meets


def seed_rows(args: argparse.Namespace) -> tuple[list[dict], object]:
    """One row of the predictive policy per seed, named "seed S"; and the last setup (classes, cluster)."""
    rows, setup = [], None
    for seed in args.seeds:
        setup = prepare(argparse.Namespace(**{**vars(args), "seed": seed, "seeds": None}))
        figures, _ = replay_rows(setup, ("predictive", "clairvoyant"))
        row = next(r for r in figures if r["policy"] == "predictive")
        row["seed"] = seed
        rows.append(row)
        ok = meets(row, setup.classes, setup.sheddable)
        shed = ", ".join(f"{c} shed {row['shed_by_class'][c]:.2%}" for c in setup.sheddable)
        print(f"seed {seed}: " + ", ".join(f"{c} {v:.4%}" for c, v in row["slo_attainment"].items())
              + f", {shed}, {row['gpu_hours']:.2f} GPU-h: {'met' if ok else 'NOT met'}", flush=True)
    return rows, setup


def seeds_main(args: argparse.Namespace) -> int:
    rows, setup = seed_rows(args)
    named = [{**r, "policy": f"seed {r['seed']}"} for r in rows]
    print(table(named, setup.classes, setup.sheddable, cluster=setup.config.cluster,
                gpu_hour_price=setup.gpu_hour_price))
    worst = min(rows, key=lambda r: margins(r, setup.classes, setup.sheddable))
    lines = verdict([{**worst, "policy": "predictive"}], setup.classes, setup.sheddable, cluster=setup.config.cluster)
    print(f"worst seed {worst['seed']}: {lines[0] if lines else ''}")
    missed = [str(r["seed"]) for r in rows if not meets(r, setup.classes, setup.sheddable)]
    print(f"targets met on {len(rows) - len(missed)} of {len(rows)} seeds"
          + (f"; missed on seed {', '.join(missed)}" if missed else ""))
    return 0
