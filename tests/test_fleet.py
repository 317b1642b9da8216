"""The fleet controller on a real kube-apiserver: ModelAutoscaler objects watched, each model's Deployment
scaled to its decision, statuses written, spec changes, deletions and invalid objects handled, and the KEDA
and admission servers answering per model. Signals come from a fake SignalHub (decisions are predictable:
16 requests in flight per replica); the cluster reads and writes are real."""

import asyncio
import time

import aiohttp
import grpc
import pytest

from autoscaler.clock import SystemClock
from autoscaler.config import Settings
from autoscaler.crd import GROUP, PLURAL, VERSION
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.fleet.routing import FleetAdmission, FleetScaler
from autoscaler.fleet.runtime import build_fleet
from autoscaler.external_scaler.server import serve
from autoscaler.kube.client import Kube
from autoscaler.runtime import Parts, _serve
from autoscaler.signals.prometheus import QueryResult
from autoscaler.signals.queueprobe import QueueReading
from policies import Sample

from helpers import ROOT, pod_at_localhost
from loadtest.kube.controlplane import model_deployment
from loadtest.realservers import fake_model_server, free_port, post_json

CRD_FILE = ROOT / "deploy" / "crds" / "modelautoscaler.yaml"


@pytest.fixture(scope="module")
def crd(cluster):
    [doc] = cluster.apply_yaml(CRD_FILE.read_text())
    cluster.wait_established([doc["metadata"]["name"]])


class Hub:
    """A SignalHub whose answers the test sets: requests in flight per model."""

    def __init__(self, in_flight):
        self.in_flight, self.failing, self.refreshed = dict(in_flight), set(), []

    async def refresh(self, now, models):
        self.refreshed.append(set(models))

    def source(self, key):
        hub = self

        class Source:
            async def collect(self, now):
                if key in hub.failing:
                    raise RuntimeError(f"bug in the source of {key}")
                if key not in hub.in_flight:  # another test's model (a fleet of every namespace): no signals
                    return QueryResult()
                return QueryResult(samples={"in_flight": Sample(hub.in_flight[key], now),
                                            "queue_depth": Sample(0.0, now)})

        return Source()


def fleet_settings(ns, mode="actuate"):
    return Settings(fleet={"enabled": True, "namespaces": [ns], "status_every_ticks": 5}, mode=mode,
                    prometheus={"url": "http://127.0.0.1:9"}, warm_pool={"enabled": False},
                    leader_election={"enabled": False}, admission={"queue_probe_interval_s": None},
                    policy={"tick_s": 5, "forecast_bucket_s": 60})


def model(name, **policy):
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelAutoscaler", "metadata": {"name": name},
            "spec": {"target": {"name": name}, "selector": {"matchLabels": {"app": name}},
                     "policy": {"min_replicas": 1, "max_replicas": 8, "tick_s": 5, "forecast_bucket_s": 60,
                                **policy}}}


def objects_path(ns, name=""):
    return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" + (f"/{name}" if name else "")


def replicas(cluster, ns, name):
    return cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")[1]["spec"]["replicas"]


def ready(cluster, ns, name):
    return cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")[1]["status"].get(
        "readyReplicas", 0)


def create(cluster, ns, names, **policy):
    for name in names:
        assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                               model_deployment(ns, name, 1))[0] == 201
        status, body = cluster.request("POST", objects_path(ns), model(name, **policy))
        assert status == 201, body


async def until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


class Running:
    """A fleet controller in this process, its watch running, ticked by the test."""

    def __init__(self, cluster, settings, hub, *, kubeconfig=None, cached=False, gate=None):
        self.cluster, self.settings, self.hub, self.cached, self.gate = cluster, settings, hub, cached, gate
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.cache = None

    async def __aenter__(self):
        from autoscaler.kube.cache import KubeCache

        self.kube = await Kube.connect(self.kubeconfig)
        self.session = aiohttp.ClientSession()
        parts, self.stop = Parts(), asyncio.Event()
        if self.cached:  # the cluster read from watches (the fleet's ClusterCache)
            self.cache = KubeCache(self.kube)
            await self.cache.start()
            assert await self.cache.wait_synced(20)
        self.fleet = build_fleet(self.settings, self.kube, self.session, identity="test", clock=SystemClock(),
                                 parts=parts, hub=self.hub, cache=self.cache, gate=self.gate)
        self.watch = self.fleet.objects
        self.task = asyncio.create_task(self.watch.run(self.stop))
        await asyncio.wait_for(self.watch.synced.wait(), 10)
        return self

    async def __aexit__(self, *exc):
        self.stop.set()
        await self.task
        await asyncio.gather(*(m.stop() for m in self.fleet.models.values()))
        if self.cache is not None:
            await self.cache.stop()
        await self.session.close()
        await self.kube.close()


def test_fleet_scales_each_model_follows_spec_changes_deletions_and_reports_invalid_objects(cluster, crd, namespace):
    ns = namespace
    create(cluster, ns, ["a", "b", "c"])
    hub = Hub({(ns, "a"): 40, (ns, "b"): 20, (ns, "c"): 8})  # 3, 2 and 1 replicas at 16 in flight each

    async def go():
        async with Running(cluster, fleet_settings(ns), hub) as run:
            fleet = run.fleet
            await fleet.tick()
            assert [replicas(cluster, ns, n) for n in "abc"] == [3, 2, 1]
            assert hub.refreshed == [{(ns, "a"), (ns, "b"), (ns, "c")}]  # one refresh for the fleet
            # a request held for any model (scale from zero) wakes the one fleet loop
            assert all(m.board.wake is fleet.wake for m in fleet.models.values())
            status = cluster.request("GET", objects_path(ns, "a"))[1]["status"]
            assert status["replicas"] == 3 and status["observedGeneration"] == 1 and status["reasons"]
            conditions = {c["type"]: c for c in status["conditions"]}
            assert conditions["Active"]["status"] == "True" and conditions["SignalsMissing"]["status"] == "False"
            assert status["lastDecisionTime"].endswith("Z")

            # a spec change: the next tick uses it, with the learned state kept
            change = {"spec": {"policy": {"max_replicas": 2}}}
            status_code, body = cluster.request("PATCH", objects_path(ns, "a"), change)
            assert status_code == 200, body
            await until(lambda: run.watch.objects[(ns, "a")].generation == 2)
            learned = fleet.models[(ns, "a")].controller.state
            assert "in_flight" in learned.seen
            await fleet.reconcile()
            assert fleet.models[(ns, "a")].controller.state is learned
            assert fleet.models[(ns, "a")].settings.policy.max_replicas == 2

            # a failing model does not stop the others; deleted: no longer ticked, its Deployment untouched
            hub.failing.add((ns, "b"))
            assert cluster.request("DELETE", objects_path(ns, "c"))[0] == 200
            hub.in_flight[(ns, "c")] = 100
            await until(lambda: (ns, "c") not in run.watch.objects)
            await fleet.tick()
            assert replicas(cluster, ns, "a") == 2
            assert (ns, "c") not in fleet.models and hub.refreshed[-1] == {(ns, "a"), (ns, "b")}
            assert replicas(cluster, ns, "c") == 1
            status = cluster.request("GET", objects_path(ns, "a"))[1]["status"]
            assert status["replicas"] == 2 and status["observedGeneration"] == 2

            # an object the apiserver takes but the controller cannot use (admission's default class missing)
            bad = model("d", priorities={"critical": 10, "batch": -1})
            assert cluster.request("POST", objects_path(ns), bad)[0] == 201
            await until(lambda: (ns, "d") in run.watch.objects)
            hub.failing.clear()
            before = {k: m.decided_s for k, m in fleet.models.items()}
            await fleet.tick()
            assert (ns, "d") not in fleet.models and all(m.decided_s > before[k] for k, m in fleet.models.items())
            assert fleet.models[(ns, "b")].decision.valid
            status = cluster.request("GET", objects_path(ns, "d"))[1]["status"]
            [active] = status["conditions"]
            assert active["type"] == "Active" and active["status"] == "False" and active["reason"] == "InvalidSpec"
            assert "default_priority" in active["message"]

    asyncio.run(go())


def test_keda_mode_answers_each_model_by_the_scaled_objects_metadata_and_admission_routes_by_header(
        cluster, crd, namespace):
    ns = namespace
    create(cluster, ns, ["a", "b"])
    hub = Hub({(ns, "a"): 40, (ns, "b"): 20})

    async def go():
        async with Running(cluster, fleet_settings(ns, mode="keda"), hub) as run:
            # Ready replicas, so the admission endpoint answers at once (at zero Ready it would hold)
            await until(lambda: all(ready(cluster, ns, n) == 1 for n in "ab"), timeout_s=30)
            await run.fleet.tick()
            port = free_port()
            server = await serve(FleetScaler(run.fleet, metric_name="desired-replicas"), host="127.0.0.1", port=port)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = pb_grpc.ExternalScalerStub(channel)

                    async def metric(scaled_object, model_name):
                        ref = pb.ScaledObjectRef(name=scaled_object, namespace=ns,
                                                 scalerMetadata={"modelAutoscaler": model_name})
                        reply = await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref,
                                                                           metricName="desired-replicas"))
                        return reply.metricValues[0].metricValueFloat

                    assert await metric("so-a", "a") == 3.0 and await metric("so-b", "b") == 2.0
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await metric("so-x", "x")
                    assert err.value.code() == grpc.StatusCode.NOT_FOUND
            finally:
                await server.stop(grace=None)
            assert [replicas(cluster, ns, n) for n in "ab"] == [1, 1]  # KEDA scales, not the controller

            unknown = []
            admission = FleetAdmission(run.fleet, on_unknown=lambda: unknown.append(1))
            port = free_port()
            runner = await _serve(admission.app(), "127.0.0.1", port)
            try:
                async with aiohttp.ClientSession() as http:
                    base = f"http://127.0.0.1:{port}"
                    async with http.get(base + "/auth_request", headers={"x-model-autoscaler": f"{ns}/a"}) as r:
                        assert r.status == 200
                    async with http.get(base + f"/models/{ns}/b/ext_authz/v1/chat") as r:
                        assert r.status == 200
                    async with http.get(base + "/auth_request", headers={"x-model-autoscaler": f"{ns}/x"}) as r:
                        assert r.status == 200  # unknown: admitted, counted
            finally:
                await runner.cleanup()
            assert len(unknown) == 1
            answered = {k: m.metrics.admission.labels("standard", "admitted")._value.get()
                        for k, m in run.fleet.models.items()}
            assert answered == {(ns, "a"): 1, (ns, "b"): 1}

    asyncio.run(go())


def test_config_needs_a_target_or_fleet_mode_and_not_both(tmp_path):
    from autoscaler.config import load_config
    from autoscaler.errors import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text("prometheus: {url: http://prom:9090}\n")
    with pytest.raises(ConfigError, match="no target: set target .* or fleet.enabled"):
        load_config(path)
    path.write_text("prometheus: {url: http://prom:9090}\ntarget: {namespace: llm, name: m}\nfleet: {enabled: true}\n")
    with pytest.raises(ConfigError, match="target llm/m and fleet.enabled: pick one"):
        load_config(path)
    path.write_text("prometheus: {url: http://prom:9090}\nfleet: {enabled: true, namespaces: [llm, chat]}\n")
    assert load_config(path).fleet.namespaces == ["llm", "chat"]


FLEET_NS = "fleet-ctl"


@pytest.fixture(scope="module")
def fleet_installed(cluster, crd, tmp_path_factory):
    """The fleet's overlay: base + fleet-crd + fleet + model-name (the controller's name `fleet`)."""
    from overlays import render_overlay
    from test_deploy import PATHS

    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": FLEET_NS}})[0] in (201, 409)
    docs = render_overlay(tmp_path_factory.mktemp("fleet"), namespace=FLEET_NS, model="fleet",
                          components=("fleet-crd", "fleet", "model-name"))
    for doc in docs:
        if doc["kind"] == "PriorityClass":
            continue  # cluster-scoped and the same as the single mode's: tests/test_deploy.py creates it
        path = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=doc["metadata"].get("namespace", FLEET_NS))
        status, body = cluster.request("POST", path + "?fieldValidation=Strict", doc)
        assert status == 201, body.get("message")
    return docs


@pytest.mark.parametrize("method,path,allowed", [
    ("GET", f"/apis/{GROUP}/{VERSION}/{PLURAL}", True),  # every namespace's objects
    ("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/any/{PLURAL}/m/status", True),
    ("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/any/{PLURAL}/m", False),  # never the spec
    ("DELETE", f"/apis/{GROUP}/{VERSION}/namespaces/any/{PLURAL}/m", False),
    ("PATCH", "/apis/apps/v1/namespaces/any/deployments/m/scale", True),
    ("PATCH", "/apis/apps/v1/namespaces/any/statefulsets/m/scale", True),
    ("POST", "/apis/apps/v1/namespaces/any/deployments", True),  # a model's warm pool
    ("DELETE", "/apis/apps/v1/namespaces/any/deployments/m", False),
    ("GET", "/api/v1/namespaces/any/pods", True),
    ("DELETE", "/api/v1/namespaces/any/pods/p", False),
    ("GET", "/api/v1/namespaces/any/secrets", False),
    ("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{FLEET_NS}/leases/fleet-autoscaler", True),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/any/leases/other", False),
    ("PATCH", "/api/v1/nodes/gpu-0", False),
    ("GET", "/api/v1/pods?watch=true&timeoutSeconds=1", True),  # the cluster cache's watches
    ("GET", "/apis/apps/v1/deployments?watch=true&timeoutSeconds=1", True),
    ("GET", "/api/v1/nodes?watch=true&timeoutSeconds=1", True),
    ("GET", "/apis/kueue.x-k8s.io/v1beta1/localqueues?watch=true&timeoutSeconds=1", True),
    ("GET", "/apis/kueue.x-k8s.io/v1beta1/clusterqueues?watch=true&timeoutSeconds=1", True),
    ("POST", "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/any/capacitybuffers", True),  # warm pools, as buffers
    ("GET", f"/apis/autoscaling.x-k8s.io/v1beta1/namespaces/{FLEET_NS}/capacitybuffers", True),  # pooled: ours
    ("GET", "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/any/capacitybuffers", False),  # listed in ours only
    ("GET", "/apis/autoscaling.x-k8s.io/v1beta1/capacitybuffers", False),
    ("GET", "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/any/capacitybuffers/b", True),  # a model's own buffer
    ("DELETE", "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/any/capacitybuffers/b", False),
    ("PUT", f"/api/v1/namespaces/{FLEET_NS}/podtemplates/fleet-warm-1gpu", True),  # a pooled buffer's pod
    ("POST", f"/api/v1/namespaces/{FLEET_NS}/podtemplates", True),
    ("POST", "/api/v1/namespaces/any/podtemplates", False),  # only in the controller's namespace
    ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{FLEET_NS}/leases", False),  # only with fleet-shards
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/any/leases", False),
])
def test_fleet_rbac_by_impersonation(cluster, fleet_installed, method, path, allowed):
    from test_deploy import impersonated

    status = impersonated(cluster, method, path, body={}, ns=FLEET_NS)
    assert (status != 403) == allowed, status


def test_fleet_overlay_runs_in_fleet_mode_and_its_service_account_controls_a_model(cluster, fleet_installed,
                                                                                  namespace, tmp_path, monkeypatch):
    from autoscaler.config import load_config
    from test_deploy import service_account_kubeconfig

    controller = next(d for d in fleet_installed if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    config = next(d for d in fleet_installed if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "inference-autoscaler")["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config)
    monkeypatch.setenv("AUTOSCALER_FLEET__ENABLED", env["AUTOSCALER_FLEET__ENABLED"])
    shipped = load_config(tmp_path / "config.yaml")
    assert shipped.fleet.enabled and shipped.target is None
    create(cluster, namespace, ["a"])
    hub = Hub({(namespace, "a"): 40})
    settings = Settings(**{**shipped.model_dump(exclude={"target"}), "mode": "actuate",
                           "fleet": {"enabled": True, "namespaces": []}, "leader_election": {"enabled": False},
                           "policy": {"tick_s": 5, "forecast_bucket_s": 60}})
    run = Running(cluster, settings, hub, kubeconfig=service_account_kubeconfig(cluster, FLEET_NS, "sa-fleet"),
                  cached=True)

    async def go():
        async with run:
            await run.fleet.tick()
        assert (namespace, "a") in run.fleet.models

    asyncio.run(go())
    assert replicas(cluster, namespace, "a") == 3
    assert cluster.request("GET", objects_path(namespace, "a"))[1]["status"]["replicas"] == 3
    pool = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/a-warm-pool")
    assert pool[0] == 200  # the warm pool, created by the service account


def test_watch_relists_when_its_resource_version_is_gone_and_names_invalid_objects(cluster, crd, namespace):
    from autoscaler.fleet.watch import ObjectWatch
    from autoscaler.fleet.runtime import base_config

    ns = namespace
    create(cluster, ns, ["a"])
    bad = model("b", priorities={"critical": 10, "batch": -1})
    assert cluster.request("POST", objects_path(ns), bad)[0] == 201
    errors = []

    async def go():
        kube = await Kube.connect(cluster.kubeconfig)
        watch = ObjectWatch(kube, namespaces=(ns,), base=base_config(fleet_settings(ns)), on_error=errors.append)
        stop = asyncio.Event()
        # resuming from a resourceVersion etcd no longer serves: 410 Gone, so the watch lists again
        [informer] = watch.informers
        informer.resource_version = "1"
        task = asyncio.create_task(watch.run(stop))
        try:
            await until(lambda: (ns, "a") in watch.objects and (ns, "b") in watch.objects)
            assert watch.objects[(ns, "a")].settings.target.name == "a"
            assert watch.objects[(ns, "b")].settings is None and "default_priority" in watch.objects[(ns, "b")].error
            assert cluster.request("DELETE", objects_path(ns, "a"))[0] == 200
            await until(lambda: (ns, "a") not in watch.objects)
        finally:
            stop.set()
            task.cancel()
            await kube.close()
        return informer.relists

    assert asyncio.run(go()) == 1
    assert errors == []  # a 410 is no error, only a re-list


def test_status_conditions_keep_their_transition_time_and_writes_are_due_on_change_or_every_n_ticks():
    from autoscaler.fleet.status import StatusWriter, status_of
    from policies import Decision

    held = Decision(replicas=2, valid=False,
                    reasons=("hold: nothing to size on", "in_flight: missing (reported before)"))
    first = status_of(decision=held, error=None, generation=3, decided_s=100.0, previous=[], now=100.0)
    conditions = {c["type"]: c for c in first["conditions"]}
    assert conditions["Active"]["status"] == "False" and conditions["Active"]["reason"] == "Holding"
    assert conditions["SignalsMissing"]["status"] == "True" and "in_flight" in conditions["SignalsMissing"]["message"]
    capped = Decision(replicas=4, capped_by_budget=True, unplaceable_replicas=1, reasons=("budget: 4 GPUs",))
    second = status_of(decision=capped, error=None, generation=3, decided_s=130.0, previous=first["conditions"],
                       now=130.0)
    times = {c["type"]: (c["status"], c["lastTransitionTime"]) for c in second["conditions"]}
    assert times["Active"] == ("True", "1970-01-01T00:02:10Z")  # changed: now
    assert times["CappedByBudget"][0] == "True" and times["CapacityUnavailable"][0] == "True"
    again = status_of(decision=capped, error=None, generation=3, decided_s=160.0, previous=second["conditions"],
                      now=160.0)
    assert {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}["Active"] == "1970-01-01T00:02:10Z"

    writer = StatusWriter(kube=None, every_ticks=3)
    key = ("llm", "m")
    assert writer.due(key, second)
    writer._last[key] = type("W", (), {"status": second, "tick": 0})()
    assert not writer.due(key, again)  # only the decision time moved
    assert writer.due(key, first)  # changed
    writer.next_tick(), writer.next_tick(), writer.next_tick()
    assert writer.due(key, again)  # the heartbeat


def test_a_spec_change_keeps_the_learned_state_unless_the_target_changed():
    from kubernetes_asyncio import client

    from autoscaler.crd import parse_spec, settings_for
    from autoscaler.fleet.model import ModelBuilder
    from autoscaler.fleet.runtime import base_config

    async def go():
        kube = Kube(client.ApiClient())
        async with aiohttp.ClientSession() as session:
            builder = ModelBuilder(kube, session, "test", SystemClock())
            base = base_config(fleet_settings("llm"))

            def settings(target, max_replicas):
                spec = model(target, max_replicas=max_replicas)["spec"]
                return settings_for(namespace="llm", spec=parse_spec(spec), base=base)

            m = builder.build(("llm", "m"), settings("a", 8), generation=1, is_leader=lambda: True)
            learned = m.controller.state.__class__(last_replicas=5)
            m.controller.state = learned
            await builder.update(m, settings("a", 4), generation=2)
            assert m.controller.state is learned and m.controller.settings.policy.max_replicas == 4
            await builder.update(m, settings("other", 4), generation=3)
            assert m.controller.state.last_replicas is None and m.generation == 3
            await m.stop()
        await kube.close()

    asyncio.run(go())


def test_run_fleet_serves_health_and_each_models_metrics_and_scales_on_its_own_ticks(cluster, crd, namespace):
    from autoscaler.fleet.runtime import run_fleet

    ns = namespace
    create(cluster, ns, ["a", "b"])
    hub = Hub({(ns, "a"): 40, (ns, "b"): 20})
    http_port = free_port()
    settings = Settings(**{**fleet_settings(ns).model_dump(exclude={"target"}), "http_port": http_port,
                           "admission": {"port": free_port(), "queue_probe_interval_s": None}})

    async def go():
        stop = asyncio.Event()
        task = asyncio.create_task(run_fleet(settings, kubeconfig=cluster.kubeconfig, host="127.0.0.1", stop=stop,
                                             hub=hub))
        try:
            await until(lambda: replicas(cluster, ns, "a") == 3 and replicas(cluster, ns, "b") == 2, timeout_s=20)
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{http_port}"
                await until(lambda: len(hub.refreshed) >= 1)
                async with http.get(base + "/healthz") as r:
                    assert r.status == 200
                async with http.get(base + "/metrics") as r:
                    text = await r.text()
            assert "autoscaler_fleet_models 2.0" in text
            assert f'autoscaler_decided_replicas{{model_autoscaler="a",namespace="{ns}"}} 3.0' in text
            assert f'autoscaler_decided_replicas{{model_autoscaler="b",namespace="{ns}"}} 2.0' in text
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)

    asyncio.run(go())


def test_with_a_shard_gate_only_the_owned_models_are_scaled_and_their_status_written(cluster, crd, namespace):
    ns = namespace
    create(cluster, ns, ["a", "b"])
    hub = Hub({(ns, "a"): 40, (ns, "b"): 40})

    class Gate:
        owned = {(ns, "a")}

        def owns(self, key):
            return key in self.owned

        async def run(self, stop):
            await stop.wait()

    async def go():
        async with Running(cluster, fleet_settings(ns), hub, gate=Gate()) as run:
            await run.fleet.tick()
            assert run.fleet.models[(ns, "b")].decision.replicas == 3  # decided (KEDA, admission), not applied
            Gate.owned = {(ns, "a"), (ns, "b")}  # b's shard taken over: from the next tick on
            assert [replicas(cluster, ns, n) for n in "ab"] == [3, 1]
            assert "status" not in cluster.request("GET", objects_path(ns, "b"))[1]
            await run.fleet.tick()
            assert [replicas(cluster, ns, n) for n in "ab"] == [3, 3]
            assert cluster.request("GET", objects_path(ns, "b"))[1]["status"]["replicas"] == 3

    asyncio.run(go())


def test_a_models_settings_come_from_the_process_config_without_its_queue_probe():
    from autoscaler.crd import parse_spec, settings_for
    from autoscaler.fleet.runtime import base_config

    process = Settings(fleet={"enabled": True}, mode="keda", prometheus={"url": "http://prom:9090"},
                       admission={"retry_after_s": 9}, keda={"port": 9999})
    assert process.admission.queue_probe_interval_s == 1.0
    one = settings_for(namespace="llm", spec=parse_spec(model("a")["spec"]), base=base_config(process))
    assert one.target.name == "a" and one.mode.value == "keda" and one.keda.port == 9999
    assert one.admission.retry_after_s == 9 and one.admission.queue_probe_interval_s is None
    assert one.prometheus.url == "http://prom:9090" and not one.fleet.enabled


def test_fleet_queue_probe_keeps_each_models_admission_probe():
    from autoscaler.crd import parse_spec, settings_for
    from autoscaler.fleet.runtime import base_config

    process = Settings(fleet={"enabled": True, "queue_probe": True}, mode="actuate",
                       prometheus={"url": "http://prom:9090"}, admission={"queue_probe_interval_s": 0.5})
    one = settings_for(namespace="llm", spec=parse_spec(model("a")["spec"]), base=base_config(process))
    assert one.admission.queue_probe_interval_s == 0.5


@pytest.mark.parametrize("probe", [True, False])
def test_fleet_queue_probe_reads_each_models_pods_running_requests(cluster, crd, namespace, probe):
    """With `fleet.queue_probe` a model's admission endpoint reads its pods' queue and running requests (a fake
    vLLM server behind the model's pod on the apiserver), which the slots kept for the top class need; without
    it, the tick's queue depth (no running requests: those slots are not kept)."""
    ns = namespace
    with fake_model_server() as server:
        port = int(server.rsplit(":", 1)[1])
        post_json(f"{server}/admin/state", {"waiting": 3, "running": 7})
        assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                               model_deployment(ns, "a", 1))[0] == 201
        doc = model("a")
        doc["spec"]["signals"] = {"scrape": {"port": port}}
        assert cluster.request("POST", objects_path(ns), doc)[0] == 201
        pod_at_localhost(cluster, ns)
        base = fleet_settings(ns).model_dump(exclude={"target"})
        settings = Settings(**{**base, "fleet": {**base["fleet"], "queue_probe": probe},
                               "admission": {**base["admission"], "queue_probe_interval_s": 0.2}})

        async def go():
            async with Running(cluster, settings, Hub({(ns, "a"): 40})) as run:
                await run.fleet.tick()
                admission = run.fleet.models[(ns, "a")].admission
                if probe:
                    await until(lambda: isinstance(admission.live_queue(), QueueReading), timeout_s=15)
                else:
                    await asyncio.sleep(1.0)  # five probe intervals: nothing probes
                return admission.live_queue()

        reading = asyncio.run(go())
    if probe:
        assert (reading.queue, reading.in_flight) == (3, 7)
    else:
        assert not isinstance(reading, QueueReading)


def test_run_fleet_in_keda_mode_serves_every_model_from_one_grpc_port(cluster, crd, namespace):
    from autoscaler.fleet.runtime import run_fleet

    ns = namespace
    create(cluster, ns, ["a", "b"])
    hub = Hub({(ns, "a"): 40, (ns, "b"): 20})
    grpc_port = free_port()
    settings = Settings(**{**fleet_settings(ns, mode="keda").model_dump(exclude={"target"}), "http_port": free_port(),
                           "keda": {"port": grpc_port}, "admission": {"enabled": False}})

    async def go():
        stop = asyncio.Event()
        task = asyncio.create_task(run_fleet(settings, kubeconfig=cluster.kubeconfig, host="127.0.0.1", stop=stop,
                                             hub=hub))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = pb_grpc.ExternalScalerStub(channel)
                answers = {}
                deadline = time.monotonic() + 20
                while len(answers) < 2:
                    assert time.monotonic() < deadline, answers
                    for name in ("a", "b"):
                        ref = pb.ScaledObjectRef(name=f"so-{name}", namespace=ns,
                                                 scalerMetadata={"modelAutoscaler": name})
                        try:
                            reply = await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref))
                            answers[name] = reply.metricValues[0].metricValueFloat
                        except grpc.aio.AioRpcError as err:  # not served yet, or no decision yet
                            assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
                    await asyncio.sleep(0.2)
            assert answers == {"a": 3.0, "b": 2.0}
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)

    asyncio.run(go())
