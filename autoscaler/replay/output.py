"""Timeline outputs of a replay: a CSV, and a PNG of demand, replicas, warm slots, shed and latency."""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key, "")
        if value == "" or value is None:
            continue
        xs.append(float(row["t_s"]) / 3600.0)
        ys.append(float(value))
    return xs, ys


def write_plot(path: Path, rows: list[dict], *, title: str) -> None:
    """Four stacked panels sharing the time axis (hours)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 9), sharex=True)
    panels = [
        ("demand (req/s)", [("arrival_rate_per_s", "arrivals"), ("forecast_upper_per_s", "forecast upper bound")]),
        ("replicas", [("replicas", "decided"), ("ready", "ready"), ("recorded_replicas", "recorded"),
                      ("warm_slots", "warm slots")]),
        ("shed fraction", [(k, k.removeprefix("shed_")) for k in (rows[0] if rows else {}) if k.startswith("shed_")]),
        ("p99 queue wait (s)", [("p99_wait_s", "p99 wait")]),
    ]
    for ax, (label, keys) in zip(axes, panels):
        for key, name in keys:
            xs, ys = _series(rows, key)
            if xs:
                ax.step(xs, ys, where="post", label=name, linewidth=1)
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time (h)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
