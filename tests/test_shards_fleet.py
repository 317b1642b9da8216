"""Three `autoscaler run` processes in fleet mode share 60 ModelAutoscalers over 12 shard Leases, on the real
apiserver with a real Prometheus (one fake model server's series stand for every model's). SIGKILL one: its
shard Leases are held by the survivors within the Lease duration + one tick, and its models acted on
(`autoscaler_is_leader` of the model on a survivor's /metrics, set by the tick) within the Lease duration +
two ticks (the first tick after the take-over may start a tick later); a demand rise then scales every
model, each by one process only (the `reportingInstance` of its scale Events), none scaled down; start it
again: the shards rebalance to 4/4/4, each model owned by its shard's holder."""

import calendar
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict

import pytest
import yaml

from autoscaler.crd import GROUP, PLURAL, VERSION
from autoscaler.fleet.shards import shard_of
from helpers import ROOT
from loadtest.kube.controlplane import model_deployment
from servers import fake_model_server, free_port, post_json, prometheus, stop, wait_http
from test_processes import wait_until
from test_shards_kube import holders

MODELS, SHARDS = 60, 12
DURATION_S, RENEW_DEADLINE_S, RETRY_S, TICK_S = 5.0, 4.0, 1.0, 5.0
PROCESSES = ("c0", "c1", "c2")


@pytest.fixture(scope="module")
def crd(cluster):
    [doc] = cluster.apply_yaml((ROOT / "deploy" / "crds" / "modelautoscaler.yaml").read_text())
    cluster.wait_established([doc["metadata"]["name"]])


def create_models(cluster, ns):
    for i in range(MODELS):
        name = f"m{i}"
        deployment = model_deployment(ns, name, 1)
        del deployment["spec"]["template"]["spec"]["containers"][0]["resources"]  # 60 models: no GPUs needed
        assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)[0] == 201
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelAutoscaler", "metadata": {"name": name},
                "spec": {"target": {"name": name}, "selector": {"matchLabels": {"app": name}},
                         "signals": {"prometheus": {"selector": 'namespace="llm"'}},
                         "policy": {"min_replicas": 1, "max_replicas": 6, "replica_concurrency": 8,
                                    "slo_queue_wait_s": 2.0, "tick_s": TICK_S, "forecast_bucket_s": 60}}}
        status, answer = cluster.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}", body)
        assert status == 201, answer


def start(cluster, ns, name, prom, tmp_path):
    http = free_port()
    config = {"fleet": {"enabled": True, "namespaces": [ns], "shards": SHARDS, "lease_namespace": ns},
              "mode": "actuate", "http_port": http, "prometheus": {"url": prom, "timeout_s": 1.0},
              "policy": {"tick_s": TICK_S, "forecast_bucket_s": 60}, "warm_pool": {"enabled": False},
              "admission": {"port": free_port(), "queue_probe_interval_s": None},
              "leader_election": {"lease_duration_s": DURATION_S, "renew_deadline_s": RENEW_DEADLINE_S,
                                  "retry_period_s": RETRY_S}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / f"{name}.log", "a")
    proc = subprocess.Popen([sys.executable, "-m", "autoscaler", "run", "--config", str(path),
                             "--kubeconfig", cluster.kubeconfig], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "POD_NAME": name})
    wait_http(f"http://127.0.0.1:{http}/healthz", proc=proc, timeout_s=60)
    return proc, http


def metrics_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def owned(port: int, ns: str) -> set[str]:
    """The models whose last tick on this process found its shard Lease held."""
    text = metrics_text(port)
    pattern = re.compile(r'^autoscaler_is_leader\{(.*)\} 1\.0$', re.M)
    models = set()
    for labels in pattern.findall(text):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found.get("namespace") == ns:
            models.add(found["model_autoscaler"])
    return models


def each_owned_once(cluster, procs, ns) -> dict[str, set[str]] | None:
    """Each process's models, if at its last tick every model is owned by exactly one process, the holder of
    the model's shard Lease."""
    owners = {name: owned(port, ns) for name, (_, port) in procs.items()}
    counts = Counter(m for models in owners.values() for m in models)
    holder = shard_holders(cluster, ns)
    if len(counts) != MODELS or set(counts.values()) != {1}:
        return None
    return owners if all(holder[shard_of(ns, m, SHARDS)] == p for p, models in owners.items() for m in models) else None


def shard_holders(cluster, ns) -> dict[int, str]:
    leases = cluster.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")[1]["items"]
    return {int(lease["metadata"]["name"].rsplit("-", 1)[1]): lease["spec"].get("holderIdentity")
            for lease in leases if "-shard-" in lease["metadata"]["name"]}


def all_replicas(cluster, ns) -> dict[str, int]:
    items = cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments")[1]["items"]
    return {d["metadata"]["name"]: d["spec"]["replicas"] for d in items}


def scalers(cluster, ns, since: float = 0.0) -> dict[str, set[str]]:
    events = cluster.request("GET", f"/api/v1/namespaces/{ns}/events")[1]["items"]
    by_model = defaultdict(set)
    for e in events:
        if e.get("reportingComponent") == "inference-autoscaler" and e["reason"].startswith("Scaled"):
            stamp = calendar.timegm(time.strptime(e["firstTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
            if stamp >= since:
                by_model[e["involvedObject"]["name"]].add(e["reportingInstance"] + ":" + e["reason"])
    return by_model


def test_three_fleet_controllers_share_sixty_models_survive_a_kill_and_rebalance(cluster, crd, namespace,
                                                                                     tmp_path):
    ns = namespace
    create_models(cluster, ns)
    with fake_model_server() as model, prometheus([model.removeprefix("http://")]) as prom:
        # a queue of 16 at 2 s each drains within the 2-s SLO on 16 slots: 2 replicas of 8
        post_json(f"{model}/admin/state", {"waiting": 16, "running": 0})
        procs = {name: start(cluster, ns, name, prom, tmp_path) for name in PROCESSES}
        try:
            assert wait_until(lambda: sorted(holders(cluster, ns).values()) == [4, 4, 4], 60), holders(cluster, ns)
            assert wait_until(lambda: set(all_replicas(cluster, ns).values()) == {2}, 120), all_replicas(cluster, ns)
            owners = wait_until(lambda: each_owned_once(cluster, procs, ns), 4 * TICK_S)  # by exactly one process each
            assert owners, {name: owned(port, ns) for name, (_, port) in procs.items()}
            assert all(len(who) == 1 for who in scalers(cluster, ns).values()), scalers(cluster, ns)
            for _, port in procs.values():  # the shard gate's own metrics are served with the fleet's
                text = metrics_text(port)
                assert "autoscaler_shards_held 4.0" in text and "autoscaler_shard_members 3.0" in text, text[-2000:]

            # SIGKILL c1: the survivors take its shard Leases once they expire, and act on its models at their
            # next tick (`autoscaler_is_leader` of the model set by that tick).
            victims = owners["c1"]
            its_shards = {s for s, holder in shard_holders(cluster, ns).items() if holder == "c1"}
            procs["c1"][0].send_signal(signal.SIGKILL)
            procs["c1"][0].wait()
            killed_at = time.time()
            reowned: dict[str, float] = {}
            leases_taken: dict[int, float] = {}
            lowest = dict(all_replicas(cluster, ns))

            def all_reowned():
                now = time.time()
                for s, holder in shard_holders(cluster, ns).items():
                    if s in its_shards and holder not in (None, "c1"):
                        leases_taken.setdefault(s, now - killed_at)
                for name in ("c0", "c2"):
                    for m in owned(procs[name][1], ns) & victims:
                        reowned.setdefault(m, now - killed_at)
                for m, r in all_replicas(cluster, ns).items():
                    lowest[m] = min(lowest[m], r)
                return set(reowned) == victims and set(leases_taken) == its_shards

            assert wait_until(all_reowned, DURATION_S + 3 * TICK_S, step_s=0.1), sorted(victims - set(reowned))
            print(f"\nSIGKILL: its {len(its_shards)} shard Leases held by others {max(leases_taken.values()):.2f} s "
                  f"after the kill (bound: lease + tick = {DURATION_S + TICK_S:.1f} s); its {len(victims)} models "
                  f"acted on (is_leader 1 on a survivor) within {max(reowned.values()):.2f} s (bound: lease + two "
                  f"ticks = {DURATION_S + 2 * TICK_S:.1f} s)")
            assert max(leases_taken.values()) <= DURATION_S + TICK_S
            assert max(reowned.values()) <= DURATION_S + 2 * TICK_S
            assert sorted(holders(cluster, ns).values()) == [6, 6]

            # More demand: every model scaled up, by one process each; none scaled down (nothing lost).
            raised_at = time.time()
            post_json(f"{model}/admin/state", {"waiting": 24, "running": 0})  # 24 slots and the queue's growth
            assert wait_until(lambda: len(set(all_replicas(cluster, ns).values())) == 1
                              and min(all_replicas(cluster, ns).values()) > 2, 90), all_replicas(cluster, ns)
            raised = min(all_replicas(cluster, ns).values())
            assert min(lowest.values()) == 2
            after = scalers(cluster, ns, since=raised_at - 1)
            assert all(len(who) == 1 for who in after.values()), after
            assert not any(w.startswith("c1:") for who in after.values() for w in who)
            assert not any(w.endswith("ScaledDown") for who in scalers(cluster, ns).values() for w in who)

            # Start c1 again: the shards rebalance, each model still owned by exactly one process.
            restarted_at = time.time()
            procs["c1"] = start(cluster, ns, "c1", prom, tmp_path)
            assert wait_until(lambda: sorted(holders(cluster, ns).values()) == [4, 4, 4], 40), holders(cluster, ns)
            print(f"restart: shards back to 4/4/4 {time.time() - restarted_at:.2f} s after the start "
                  "(process start included)")
            owners = wait_until(lambda: each_owned_once(cluster, procs, ns), 4 * TICK_S)  # its first ticks
            assert owners, {name: owned(port, ns) for name, (_, port) in procs.items()}
            assert set(all_replicas(cluster, ns).values()) == {raised}
        finally:
            for proc, _ in procs.values():
                stop(proc)
