"""Shard Leases on the real apiserver: three processes (`python -m loadtest.shard_writer`) share 12 shards of
60 models (ConfigMaps standing for their Deployments), each writing every model it owns every tick. SIGKILL
one: its models are written again by the others within the Lease duration + one retry period + one tick of
the kill; no model is written by two processes in turn within a Lease duration; start it again: the shards
rebalance to 4 each, no model unwritten for longer than a tick + a retry period meanwhile."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict

from loadtest.shard_writer import model_name

MODELS, SHARDS = 60, 12
DURATION_S, RENEW_DEADLINE_S, RETRY_S, TICK_S = 4.0, 3.0, 0.5, 1.0


def start(cluster, ns, identity, tmp_path):
    out = open(tmp_path / f"{identity}.out", "a")
    return subprocess.Popen(
        [sys.executable, "-m", "loadtest.shard_writer", "--kubeconfig", cluster.kubeconfig, "--namespace", ns,
         "--identity", identity, "--models", str(MODELS), "--shards", str(SHARDS),
         "--lease-duration-s", str(DURATION_S), "--renew-deadline-s", str(RENEW_DEADLINE_S),
         "--retry-period-s", str(RETRY_S), "--tick-s", str(TICK_S), "--log", str(tmp_path / f"{identity}.jsonl")],
        stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def writes(tmp_path) -> list[dict]:
    lines = []
    for path in tmp_path.glob("*.jsonl"):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return sorted(lines, key=lambda w: w["t"])


def writers_since(tmp_path, since: float) -> dict[str, set[str]]:
    by_model: dict[str, set[str]] = defaultdict(set)
    for w in writes(tmp_path):
        if w["t"] >= since:
            by_model[w["model"]].add(w["writer"])
    return by_model


def holders(cluster, ns) -> Counter:
    leases = cluster.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")[1]["items"]
    return Counter(lease["spec"].get("holderIdentity") for lease in leases if "-shard-" in lease["metadata"]["name"])


def wait_until(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def interleavings(lines: list[dict]) -> list[tuple]:
    """Writer changes X -> Y -> X on a model within a Lease duration: two owners at once."""
    found = []
    runs: dict[str, list[list]] = defaultdict(list)  # model -> [writer, first t, last t] runs
    for w in lines:
        model_runs = runs[w["model"]]
        if model_runs and model_runs[-1][0] == w["writer"]:
            model_runs[-1][2] = w["t"]
        else:
            model_runs.append([w["writer"], w["t"], w["t"]])
    for model, model_runs in runs.items():
        for before, _, after in zip(model_runs, model_runs[1:], model_runs[2:]):
            if before[0] == after[0] and after[1] - before[2] < DURATION_S:
                found.append((model, before, after))
    return found


def largest_gap(lines: list[dict], since: float, until: float) -> float:
    """The longest a model went unwritten (by anyone) between `since` and `until`."""
    last: dict[str, float] = {}
    gap = 0.0
    for w in lines:
        if w["model"] in last and w["t"] > since:
            gap = max(gap, w["t"] - max(last[w["model"]], since))
        if w["t"] <= until:
            last[w["model"]] = w["t"]
    return gap


def test_three_processes_share_sixty_models_survive_a_kill_and_rebalance(cluster, namespace, tmp_path):
    ns = namespace
    for i in range(MODELS):
        status, body = cluster.request("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                       {"metadata": {"name": model_name(i)}, "data": {}})
        assert status == 201, body
    procs = {name: start(cluster, ns, name, tmp_path) for name in ("p0", "p1", "p2")}
    try:
        # Steady state: 4 shards each, every model written by exactly one process over two ticks.
        assert wait_until(lambda: sorted(holders(cluster, ns).values()) == [4, 4, 4], timeout_s=40), \
            holders(cluster, ns)
        time.sleep(RETRY_S + TICK_S)
        window = time.time()
        time.sleep(2 * TICK_S)
        owners = writers_since(tmp_path, window)
        assert len(owners) == MODELS and all(len(w) == 1 for w in owners.values()), owners

        # SIGKILL p1: its models go to p0 and p2 after its Leases expire.
        victims = {m for m, w in owners.items() if w == {"p1"}}
        procs["p1"].send_signal(signal.SIGKILL)
        procs["p1"].wait()
        killed_at = time.time()
        bound_s = DURATION_S + RETRY_S + TICK_S
        time.sleep(bound_s + TICK_S)
        after = writes(tmp_path)
        first_other = {}
        for w in after:
            if w["model"] in victims and w["t"] > killed_at and w["model"] not in first_other:
                first_other[w["model"]] = w["t"]
        assert set(first_other) == victims
        reowned_s = max(first_other.values()) - killed_at
        unwritten_s = largest_gap(after, since=killed_at - TICK_S, until=killed_at + bound_s)
        print(f"\nSIGKILL: {len(victims)} models re-owned, the last {reowned_s:.2f} s after the kill "
              f"(bound {bound_s:.1f} s); longest a model went unwritten {unwritten_s:.2f} s")
        assert reowned_s <= bound_s
        assert sorted(holders(cluster, ns).values()) == [6, 6]

        # Start it again: the shards rebalance, each model still written every tick or so.
        restarted_at = time.time()
        procs["p1"] = start(cluster, ns, "p1", tmp_path)
        assert wait_until(lambda: sorted(holders(cluster, ns).values()) == [4, 4, 4], timeout_s=30), \
            holders(cluster, ns)
        rebalanced_s = time.time() - restarted_at
        time.sleep(RETRY_S + 2 * TICK_S)
        lines = writes(tmp_path)
        handover_gap_s = largest_gap(lines, since=restarted_at, until=time.time())
        print(f"restart: rebalanced to 4/4/4 in {rebalanced_s:.2f} s (process start included); longest a model "
              f"went unwritten meanwhile {handover_gap_s:.2f} s")
        assert handover_gap_s <= TICK_S + RETRY_S + TICK_S  # a hand-over, not an expiry
        assert not interleavings(lines)
        assert len({w["writer"] for w in lines if w["t"] > time.time() - TICK_S - 0.5}) == 3
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    # A graceful stop released every shard Lease.
    assert holders(cluster, ns) == Counter({None: SHARDS})
