"""One PNG per closed-loop scenario: offered load, replicas (decided, ready, pending), warm slots and nodes,
the shed rate and the p99 queue wait per class, minute by minute at factor 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadtest.e2e.checks import CheckContext


def _per_minute(records: list[dict], classes: tuple[str, ...], span_min: int):
    offered = {c: np.zeros(span_min) for c in classes}
    shed = {c: np.zeros(span_min) for c in classes}
    waits = {c: [[] for _ in range(span_min)] for c in classes}
    for r in records:
        m = min(span_min - 1, int(r["sent_s"] // 60))
        if r["class"] not in offered:
            continue
        offered[r["class"]][m] += 1
        if r["status"] == 429:
            shed[r["class"]][m] += 1
        elif r["status"] == 200 and r["queue_s"] is not None:
            waits[r["class"]][m].append(r["queue_s"])
    p99 = {c: np.array([np.percentile(w, 99) if w else np.nan for w in waits[c]]) for c in classes}
    return offered, shed, p99


def plot(path: Path, context: CheckContext) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc, timeline, records = context.doc, context.timeline, context.records
    classes = tuple(doc["slo_attainment"])
    span_min = max(1, int(max((r["sent_s"] for r in records), default=60) // 60) + 1)
    offered, shed, p99 = _per_minute(records, classes, span_min)
    minutes = np.arange(span_min)
    t = np.array([r["t_s"] / 60 for r in timeline])
    fig, axes = plt.subplots(5, 1, figsize=(11, 12), sharex=True)
    ax = axes[0]
    ax.stackplot(minutes, *[offered[c] / 60 for c in classes], labels=classes, step="post", alpha=0.7)
    ax.set_ylabel("offered (req/s)")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[1]
    ax.step(t, [r["decided"] for r in timeline], where="post", label="decided")
    ax.step(t, [r["spec_replicas"] for r in timeline], where="post", label="Deployment spec", linestyle=":")
    ax.step(t, [r["model"]["ready"] for r in timeline], where="post", label="ready")
    ax.step(t, [r["model"]["pending"] + r["model"]["starting"] for r in timeline], where="post",
            label="pending + starting")
    sim = context.sim.timeline
    ax.step([r["t_s"] / 60 for r in sim], [r["replicas"] for r in sim], where="post", label="simulated", alpha=0.5)
    ax.set_ylabel("replicas")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[2]
    ax.step(t, [r["warm"]["ready"] for r in timeline], where="post", label="warm slots ready")
    ax.step(t, [r["warm"]["pending"] for r in timeline], where="post", label="warm slots pending")
    ax.step(t, [r["nodes"] for r in timeline], where="post", label="GPU nodes")
    ax.set_ylabel("capacity")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[3]
    for c in classes:
        with np.errstate(invalid="ignore", divide="ignore"):
            ax.step(minutes, np.where(offered[c] > 0, shed[c] / np.maximum(offered[c], 1), 0), where="post", label=c)
    ax.set_ylabel("shed fraction")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[4]
    for c in classes:
        ax.step(minutes, p99[c], where="post", label=c)
    ax.axhline(context.config.slo_s, color="grey", linestyle="--", linewidth=0.8, label="SLO")
    ax.set_ylabel("p99 queue wait (s)")
    ax.set_xlabel("minute (factor 1)")
    ax.legend(loc="upper left", fontsize=8)
    for a in axes:
        a.grid(alpha=0.3)
    a = doc["slo_attainment"]
    fig.suptitle(f"closed loop, scenario {doc['scenario']} at factor {doc['factor']:g}: "
                 f"critical {a.get('critical', 0):.3%}, "
                 f"standard {a.get('standard', 0):.3%}, {doc['gpu_hours']:.1f} GPU-h "
                 f"(simulated {doc['simulated']['gpu_hours']:.1f})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
