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


def _series(rows: list[dict], key: str, start_s: float) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key, "")
        if value == "" or value is None:
            continue
        xs.append((float(row["t_s"]) - start_s) / 3600.0)
        ys.append(float(value))
    return xs, ys


# (column, label, style): drawn in this order, wide solid first, so a line that coincides with another
# (ready = decided once replicas land, recorded = decided when the policy agrees) stays visible on top
_REPLICA_LINES = (
    ("replicas", "decided", dict(linewidth=3.0, alpha=0.45)),
    ("recorded_replicas", "recorded (what ran)", dict(linewidth=1.5, linestyle="--")),
    ("ready", "ready", dict(linewidth=1.0, linestyle=":", color="black")),
)


def _replicas_panel(ax, rows: list[dict], start_s: float) -> None:
    for key, name, style in _REPLICA_LINES:
        xs, ys = _series(rows, key, start_s)
        if xs:
            ax.step(xs, ys, where="post", label=name, **style)
    xs, decided = _series(rows, "replicas", start_s)
    _, warm = _series(rows, "warm_slots", start_s)
    if xs and len(warm) == len(decided) and any(warm):
        ax.fill_between(xs, decided, [d + w for d, w in zip(decided, warm)], step="post", alpha=0.3,
                        color="tab:orange", label="warm slots (above decided)")


def write_plot(path: Path, rows: list[dict], *, title: str) -> None:
    """Four stacked panels on one time axis, hours from the start, labelled on every panel: demand and the
    forecast; decided, recorded and ready replicas with the warm slots above them; the shed fraction per
    class; the p99 queue wait. Simulated and open-loop timelines have the same columns, so the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start_s = float(rows[0]["t_s"]) if rows else 0.0
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    shed_keys = [k for k in (rows[0] if rows else {}) if k.startswith("shed_")]
    never = [k.removeprefix("shed_") for k in shed_keys if not any(_series(rows, k, start_s)[1])]
    shed_keys = [k for k in shed_keys if k.removeprefix("shed_") not in never]  # all-zero lines would hide each other
    simple = [
        (axes[0], "demand (req/s)", [("arrival_rate_per_s", "arrivals", {}),
                                     ("forecast_upper_per_s", "forecast upper bound", dict(linestyle="--"))]),
        (axes[2], "shed fraction", [(k, k.removeprefix("shed_"), {}) for k in shed_keys]),
        (axes[3], "p99 queue wait (s)", [("p99_wait_s", "p99 wait", {})]),
    ]
    for ax, label, keys in simple:
        for key, name, style in keys:
            xs, ys = _series(rows, key, start_s)
            if xs:
                ax.step(xs, ys, where="post", label=name, linewidth=1, **style)
        ax.set_ylabel(label)
    if never:
        axes[2].text(0.01, 0.9, "never shed: " + ", ".join(never), transform=axes[2].transAxes, fontsize=8)
    _replicas_panel(axes[1], rows, start_s)
    axes[1].set_ylabel("replicas")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
        elif not (ax is axes[2] and never):
            ax.text(0.5, 0.5, "not in the data", transform=ax.transAxes, ha="center", va="center", color="grey")
        ax.grid(alpha=0.3)
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("hours from the start", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
