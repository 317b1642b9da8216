"""The four preflight questions, answered from the demand, and the policy settings they lead to.

1. Concurrency floor: the low percentiles (p5, p10) of 10-minute and 1-hour means of the concurrency and of
   the replicas needed, and by hour of day (data spanning a day) and day of week (a week); the bands the
   demand lives in (p10/p50/p90/p99 of replicas needed), the share of time in each and how long a stay
   lasts.
2. Burst versus noise: every excursion of the replicas needed above the sustained level (the trailing
   1-hour median) by at least 20 % and one replica, with its height and duration, classed against pod
   start-up and the cold-start window (start-up + node provisioning): shorter than start-up is noise to
   queue or shed; between start-up and the cold start, warm capacity can serve it (a replica on a warm slot
   lands after start-up only); longer needs capacity. The burst ceiling is the highest level held longer
   than the cold-start window (the maximum of the rolling minimum over that window), and how often it is
   reached; it is never below the floor (the policy keeps the floor loaded whatever the bursts do).
3. Residency versus compute: replicas loaded (a recording's ready replicas; for a trace the replicas the
   demand needed, said so) against replicas busy (with at least one request: min(loaded, in-flight) under a
   least-loaded balancer) and slots used (in-flight / slots); the GPU-hours loaded but idle. Busy and slots
   answer different questions: a replica with one request in flight is busy while most of its slots are free,
   so the requests a busy replica holds on average are given with them.
4. What can wait: per priority class its share of requests and of load, its latency tolerance (the SLO;
   the saturation guard's queue depth for guarded classes), the replicas shedding it would save at the peak
   (the report offers it for the sheddable classes only; a recording without per-priority series says so
   instead of a breakdown); the variance of request durations (service time, tokens) and what it means for slots.

Besides the four: the idle gaps, and the `idle_after_s` they recommend for scale to zero (`idle.py`).

`recommend` turns the answers into a policy section (see its docstring), each number with its reason.
"""

from __future__ import annotations

import math

import numpy as np

from autoscaler.analyze.demand import Demand, replicas_needed
from autoscaler.analyze.idle import recommend_idle
from policies import PolicySpec
from policies.stages.shedding import saturation_depths

BURST_MIN_RATIO, BURST_MIN_REPLICAS = 0.2, 1
SUSTAINED_WINDOW_S = 3600.0


def _rolling_mean(x: np.ndarray, n: int) -> np.ndarray:
    n = max(1, min(n, len(x)))
    c = np.concatenate([[0.0], np.cumsum(x, dtype=float)])
    return (c[n:] - c[:-n]) / n


def _rolling_min(x: np.ndarray, n: int) -> np.ndarray:
    n = max(1, min(n, len(x)))
    if len(x) < n:
        return np.array([x.min()]) if len(x) else x
    return np.lib.stride_tricks.sliding_window_view(x, n).min(axis=1)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def concurrency_floor(d: Demand) -> dict:
    ticks_10m, ticks_1h = round(600 / d.tick_s), round(3600 / d.tick_s)
    out: dict = {}
    for label, n in (("10min", ticks_10m), ("1h", ticks_1h)):
        conc, need = _rolling_mean(d.concurrency, n), _rolling_mean(d.needed.astype(float), n)
        out[label] = {"concurrency_p5": round(_pct(conc, 5), 2), "concurrency_p10": round(_pct(conc, 10), 2),
                      "replicas_p5": round(_pct(need, 5), 2), "replicas_p10": round(_pct(need, 10), 2)}
    if d.span_s >= 86400:
        hours = ((d.start_s + np.arange(len(d.needed)) * d.tick_s) // 3600 % 24).astype(int)
        means = _rolling_mean(d.needed.astype(float), ticks_10m)
        by_hour = {}
        for h in range(24):
            sel = means[hours[: len(means)] == h]
            if len(sel):
                by_hour[h] = round(_pct(sel, 10), 2)
        out["by_hour_replicas_p10"] = by_hour
    if d.span_s >= 7 * 86400:
        days = ((d.start_s + np.arange(len(d.needed)) * d.tick_s) // 86400 % 7).astype(int)
        means = _rolling_mean(d.needed.astype(float), ticks_1h)
        out["by_weekday_replicas_p10"] = {int(day): round(_pct(means[days[: len(means)] == day], 10), 2)
                                          for day in range(7) if (days[: len(means)] == day).any()}
    out["replicas"] = max(1, math.floor(out["1h"]["replicas_p10"]))
    return out


def concurrency_bands(d: Demand) -> dict:
    edges = {q: _pct(d.needed, q) for q in (10, 50, 90, 99)}
    bounds = [0.0, edges[10], edges[50], edges[90], edges[99], float(d.needed.max()) + 1]
    names = ["below p10", "p10-p50", "p50-p90", "p90-p99", "above p99"]
    band = np.clip(np.searchsorted(bounds, d.needed, side="right") - 1, 0, len(names) - 1)
    stays = {}
    for i, name in enumerate(names):
        inside = band == i
        runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], inside.astype(int), [0]]))))[::2]
        stays[name] = {"share_of_time": round(float(inside.mean()), 4),
                       "mean_stay_s": round(float(runs.mean() * d.tick_s), 1) if len(runs) else 0.0}
    return {"replicas": {f"p{q}": round(v, 2) for q, v in edges.items()}, "bands": stays}


def bursts(d: Demand, *, startup_s: float, cold_start_s: float, floor_replicas: int = 0) -> tuple[list[dict], dict]:
    n = max(1, round(SUSTAINED_WINDOW_S / d.tick_s))
    needed = d.needed.astype(float)
    sustained = np.array([np.median(needed[max(0, i - n):i + 1]) for i in range(len(needed))]) if len(needed) < 5000 \
        else _trailing_median(needed, n)
    above = (needed >= sustained * (1 + BURST_MIN_RATIO)) & (needed - sustained >= BURST_MIN_REPLICAS)
    events = []
    i = 0
    while i < len(above):
        if not above[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(above) and (above[j + 1] or (j + 2 < len(above) and above[j + 2])):
            j += 1
        base = float(sustained[i])
        height = float(needed[i:j + 1].max() - base)
        duration = (j - i + 1) * d.tick_s
        kind = "noise" if duration < startup_s else "warm" if duration < cold_start_s else "capacity"
        events.append({"start_s": round(i * d.tick_s, 1), "duration_s": duration, "height_replicas": round(height, 1),
                       "height_ratio": round(height / max(base, 1.0), 3), "class": kind})
        i = j + 1
    window = max(1, round(cold_start_s / d.tick_s))
    held = _rolling_min(needed, window)
    held_max = float(held.max()) if len(held) else 0.0
    ceiling = max(held_max, float(floor_replicas))  # the policy keeps the floor loaded: no ceiling below it
    reached = needed >= 0.95 * ceiling
    episodes = int(np.sum(np.diff(np.concatenate([[0], reached.astype(int)])) == 1))
    summary = {"count": len(events), "by_class": {k: sum(1 for e in events if e["class"] == k)
                                                  for k in ("noise", "warm", "capacity")},
               "ceiling_replicas": ceiling, "held_longer_than_cold_start_replicas": held_max,
               "ceiling_raised_to_floor": held_max < ceiling, "peak_replicas": int(needed.max()) if len(needed) else 0,
               "ceiling_reached_times": episodes,
               "ceiling_reached_per_day": round(episodes / max(d.span_s / 86400, 1e-9), 2)}
    return events, summary


def _trailing_median(x: np.ndarray, n: int) -> np.ndarray:
    """Trailing median over n ticks, computed on a stride of n/8 ticks (fast enough for weeks of ticks)."""
    step = max(1, n // 8)
    out = np.empty(len(x))
    for start in range(0, len(x), step):
        out[start:start + step] = np.median(x[max(0, start - n):start + 1])
    return out


def residency(d: Demand, spec: PolicySpec) -> dict:
    measured = d.loaded is not None and np.isfinite(d.loaded).any()
    loaded = np.where(np.isfinite(d.loaded), d.loaded, 0.0) if measured else d.needed.astype(float)
    busy = np.minimum(loaded, np.ceil(d.concurrency))
    hours = d.tick_s / 3600.0
    loaded_h, busy_h = float(loaded.sum() * hours), float(busy.sum() * hours)
    slots = loaded * spec.replica_concurrency
    return {
        "loaded_from": "recorded ready replicas" if measured else
                       "not in the data: the replicas the demand needed at the SLO",
        "loaded_gpu_hours": round(loaded_h, 2),
        "busy_gpu_hours": round(busy_h, 2),
        "residency_over_compute": round(loaded_h / busy_h, 3) if busy_h else None,
        "busy_share_per_replica": round(busy_h / loaded_h, 4) if loaded_h else None,
        "slot_utilization": round(float(d.concurrency.sum() / slots.sum()), 4) if slots.sum() else None,
        "in_flight_per_busy_replica": round(float(d.concurrency.sum() / busy.sum()), 2) if busy.sum() else None,
        "idle_loaded_gpu_hours": round(loaded_h - busy_h, 2),
    }


def classes(d: Demand, spec: PolicySpec) -> dict:
    peak = int(np.argmax(d.needed)) if len(d.needed) else 0
    depths = saturation_depths(spec, int(d.needed[peak]) if len(d.needed) else 0, float(d.service_s[peak]))
    out = {"source": d.class_source, "per_class": {}}
    for name, share in d.class_share.items():
        without = replicas_needed(spec, d.rate[peak:peak + 1] * (1 - share), d.service_s[peak:peak + 1])[0]
        priority = spec.priorities.get(name)
        out["per_class"][name] = {
            "share_of_requests": round(share, 4), "share_of_load": round(share, 4),
            "priority": priority,
            "sheddable": priority is not None and priority < spec.shed_priority_below,
            "tolerance": (f"queue wait <= {spec.slo_queue_wait_s:g} s" if name not in depths else
                          f"rejected once the queue means {depths[name]} waiting requests at the peak"),
            "replicas_saved_at_peak_if_shed": int(d.needed[peak] - without),
        }
    return out


def duration_variance(d: Demand) -> dict:
    if d.request_service_s is not None and len(d.request_service_s):
        s = d.request_service_s
        source = "per request"
    else:
        s = d.service_s
        source = "per-tick means only (the recording has no per-request times): the spread is understated"
    scv = float(s.var() / s.mean() ** 2) if s.mean() > 0 else 0.0
    out = {"source": source,
           "service_s": {f"p{q}": round(_pct(s, q), 3) for q in (50, 90, 99)},
           "squared_cv": round(scv, 3),
           "meaning": (f"a slot is held p99/p50 = {_pct(s, 99) / max(_pct(s, 50), 1e-9):.1f}x longer by the slowest "
                       f"1 %; with service-time variability c^2 = {scv:.2f}, queue waits are about "
                       f"(1 + c^2)/2 = {(1 + scv) / 2:.2f}x what the exponential model the policy sizes with predicts "
                       f"(the SLO feedback absorbs the difference)")}
    for kind, tokens in d.request_tokens.items():
        out[f"{kind}_tokens"] = {f"p{q}": round(_pct(tokens, q), 1) for q in (50, 90, 99)}
    return out


def shed_budget_level(
    d: Demand, spec: PolicySpec, *, max_shed: float = 0.05, peaks_share: float = 0.5
) -> tuple[int, float]:
    """The fewest replicas whose excess demand the sheddable classes can absorb: above C replicas a tick
    needing N_t sheds about (N_t - C) / N_t of its requests, which must stay within the sheddable classes'
    share, and over the whole input within `peaks_share` of the `max_shed` they may lose (the other half is
    left for what the saturation guard rejects while capacity is on its way, and for bursts inside a tick
    that a tick's mean does not show). Returns (C, the budget's share of all requests)."""
    shares = d.class_share or {}
    sheddable = sum(v for c, v in shares.items() if spec.priorities.get(c, 0) < spec.shed_priority_below)
    budget = max_shed * peaks_share * sheddable
    needed = d.needed.astype(float)
    weights = d.rate / max(d.rate.sum(), 1e-12)
    peak = int(needed.max()) if len(needed) else 0
    for c in range(0, peak + 1):
        excess = np.where(needed > 0, np.maximum(0.0, 1.0 - c / np.maximum(needed, 1e-9)), 0.0)
        if excess.max(initial=0.0) <= sheddable and float((weights * excess).sum()) <= budget:
            return c, budget
    return peak, budget


def recommend(d: Demand, spec: PolicySpec, answers: dict) -> dict:
    """The policy section: min_replicas from the floor (p10 of 1-hour means of the replicas needed),
    max_replicas from the burst ceiling plus the queueing margin the policy sizes with (it scales to the
    ceiling, not beyond: higher peaks are shorter than a cold start and are queued or shed), the warm pool
    from the bursts that are longer than pod start-up but shorter than the cold-start window (a warm slot
    serves them; a new node would not), the lead time from the measured start-up, the sheddable classes and
    their guard depths as they stand, `idle_after_s` from the idle gaps when one pays (`idle.py`). Every
    number comes with its reason."""
    floor = answers["concurrency_floor"]["replicas"]
    # the level itself, not the ceiling the report draws (raised to the floor): the floor is already kept
    ceiling = answers["burst_ceiling"]["held_longer_than_cold_start_replicas"]
    peak = answers["burst_ceiling"]["peak_replicas"]
    warm = [e for e in answers["bursts"] if e["class"] == "warm"]
    warm_slots = math.ceil(np.percentile([e["height_replicas"] for e in warm], 90)) if warm else 0
    absorbable, budget = shed_budget_level(d, spec)
    maximum = max(floor + 1, math.ceil(ceiling * 1.25), absorbable, 2)
    policy = {
        "tick_s": spec.tick_s,
        "replica_concurrency": spec.replica_concurrency,
        "slo_queue_wait_s": spec.slo_queue_wait_s,
        "min_replicas": floor,
        "max_replicas": maximum,
        "default_startup_s": round(answers["cold_start_window_s"]["startup_s"], 1),
        "node_provisioning_s": round(answers["cold_start_window_s"]["node_provisioning_s"], 1),
        "max_warm_slots": warm_slots,
        "priorities": dict(spec.priorities),
        "shed_priority_below": spec.shed_priority_below,
        "saturation_wait_ratio": spec.saturation_wait_ratio,
        "saturation_wait_max_ratio": spec.saturation_wait_max_ratio,
    }
    idle = answers["idle"]
    if idle["idle_after_s"] is not None:
        policy["idle_after_s"] = idle["idle_after_s"]
    sheddable = [c for c, p in spec.priorities.items() if p < spec.shed_priority_below]
    why = {
        "idle_after_s": idle["why"],
        "min_replicas": f"the demand never needed fewer than {answers['concurrency_floor']['1h']['replicas_p10']:.1f} "
                        f"replicas in 90 % of its 1-hour windows: keep {floor} loaded",
        "max_replicas": f"the highest level held longer than a cold start needs {ceiling:.0f} replicas (+25 % for "
                        f"the forecast's margins: {math.ceil(ceiling * 1.25)}), and above {absorbable} replicas the "
                        f"excess of the peaks would exceed what the sheddable classes may shed ({budget:.1%} of all "
                        f"requests); peaks above {maximum} (the peak tick needs {peak}) are shorter than a cold start "
                        f"and are queued or shed",
        "default_startup_s": "pod start-up, " + answers["cold_start_window_s"]["source"],
        "node_provisioning_s": "node provisioning, " + answers["cold_start_window_s"]["node_source"],
        "max_warm_slots": (f"{len(warm)} bursts lasted longer than a pod start-up but less than a cold start; the "
                           f"90th percentile of their height is {warm_slots} replicas: a warm slot serves them, a new "
                           f"node would arrive after they ended (the pool kept at any time follows the growth risk "
                           f"of the last days, up to this)" if warm else
                           "no burst lasted between a pod start-up and a cold start: no warm slot is needed for them"),
        "shed_priority_below": f"classes below {spec.shed_priority_below} are shed ({', '.join(sheddable) or 'none'}); "
                               "the highest class is never shed nor guarded",
        "saturation_wait_ratio": "the lowest guarded class is rejected once the queue means this share of the SLO",
        "tick_s": "the control loop's period (unchanged)",
        "replica_concurrency": "slots per replica (unchanged: the model server's setting)",
        "slo_queue_wait_s": "the queue-wait objective (unchanged)",
    }
    return {"policy": policy, "why": why}


def answer(d: Demand, spec: PolicySpec, *, startup_s: float | None, node_provisioning_s: float | None) -> dict:
    if startup_s is None and d.startup_s:
        startup, source = float(np.percentile(d.startup_s, 90)), f"p90 of {len(d.startup_s)} recorded pod start-ups"
    elif startup_s is not None:
        startup, source = startup_s, "from --startup-s"
    else:
        startup, source = spec.default_startup_s, "the policy's default (no start-ups in the data; --startup-s sets it)"
    provisioning = node_provisioning_s if node_provisioning_s is not None else spec.node_provisioning_s
    node_source = "from --node-provisioning-s" if node_provisioning_s is not None else "the policy's default"
    cold = startup + provisioning
    floor = concurrency_floor(d)
    events, summary = bursts(d, startup_s=startup, cold_start_s=cold, floor_replicas=floor["replicas"])
    answers = {
        "input": {"name": d.name, "kind": d.source, "span_h": round(d.span_s / 3600, 2), "ticks": len(d.needed),
                  "tick_s": d.tick_s, "mean_rate_per_s": round(float(d.rate.mean()), 3),
                  "peak_rate_per_s": round(float(d.rate.max()), 3)},
        "concurrency_floor": floor,
        "concurrency_bands": concurrency_bands(d),
        "bursts": events,
        "burst_ceiling": summary,
        "cold_start_window_s": {"startup_s": startup, "node_provisioning_s": provisioning, "total": cold,
                                "source": source, "node_source": node_source},
        "residency": residency(d, spec),
        "classes": classes(d, spec),
        "duration_variance": duration_variance(d),
        "idle": recommend_idle(d, tick_s=spec.tick_s, floor_replicas=floor["replicas"], startup_s=startup,
                               cold_start_s=cold),
    }
    answers["recommended"] = recommend(d, spec, answers)
    return answers
