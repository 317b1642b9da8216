"""The preflight's outputs: a terminal summary, a self-contained HTML report with its plots, a config file."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np
import yaml

from autoscaler.analyze.demand import Demand


def summary(a: dict) -> str:
    floor, bands, ceiling = a["concurrency_floor"], a["concurrency_bands"], a["burst_ceiling"]
    cold, res, var = a["cold_start_window_s"], a["residency"], a["duration_variance"]
    lines = [
        f"{a['input']['name']} ({a['input']['kind']}): {a['input']['span_h']} h, mean {a['input']['mean_rate_per_s']} "
        f"req/s, peak {a['input']['peak_rate_per_s']} req/s",
        "1. concurrency floor: p10 of 1-hour means {0} replicas ({1} requests in flight), of 10-minute means {2}; "
        "bands p10/p50/p90/p99 = {3}".format(
            floor["1h"]["replicas_p10"], floor["1h"]["concurrency_p10"], floor["10min"]["replicas_p10"],
            "/".join(f"{v:g}" for v in bands["replicas"].values())),
        f"2. bursts: {ceiling['count']} above the sustained level ({ceiling['by_class']['noise']} shorter than a pod "
        f"start-up: noise; {ceiling['by_class']['warm']} within the cold-start window of {cold['total']:.0f} s: warm "
        f"capacity; {ceiling['by_class']['capacity']} longer: capacity); "
        f"burst ceiling {ceiling['ceiling_replicas']:.0f} "
        f"replicas{' (the floor: no higher level lasted a cold start)' if ceiling['ceiling_raised_to_floor'] else ''} "
        f"(peak {ceiling['peak_replicas']}), reached {ceiling['ceiling_reached_times']} times",
        _residency_line(res, a["recommended"]["policy"]["replica_concurrency"]),
        _classes_line(a["classes"]),
        "   durations: service time p50/p90/p99 = " + "/".join(f"{v:g}" for v in var["service_s"].values())
        + f" s, c^2 = {var['squared_cv']}",
        f"5. idle gaps: {a['idle']['gaps']} (longest {a['idle']['longest_gap_s']:.0f} s); scale to zero "
        + (f"after {a['idle']['idle_after_s']:.0f} s idle (below)" if a["idle"]["idle_after_s"] is not None
           else "off: " + a["idle"]["why"]),
        "recommended policy:",
    ]
    rec = a["recommended"]
    for key, value in rec["policy"].items():
        if key in rec["why"] and key not in ("tick_s", "replica_concurrency", "slo_queue_wait_s"):
            lines.append(f"  {key}: {value}  # {rec['why'][key]}")
    return "\n".join(lines)


def _residency_line(res: dict, slots_per_replica: int) -> str:
    """Busy (at least one request in flight) and slot use side by side, with what links them: the requests
    a busy replica holds on average, so a high busy share next to a low slot use does not read as a
    contradiction."""
    held = res["in_flight_per_busy_replica"]
    return (f"3. residency vs compute ({res['loaded_from']}): {res['loaded_gpu_hours']} GPU-h loaded, "
            f"{res['busy_gpu_hours']} of them with at least one request in flight (loaded/busy "
            f"{res['residency_over_compute']}), {res['idle_loaded_gpu_hours']} GPU-h loaded with none; "
            f"{(res['slot_utilization'] or 0):.0%} of the loaded slots in use: a busy replica held "
            + (f"{held:g} requests on average of its {slots_per_replica} slots" if held is not None else "no request"))


def _classes_line(classes: dict) -> str:
    """Each class's share; the replicas shedding it would save only for the classes the policy sheds."""
    per = classes["per_class"]
    if not per:
        return (f"4. classes: not in the data ({classes['source']}): what can wait cannot be told from this "
                "input; record the per-priority arrival rates (arrival_rate_<class>) to get it")
    return f"4. classes ({classes['source']}): " + "; ".join(
        f"{name} {c['share_of_requests']:.0%} of requests, " + (
            f"shedding it saves {c['replicas_saved_at_peak_if_shed']} replicas at the peak" if c["sheddable"]
            else "never shed") for name, c in per.items())


def write_config(path: Path, a: dict) -> None:
    """A config file with the policy section, each field commented with its reason: `autoscaler run` takes
    it as its policy section, `autoscaler replay --policy` and the benchmark's --policy-config as they are."""
    rec = a["recommended"]
    lines = [f"# Written by `autoscaler analyze` from {a['input']['name']} ({a['input']['span_h']} h).",
             "# The policy section of the controller's config; `autoscaler replay --policy` and",
             "# `python -m loadtest.bench --policy-config` read it as is.", "policy:"]
    for key, value in rec["policy"].items():
        if key in rec["why"]:
            lines.append(f"  # {rec['why'][key]}")
        dumped = yaml.safe_dump({key: value}, default_flow_style=True).strip()[1:-1]
        lines.append(f"  {dumped}")
    path.write_text("\n".join(lines) + "\n")


def write_html(out: Path, a: dict, d: Demand) -> Path:
    """report.html (the summary, the figures, every number) and report.png (the four plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    hours = np.arange(len(d.needed)) * d.tick_s / 3600.0
    ax = axes[0, 0]
    if d.loaded is not None:  # a wide band under the other lines: visible where it meets one of them
        ax.step(hours, d.loaded, where="post", linewidth=4, alpha=0.45, color="orange", zorder=1,
                label="replicas loaded")
    ax.step(hours, d.needed, where="post", linewidth=0.6, label="replicas needed")
    # interleaved dashes: a ceiling equal to the floor shows both colours
    ax.axhline(a["concurrency_floor"]["replicas"], color="green", linestyle=(0, (4, 4)), linewidth=1, label="floor")
    for v in a["concurrency_bands"]["replicas"].values():
        ax.axhline(v, color="grey", linewidth=0.5, linestyle=":")
    ax.axhline(a["burst_ceiling"]["ceiling_replicas"], color="red", linestyle=(4, (4, 4)), linewidth=1,
               label="burst ceiling")
    ax.set_xlabel("hours")
    ax.set_ylabel("replicas")
    ax.set_title("1. demand: floor, bands (dotted), burst ceiling", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    for kind, color in {"noise": "grey", "warm": "orange", "capacity": "red"}.items():
        pts = [e for e in a["bursts"] if e["class"] == kind]
        ax.scatter([e["duration_s"] for e in pts], [e["height_replicas"] for e in pts], s=12, c=color, label=kind)
    cold = a["cold_start_window_s"]
    ax.axvline(cold["startup_s"], color="orange", linestyle="--", linewidth=0.8, label="pod start-up")
    ax.axvline(cold["total"], color="red", linestyle="--", linewidth=0.8, label="cold-start window")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a span under a decade
    ax.set_xlabel("burst duration (s)")
    ax.set_ylabel("height above sustained (replicas)")
    ax.set_title("2. bursts against the cold-start window", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    res = a["residency"]
    ax.barh(["loaded", "busy (>= 1 request)", "loaded, idle"], [res["loaded_gpu_hours"], res["busy_gpu_hours"],
                                                 res["idle_loaded_gpu_hours"]], color=["grey", "steelblue", "salmon"])
    ax.bar_label(ax.containers[0], fmt="%g GPU-h", fontsize=8)  # a zero bar still says so
    ax.set_xlim(0, 1.3 * max(res["loaded_gpu_hours"], res["busy_gpu_hours"], 1e-9))  # room for the labels
    ax.set_xlabel("GPU-hours")
    ax.set_title(f"3. residency against compute ({res['loaded_from']})", fontsize=10)
    ax = axes[1, 1]
    _plot_classes(ax, a["classes"])
    fig.suptitle(f"demand preflight: {a['input']['name']}")
    fig.tight_layout()
    png = out / "report.png"
    fig.savefig(png, dpi=80)
    plt.close(fig)
    data = base64.b64encode(png.read_bytes()).decode()
    body = [f"<h1>Demand preflight: {html.escape(a['input']['name'])}</h1>",
            f"<pre>{html.escape(summary(a))}</pre>",
            f"<img src='data:image/png;base64,{data}'/>",
            f"<h2>All figures</h2><pre>{html.escape(json.dumps(a, indent=1))}</pre>"]
    path = out / "report.html"
    path.write_text("<!doctype html><meta charset='utf-8'><title>preflight</title>"
                    "<style>pre { white-space: pre-wrap; }</style>" + "\n".join(body))
    return path


def _plot_classes(ax, classes: dict) -> None:
    """Panel 4: each class's share of requests; for the sheddable classes the replicas shedding them saves
    at the peak, written on the bar; without per-class data, a sentence saying so."""
    ax.set_title("4. what can wait", fontsize=10)
    per = classes["per_class"]
    if not per:
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"no class breakdown: not in the data\n({classes['source']})",
                ha="center", va="center", wrap=True, transform=ax.transAxes)
        return
    bars = ax.bar(list(per), [c["share_of_requests"] for c in per.values()], color="steelblue")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.3 * max(c["share_of_requests"] for c in per.values()) or 1)
    for rect, c in zip(bars, per.values()):
        note = (f"shed: saves {c['replicas_saved_at_peak_if_shed']}\nreplica(s) at the peak" if c["sheddable"]
                else "never shed")
        ax.annotate(note, (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center", va="bottom",
                    fontsize=8)
