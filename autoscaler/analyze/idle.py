"""Idle gaps in the demand and the `idle_after_s` they recommend (scale to zero).

A gap is a run of ticks with no request arriving and none in flight, between two ticks with demand (a
silence at either end of the input ends in no wake the data shows, and is left out). With `idle_after_s` W,
a gap of g seconds longer than W takes the model to zero for g - W seconds and ends in one cold start:
- saved: the replicas kept loaded through the gap without scale to zero (the floor, at least 1) x (g - W)
  GPU-seconds;
- paid: the start-up of those replicas when it wakes (each holds its GPU while it loads: `startup_s`
  GPU-seconds each) and the hold of the request that wakes it, one cold start (start-up + node
  provisioning) long, counted second for second against GPU-seconds. The requests arriving during that cold start are
  held too; their number (the rate after the gap x the cold start) is reported, not priced.
A gap not longer than W changes nothing. The net saving over all gaps falls as W grows between gap lengths
and jumps up past each (a gap that no longer reaches W stops costing a cold start), so its maximum is at the
smallest W the policy allows (IDLE_MIN_TICKS ticks) or one tick past a gap's length: those are the
candidates. The recommendation is the candidate with the largest net saving, the smallest on a tie; none
(scale to zero off) when no candidate saves more than its cold starts cost.

The data cannot tell idle time from a hole in its collection. A model idles down through one replica's
demand; when the demand on the ticks just before the gaps needs ABRUPT_REPLICAS or more (median), the gaps
may be holes, and scale to zero is not recommended on them (off, with what the best idle time would save if
they are real, to be checked first). Such a stop is what the policy's forecast takes for an ingress outage
whose traffic comes back all at once: at zero every return is a full cold start in which every request is
held, whatever its class, far beyond the queue-wait SLO. On servegen-m-small (gaps after 14 replicas'
worth) the recommended 60 s took critical attainment from 99.916 % to 99.455 % in the benchmark
(docs/scale-to-zero.md), below the 99.9 % target, for 0.4 % fewer GPU-hours.
"""

from __future__ import annotations

import numpy as np

from autoscaler.analyze.demand import Demand
from policies.spec import IDLE_MIN_TICKS

# Demand that stops from this many replicas' worth in one tick looks like a hole in the data, not idleness.
ABRUPT_REPLICAS = 2


def idle_gaps(d: Demand) -> list[dict]:
    """The interior runs of ticks with no demand: start, length (s) and the arrival rate on the tick after."""
    quiet = (d.rate <= 0) & (d.concurrency <= 0)
    gaps, start = [], None
    for i, q in enumerate(quiet):
        if q and start is None:
            start = i
        elif not q and start is not None:
            if start > 0:  # a silence from the first tick has no start the data shows
                gaps.append({"start_s": start * d.tick_s, "length_s": (i - start) * d.tick_s,
                             "rate_after_per_s": float(d.rate[i]), "needed_before": int(d.needed[start - 1])})
            start = None
    return gaps


def _net(gaps: list[dict], *, window_s: float, replicas: int, wake_cost_s: float) -> dict:
    hit = [g for g in gaps if g["length_s"] > window_s]
    saved_s = replicas * sum(g["length_s"] - window_s for g in hit)
    return {"idle_after_s": window_s, "wakes": len(hit), "saved_gpu_s": saved_s, "cost_s": len(hit) * wake_cost_s,
            "net_s": saved_s - len(hit) * wake_cost_s}


def recommend_idle(d: Demand, *, tick_s: float, floor_replicas: int, startup_s: float, cold_start_s: float) -> dict:
    """The `idle_after_s` to recommend (None: off), the figures behind it and the reason in words."""
    gaps = idle_gaps(d)
    replicas = max(1, floor_replicas)
    wake_cost_s = replicas * startup_s + cold_start_s
    shortest = IDLE_MIN_TICKS * tick_s
    windows = sorted({shortest} | {g["length_s"] + tick_s for g in gaps if g["length_s"] + tick_s > shortest})
    candidates = [_net(gaps, window_s=w, replicas=replicas, wake_cost_s=wake_cost_s) for w in windows]
    best = max(candidates, key=lambda c: (c["net_s"], -c["idle_after_s"]))
    lengths = np.array([g["length_s"] for g in gaps])
    out = {"gaps": len(gaps), "replicas_kept_through_a_gap": replicas, "wake_cost_s": wake_cost_s,
           "startup_s": startup_s, "cold_start_s": cold_start_s,
           "gap_p50_s": float(np.percentile(lengths, 50)) if len(gaps) else 0.0,
           "gap_p90_s": float(np.percentile(lengths, 90)) if len(gaps) else 0.0,
           "longest_gap_s": float(lengths.max()) if len(gaps) else 0.0,
           "candidates": candidates[:20]}
    if best["net_s"] <= 0:
        out["idle_after_s"] = None
        out["why"] = _why_off(out, replicas=replicas)
        return out
    hit = [g for g in gaps if g["length_s"] > best["idle_after_s"]]
    held = sum(g["rate_after_per_s"] for g in hit) / len(hit) * cold_start_s
    abrupt = _abrupt_replicas(gaps)
    out["idle_after_s"] = None if abrupt else best["idle_after_s"]
    out["best"] = best
    out["why"] = (
        (f"the demand stops from {abrupt:.0f} replicas' worth (median) in one tick, which looks like holes in the "
         "data's collection (or outages whose traffic returns at once) rather than idle time: leave idle_after_s "
         "unset. CHECK THE GAPS FIRST; only if they are real idle time: " if abrupt else "")
        + f"{len(gaps)} idle gaps (p50 {out['gap_p50_s']:.0f} s, p90 {out['gap_p90_s']:.0f} s, longest "
        f"{out['longest_gap_s']:.0f} s); after {best['idle_after_s']:.0f} s idle, {best['wakes']} of them go to zero: "
        f"{best['saved_gpu_s'] / 3600:.2f} GPU-h saved ({replicas} replica(s) x the rest of each gap) against "
        f"{best['cost_s'] / 3600:.2f} h of cold starts ({best['wakes']} x ({replicas} x {startup_s:.0f} s of "
        f"start-up on the GPU + {cold_start_s:.0f} s of hold for the waking request)); net "
        f"{best['net_s'] / 3600:.2f} h, the most of any idle time. Each wake holds the requests of one cold "
        f"start (about {held:.0f} at the rate after the gaps)"
    )
    return out


def _abrupt_replicas(gaps: list[dict]) -> float:
    """The median replicas' worth of demand just before the gaps, if it is ABRUPT_REPLICAS or more (else 0)."""
    before = float(np.median([g["needed_before"] for g in gaps]))
    return before if before >= ABRUPT_REPLICAS else 0.0


def _why_off(out: dict, *, replicas: int) -> str:
    if not out["gaps"]:
        return "no idle gap in the data: scale to zero would never fire (leave idle_after_s unset)"
    pays_beyond_s = out["wake_cost_s"] / replicas
    return (f"{out['gaps']} idle gaps, the longest {out['longest_gap_s']:.0f} s: a gap pays only beyond "
            f"idle_after_s + {pays_beyond_s:.0f} s ({replicas} x {out['startup_s']:.0f} s of start-up on the GPU + "
            f"{out['cold_start_s']:.0f} s of hold, over the {replicas} replica(s) kept), and no idle time saves more "
            f"than its cold starts cost: leave idle_after_s unset")
