"""Trace a fleet run from its own output: `python -m loadtest.e2e.fleettrace OUT [--started UNIX_S]`, OUT being
the folder `python -m loadtest.e2e --scenario fleet --out DIR` wrote (DIR/fleet).

It prints (1) each pooled placeholder that was Ready (when, when it went, the next pod placed on its node) and
the attribution recomputed from `lifetimes.jsonl` and `events.jsonl` with
the current rules (`loadtest.e2e.fleetrun`: `pooled_taken`, `first_needing_pool`) and the check's verdict on
them, and (2) every critical request that waited past the SLO, per model: when it was sent, how long it
waited, the model's requests in flight then (itself included) against its Ready replicas' slots, and the
requests of each class queued (sent, not yet given a slot) at that moment.

Times: lifetimes and events are wall clock; result.json's `started_unix_s` is scenario second 0. A run made
before result.json carried it is placed by its samples: the sampler stamps a pod's readiness with the same
clock reading it writes into that sample's `t_s`, so the start is the offset that most of the pods' Ready
times and the timeline's rows agree on (`started_from_samples`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

from loadtest.e2e.config import E2EConfig
from loadtest.e2e.fleetrun import first_needing_pool, pooled_taken
from loadtest.scenarios import SCENARIOS


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def read_lifetimes(path: Path) -> dict:
    """lifetimes.jsonl back into the run's {(kind, uid): life}."""
    out = {}
    for row in _jsonl(path):
        kind, uid = row.pop("kind"), row.pop("uid")
        row.setdefault("gpus", 1)
        out[(kind, uid)] = row
    return out


def started_from_samples(lifetimes: dict, timeline: list[dict], *, factor: float) -> float | None:
    """The wall clock of scenario second 0 that most pods' Ready stamps share with a timeline row (microseconds)."""
    votes: Counter = Counter()
    for (kind, _), life in lifetimes.items():
        if kind in ("model", "placeholder") and life.get("ready") is not None:
            votes.update({round(life["ready"] - row["t_s"] / factor, 6) for row in timeline})
    if not votes:
        return None
    started, count = votes.most_common(1)[0]
    return started if count > 1 else None


def placeholders(lifetimes: dict, *, started: float, factor: float) -> list[dict]:
    """Each pooled placeholder that was Ready (scenario seconds) and the next pod placed on its node after it."""
    def t(wall: float | None) -> float | None:
        return None if wall is None else round((wall - started) * factor, 1)
    pods = sorted((life["placed"], kind, life.get("namespace"), life.get("created"), uid)
                  for (kind, uid), life in lifetimes.items() if kind in ("model", "placeholder") and life.get("node"))
    out = []
    for (kind, uid), slot in lifetimes.items():
        if kind != "placeholder" or slot.get("ready") is None or not slot.get("node"):
            continue
        nxt = next(((placed, k, ns, created) for placed, k, ns, created, other in pods
                    if other != uid and placed >= slot["ready"] and lifetimes[(k, other)]["node"] == slot["node"]),
                   None)
        out.append({"name": slot["name"], "ready_s": t(slot["ready"]), "gone_s": t(slot["gone"]),
                    "next_pod": None if nxt is None else {"kind": nxt[1], "namespace": nxt[2],
                                                          "created_s": t(nxt[3]), "placed_s": t(nxt[0])}})
    return sorted(out, key=lambda p: p["ready_s"])


def pooled(doc: dict, lifetimes: dict, events: list[dict], *, started: float) -> dict:
    """The attribution with the current rules, whether the check passes on it, and the placeholders traced."""
    models = SCENARIOS[doc["scenario"]].models
    factor = doc["factor"]
    taken = pooled_taken(events, lifetimes, models, started=started, factor=factor)
    first = first_needing_pool(lifetimes, models, started=started, factor=factor)
    return {"pooled_taken": taken, "first_needing_pool": first,
            "passed": bool(taken) and taken[0]["model"] in first.get("models", []),
            "placeholders": placeholders(lifetimes, started=started, factor=factor)}


def _slots_at(timeline: list[dict], key: str, t_s: float, *, concurrency: int) -> tuple[int, int]:
    row = max((r for r in timeline if r["t_s"] <= t_s), key=lambda r: r["t_s"], default=None)
    ready = row["models"][key]["pods"]["ready"] if row else 0
    return ready, ready * concurrency


def late_requests(records: list[dict], timeline: list[dict], *, key: str, slo_s: float, concurrency: int,
                  cls: str = "critical") -> list[dict]:
    """Each admitted `cls` request that waited past `slo_s` (times at factor 1, as the load generator writes them),
    with the model's requests in flight at its send (itself included), its Ready replicas and slots then, and the
    requests queued then by class (sent before it, not yet given a slot)."""
    served = [r for r in records if r["status"] == 200 and r.get("queue_s") is not None]
    out = []
    for late in sorted((r for r in served if r["class"] == cls and r["queue_s"] > slo_s), key=lambda r: r["sent_s"]):
        t = late["sent_s"]
        in_flight = sum(1 for r in records if r.get("latency_s") is not None
                        and r["sent_s"] <= t < r["sent_s"] + r["latency_s"])
        queued = Counter(r["class"] for r in served if r is not late and r["sent_s"] < t < r["sent_s"] + r["queue_s"])
        ready, slots = _slots_at(timeline, key, t, concurrency=concurrency)
        out.append({"sent_min": round(t / 60, 3), "wait_s": round(late["queue_s"], 2), "in_flight": in_flight,
                    "ready_replicas": ready, "slots": slots, "queued_ahead": dict(sorted(queued.items()))})
    return out


def shed_reasons(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per class, how many requests the gateway answered 429 for each of the endpoint's reasons (its
    X-Shed-Reason with the figures left out: "keeping N of N slots for the top class"); a record from before
    the load generator kept the reason counts as "unknown"."""
    out: dict[str, Counter] = {}
    for r in records:
        if r.get("status") == 429:
            reason = re.sub(r"[0-9]+(\.[0-9]+)?%?", "N", (r.get("shed_reason") or "unknown").split(":")[0])
            out.setdefault(r["class"], Counter())[reason] += 1
    return {cls: dict(sorted(c.items())) for cls, c in sorted(out.items())}


def trace(out: Path, *, started: float | None = None) -> dict:
    doc = json.loads((out / "result.json").read_text())
    scenario = SCENARIOS[doc["scenario"]]
    config = replace(E2EConfig(factor=doc["factor"]), **scenario.config)
    lifetimes = read_lifetimes(out / "lifetimes.jsonl")
    timeline = _jsonl(out / "timeline.jsonl")
    started = started or doc.get("started_unix_s") or started_from_samples(lifetimes, timeline, factor=doc["factor"])
    if lifetimes and started is None:
        raise SystemExit(f"{out}: no started_unix_s in result.json and no pod Ready in a sample: pass --started")
    records = {m.key: _jsonl(out / f"records-{m.namespace}.jsonl") for m in scenario.models}
    late = {key: late_requests(rows, timeline, key=key, slo_s=config.slo_s, concurrency=config.concurrency)
            for key, rows in records.items()}
    shed = {key: shed_reasons(rows) for key, rows in records.items()}
    # a run before lifetimes.jsonl (run 19 and earlier) has no pooled attribution to recompute
    return {"started_unix_s": started, "slo_s": config.slo_s, "late": late, "shed": shed,
            "pooled": pooled(doc, lifetimes, _jsonl(out / "events.jsonl"), started=started) if lifetimes else None}


def render(result: dict) -> str:
    p = result["pooled"]
    if p is None:
        lines = ["no lifetimes.jsonl: the pooled attribution cannot be recomputed"]
    else:
        lines = [f"scenario second 0 at {result['started_unix_s']:.6f} (unix s)", "pooled placeholders Ready "
                 "(scenario s: Ready, gone; the next pod placed on the node: kind, namespace, created, placed):"]
        for x in p["placeholders"]:
            n = x["next_pod"]
            lines.append(f"  {x['name']}  {x['ready_s']}, {x['gone_s']}; " + (
                "none" if n is None else f"{n['kind']} {n['namespace']} {n['created_s']}, {n['placed_s']}"))
        lines.append(f"pooled placeholders taken ({len(p['pooled_taken'])}):")
        lines += [f"  {x['t_s']} s  {x['model']}  {x['placeholder']}" for x in p["pooled_taken"]]
        first = p["first_needing_pool"]
        lines.append(f"first needing the pool: {first.get('models')} at {first.get('t_s')} s; check "
                     f"{'passes' if p['passed'] else 'fails'}")
    for key, by_class in result.get("shed", {}).items():
        lines.append(f"{key}: answered 429 by reason: " + ("; ".join(
            f"{cls} " + ", ".join(f"{why!r} {n}" for why, n in reasons.items()) for cls, reasons in by_class.items())
            or "none"))
    for key, rows in result["late"].items():
        lines.append(f"{key}: {len(rows)} critical request(s) waited past {result['slo_s']:g} s")
        lines += [f"  sent at minute {r['sent_min']}, waited {r['wait_s']} s; {r['in_flight']} in flight (itself "
                  f"included) on {r['ready_replicas']} Ready replicas ({r['slots']} slots); queued then: "
                  f"{r['queued_ahead'] or 'nothing else'}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.e2e.fleettrace", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the fleet scenario's output folder (with result.json)")
    p.add_argument("--started", type=float, help="wall clock (unix s) of scenario second 0, for an older run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = trace(args.out, started=args.started)
    print(json.dumps(result, indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
