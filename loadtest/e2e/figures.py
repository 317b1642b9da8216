"""The figures of a closed-loop run, from what the client saw and what the apiserver recorded, and the same
figures from the simulator on the same trace and parameters.

- `slo_attainment` per class: requests answered 200 whose queue wait (the server's `x-queue-seconds`, plus
  the hold at the gateway for a held request) was within the SLO, over all requests of the class (a shed,
  dropped or lost request is a miss);
- `p99_latency_s` per class: p99 of the whole exchange of answered requests; `p99_queue_wait_s` overall;
- `shed_fraction` per class: answered 429 by the gateway;
- `lost_requests`: admitted (not shed) but never answered (a connection error or a 5xx other than a
  deliberate 503 with Retry-After: a request held for a replica that did not come within `max_hold_s`);
- scale to zero (`holds`, `wake`): a request is held when the gateway's answer says so (X-Held-Seconds, the
  load generator's `gateway_hold_s`), or is a deliberate 503; its hold is its whole exchange less the server's
  queue and service time. Records made before the gateway sent the header count a request as held when it
  waited longer than `HELD_MIN_WALL_S` of wall clock, which a request that is not held does not do unless
  the machine stalls (the admission endpoint's ordinary subrequest times out at 250 ms): a hold of up to 5 s
  at factor 10 went uncounted there, and such a request met the 2-s SLO; in a run whose model does not scale
  to zero no request is held (`annotate_holds`'s `holding`): there a half-second stall of the load generator
  or nginx on a loaded machine, 5 s at factor 10, was counted as a hold before and failed the doubling drill's
  critical class (run 34); `held_requests`, `hold_p50_s`, `hold_p99_s` of the held, `dropped_held` (503 with
  Retry-After); `min_replicas_seen`; `cold_start_s`: from the first request after the silence to the first one
  admitted to a replica; `first_answer_s`: to the end of the first answer; `replicas_after_wake`: the most
  replicas ordered after it;
- `gpu_hours`: GPUs x lifetime of every GPU node while the scenario ran, from its NodeClaim's creation (the
  instance's launch) to its removal (nodes are what is paid for: warm slots, idle nodes and nodes still
  starting included), at factor 1;
- `max_pending_replicas`: most model replicas ordered but not Ready at once.
"""

from __future__ import annotations

import numpy as np

from autoscaler.sim.run import RunResult
from autoscaler.sim.workload import ServerModel
from loadtest.measure import warm_pool_gpu_hours

HELD_MIN_WALL_S = 0.5


def deliberate_503(record: dict) -> bool:
    """A 503 with Retry-After: the gateway's answer to a request held longer than `max_hold_s`."""
    return record["status"] == 503 and record.get("retry_after") is not None


def annotate_holds(records: list[dict], requests: dict, *, server: ServerModel, factor: float,
                   holding: bool = True) -> None:
    """Give each record its `hold_s` at the gateway (0.0 unless held; see the module docstring). `requests`: by
    index, with their token counts (the server's service time, at factor 1). `holding`: whether the gateway
    can hold this run's requests at all (the model scales to zero); when it cannot, no request was held, and
    time spent outside the server is the harness's transport on the wall clock (a load generator or nginx
    stalled for half a second under the machine's load reads as 5 s at factor 10), not queue wait: every
    `hold_s` is 0.0."""
    for r in records:
        if not holding:
            r["hold_s"] = 0.0
            continue
        if r["status"] == 200 and r["queue_s"] is not None and r["latency_s"] is not None:
            req = requests[r["i"]]
            waited = r["latency_s"] - r["queue_s"] - server.service_s(req.input_tokens, req.output_tokens)
        else:
            waited = r["latency_s"] if deliberate_503(r) and r["latency_s"] is not None else 0.0
        if "gateway_hold_s" in r:  # the gateway said which requests it held (X-Held-Seconds), and how long
            said = r["gateway_hold_s"]
            r["hold_s"] = max(waited, said or 0.0, 0.0) if said is not None or deliberate_503(r) else 0.0
        else:
            r["hold_s"] = waited if waited > HELD_MIN_WALL_S * factor else 0.0


def holds(records: list[dict]) -> dict:
    held = [r["hold_s"] for r in records if r.get("hold_s", 0.0) > 0]

    def pct(q: float) -> float | None:
        return round(float(np.percentile(held, q)), 1) if held else None

    return {"held_requests": len(held), "hold_p50_s": pct(50), "hold_p99_s": pct(99),
            "dropped_held": sum(1 for r in records if deliberate_503(r))}


def wake(records: list[dict], timeline: list[dict], *, after_s: float) -> dict:
    """How the model came back from zero for the requests sent from `after_s` on (scenario time, factor 1)."""
    later = [r for r in records if r["sent_s"] >= after_s]
    first = min((r["sent_s"] for r in later), default=None)
    answered = [r for r in later if r["status"] == 200]
    ordered = [r["spec_replicas"] for r in timeline if r["spec_replicas"] is not None]
    return {
        "min_replicas_seen": min(ordered, default=None),
        "cold_start_s": round(min(r["sent_s"] + r.get("hold_s", 0.0) for r in answered) - first, 1)
        if answered else None,
        "first_answer_s": round(min(r["sent_s"] + r["latency_s"] for r in answered) - first, 1) if answered else None,
        "replicas_after_wake": max((r["spec_replicas"] for r in timeline
                                    if r["t_s"] >= after_s and r["spec_replicas"] is not None), default=None),
    }


def within_slo(record: dict, slo_s: float) -> bool:
    """A request met its SLO: answered 200 with its queue wait, plus any hold at the gateway, within `slo_s`."""
    return (record["status"] == 200 and record["queue_s"] is not None
            and record["queue_s"] + record.get("hold_s", 0.0) <= slo_s)


def client_figures(records: list[dict], classes: tuple[str, ...], slo_s: float) -> dict:
    by_class: dict[str, list[dict]] = {c: [] for c in classes}
    for r in records:
        by_class.setdefault(r["class"], []).append(r)
    attainment, p99, shed = {}, {}, {}
    lost = 0
    admitted_waits = []
    for cls, rows in by_class.items():
        if not rows:
            continue
        met = sum(1 for r in rows if within_slo(r, slo_s))
        attainment[cls] = met / len(rows)
        latencies = [r["latency_s"] for r in rows if r["status"] == 200]
        p99[cls] = float(np.percentile(latencies, 99)) if latencies else None
        shed[cls] = sum(1 for r in rows if r["status"] == 429) / len(rows)
        lost += sum(1 for r in rows if r["status"] == 0 or (r["status"] >= 500 and not deliberate_503(r)))
        admitted_waits += [r["queue_s"] for r in rows if r["status"] == 200 and r["queue_s"] is not None]
    return {
        "requests": len(records),
        "slo_attainment": attainment,
        "p99_latency_s": p99,
        "p99_queue_wait_s": float(np.percentile(admitted_waits, 99)) if admitted_waits else None,
        "shed_fraction": shed,
        "lost_requests": lost,
        "late_sends": sum(1 for r in records if r.get("late_s", 0) > 1.0),
    }


def gpu_hours(lifetimes: dict, *, start: float, end: float, factor: float) -> dict:
    """GPU-hours of nodes (what is paid: each NodeClaim from its launch to its removal, as the simulator bills a
    node from its request), and of model pods and placeholders (what used them), at factor 1."""
    totals = {"nodes": 0.0, "model": 0.0, "placeholders": 0.0}
    billed = {"claim": "nodes", "model": "model", "placeholder": "placeholders"}
    for (kind, _), life in lifetimes.items():
        lo, hi = max(life["created"], start), min(life["gone"] or end, end)
        if kind not in billed or hi <= lo:
            continue
        totals[billed[kind]] += life["gpus"] * (hi - lo) * factor / 3600.0
    return {k: round(v, 3) for k, v in totals.items()}


def node_timings(lifetimes: dict, *, factor: float, idle_s: float, capped: frozenset[str] = frozenset(),
                 start: float | None = None) -> dict:
    """What the live cluster's nodes took, at factor 1, for the simulated twin: `provisioning_s` (median) and
    `provisioning_p90_s` of the waits of pods placed on a node created after them (creation -> placement, what
    the controller learns; not the pods named in `capped`, which the provisioner said it could not place, as
    the controller leaves them out), and `removal_extra_s` (median) of how long a node outlived its last pod beyond
    consolidateAfter (`idle_s`). None where the run had no such pod or node. Karpenter batches and validates
    in real time, which the compression of every other duration magnifies by the factor. With `start` (the
    run's start, on the lifetimes' clock): `wait_series`, each wait as [its pod's creation in scenario seconds,
    the wait, and a model pod's start-up where it has one], in order of creation and placement, and
    `startup_series`, each model pod's start-up (placement -> Ready, the conditions' times where read) as
    [its creation, the start-up], in order of creation and readiness (the pods the limit held too: the twin
    keys a replica by its order), which the twin replays (`ClusterModel.node_waits`, `startups`)."""
    nodes = {life["name"]: life for (kind, _), life in lifetimes.items() if kind == "node" and "name" in life}
    pods = [life for (kind, _), life in lifetimes.items()
            if kind in ("model", "placeholder") and life.get("node") in nodes]
    waited = sorted((p for p in pods if nodes[p["node"]]["created"] > p["created"] and p["placed"] >= p["created"]
                     and p.get("name") not in capped), key=lambda p: (p["created"], p["placed"]))
    waits = [(p["placed"] - p["created"]) * factor for p in waited]
    extras = []
    for name, node in nodes.items():
        ran = [p for p in pods if p["node"] == name]
        if node["gone"] is None or not ran or any(p["gone"] is None for p in ran):
            continue
        extras.append(max(0.0, (node["gone"] - max(p["gone"] for p in ran)) * factor - idle_s))

    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)), 1) if values else None

    out = {"provisioning_s": pct(waits, 50), "provisioning_p90_s": pct(waits, 90), "waits": len(waits),
           "removal_extra_s": pct(extras, 50), "removals": len(extras)}
    if start is not None:
        def at(p: dict) -> float:
            return round((p["created"] - start) * factor, 1)

        def ready(p: dict) -> float | None:  # the Ready condition's time where it was read, else when seen
            return p.get("ready_at") if p.get("ready_at") is not None else p.get("ready")

        started = sorted((p for (kind, _), p in lifetimes.items() if kind == "model" and p.get("placed") is not None
                          and ready(p) is not None and ready(p) >= p["placed"]),
                         key=lambda p: (p["created"], ready(p)))
        def startup(p: dict) -> float:
            return round((ready(p) - p["placed"]) * factor, 1)

        counted = {id(p) for p in started}  # a model pod that waited is replayed with its start-up
        out["wait_series"] = [[at(p), round(w, 1), *([startup(p)] if id(p) in counted else [])]
                              for p, w in zip(waited, waits)]
        out["startup_series"] = [[at(p), startup(p)] for p in started]
    return out


def simulated_figures(result: RunResult) -> dict:
    timeline = result.timeline
    pending = max((r["replicas"] - r["ready"] for r in timeline if r["ready"] != ""), default=0)
    return {
        "slo_attainment": result.outcome["slo_attainment"],
        "shed_fraction": result.outcome["shed_by_class"],
        "p99_queue_wait_s": result.outcome["p99_queue_wait_s"],
        "gpu_hours": round(result.costs.replica_gpu_hours, 3),
        "warm_pool_gpu_hours": round(warm_pool_gpu_hours(result.costs), 3),
        "max_pending_replicas": pending,
        "scaling_actions": result.scaling_actions,
        **({"hold": result.outcome["hold"]} if "hold" in result.outcome else {}),  # scale to zero: the twin's holds
    }


def gaps(live: dict, simulated: dict) -> dict:
    """Live minus simulated: attainment and shed in percentage points, GPU-hours in percent."""
    out: dict = {"slo_attainment_points": {}, "shed_fraction_points": {}}
    for cls, value in live["slo_attainment"].items():
        if cls in simulated["slo_attainment"]:
            out["slo_attainment_points"][cls] = round(100 * (value - simulated["slo_attainment"][cls]), 3)
    for cls, value in live["shed_fraction"].items():
        if cls in simulated["shed_fraction"]:
            out["shed_fraction_points"][cls] = round(100 * (value - simulated["shed_fraction"][cls]), 3)
    if simulated["gpu_hours"]:
        out["gpu_hours_percent"] = round(100 * (live["gpu_hours"] / simulated["gpu_hours"] - 1), 2)
    out["max_pending_replicas"] = live["max_pending_replicas"] - simulated["max_pending_replicas"]
    return out
