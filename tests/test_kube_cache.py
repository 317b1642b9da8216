"""The fleet's watch cache against a real kube-apiserver, scheduler and kwok nodes: the cached ClusterState of
each model equals the listing reader's, and after the initial sync ticks make no list or get request."""

import asyncio
import dataclasses
import json
import time

import aiohttp

import pytest
from kubernetes_asyncio.client import V1Deployment, V1DeploymentList, V1ListMeta, V1ObjectMeta

from autoscaler.config import Settings
from autoscaler.errors import TransientError
from autoscaler.kube import cache as cache_module
from autoscaler.kube.cache import Informer, KubeCache
from autoscaler.kube.readers import build_cluster_reader, build_warm_pool
from loadtest.kube.controlplane import model_deployment
from loadtest.kubecount import RequestCounter

from helpers import with_kube

MODELS = {"small": 1, "medium": 2, "big": 30}  # the big one cannot all be placed: pods wait, unschedulable


def settings(ns: str, name: str) -> Settings:
    return Settings(target={"namespace": ns, "name": name}, prometheus={"url": "http://127.0.0.1:9"},
                    capacity={"read_nodes": True})  # the idle slots and GPUs held: over every node and pod


def differences(a, b) -> dict:
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
            if getattr(a, f.name) != getattr(b, f.name)}


def listing_state(kube, s: Settings, now: float):
    return build_cluster_reader(s, kube, build_warm_pool(s, kube)).read(now)


@pytest.fixture
def models(cluster, namespace):
    for name, replicas in MODELS.items():
        status, body = cluster.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
                                       model_deployment(namespace, name, replicas))
        assert status == 201, body
    return {(namespace, name): settings(namespace, name) for name in MODELS}


def test_cached_state_equals_the_listing_readers_and_ticks_make_no_reads(cluster, models):
    ns = next(iter(models))[0]

    async def go(kube):
        counter = RequestCounter(kube)
        cache = KubeCache(kube)
        with pytest.raises(TransientError, match="not synced"):
            await cache.cluster_source((ns, "small"), models[(ns, "small")]).read(time.time())  # the tick holds
        await cache.start()
        try:
            assert await cache.wait_synced(30.0)
            deadline = time.monotonic() + 90.0  # a loaded machine's kwok and scheduler take their time
            while time.monotonic() < deadline:  # until the pods have settled and the watches have caught up
                now = time.time()
                listed = {key: await listing_state(kube, s, now) for key, s in models.items()}
                cached = {key: await cache.cluster_source(key, s).read(now) for key, s in models.items()}
                big = listed[(ns, "big")]
                # Settled: every pod of `big` Ready or unschedulable, and no idle slot left. The slots are the
                # whole cluster's: a pod of an earlier test's namespace that goes away frees a GPU, which stays
                # idle until the scheduler retries `big`'s waiting pods (after their backoff).
                if (listed == cached and listed[(ns, "medium")].ready_replicas == 2 and big.idle_slots == 0
                        and big.ready_replicas + big.unschedulable_pods == MODELS["big"]):
                    break
                for key in models:
                    cache.forget(key)  # a fresh reader each round, as the listing one: start-ups are reported once
                await asyncio.sleep(0.5)
            assert listed == cached, {k: differences(listed[k], cached[k]) for k in models if listed[k] != cached[k]}
            assert await cache.reads.live_pods(None) is await cache.reads.live_pods(None)  # one list per change
            counter.reset()
            for _ in range(5):
                for key, s in models.items():
                    await cache.cluster_source(key, s).read(time.time())
            reads = counter.reads(), dict(counter.requests)
            # a spec change: a new reader, which does not hand the policy the same start-ups again
            old = cache.cluster_source((ns, "medium"), models[(ns, "medium")])
            changed = models[(ns, "medium")].model_copy(update={"tick_deadline_s": 5.0})
            new = cache.cluster_source((ns, "medium"), changed)
            again = await new.read(time.time())
            assert new is not old and again.ready_replicas == 2 and again.startup_durations_s == ()
            return cached, *reads, cache
        finally:
            await cache.stop()

    cached, reads, requests, cache = with_kube(cluster, go)
    big = cached[(ns, "big")]
    # Not `idle_slots == 0`: that is the settling condition above, and a loaded machine's scheduler may not have
    # retried `big`'s waiting pods onto a GPU an earlier test freed within 90 s (1 idle slot, as listed too).
    assert big.unschedulable_pods > 0 and big.oldest_unschedulable_s > 0
    assert len(cached[(ns, "medium")].startup_durations_s) == 2  # learned from the cached pods too
    assert [cached[(ns, m)].gpus_held for m in MODELS] == [1.0, 2.0, big.ready_replicas]
    assert reads == 0, requests  # 5 ticks of 3 models: no list, no get
    assert all(i.relists == 0 for i in cache.informers.values())


def test_kueue_queues_come_from_watches_when_their_crds_exist(cluster, namespace):
    """With the Kueue CRDs served, the cache watches the LocalQueues and ClusterQueues: a model's quota budget
    (its ClusterQueue and the cohort's peers) equals the listing reader's, follows a quota change, and ticks
    make no request."""
    from test_capacity_kube import cluster_queue, kueue_crds

    kueue_crds(cluster)
    suffix = namespace.replace("-", "")
    for name, kwargs in ((f"q-{suffix}", dict(nominal=8, cohort=suffix, used=0)),
                         (f"peer-{suffix}", dict(nominal=4, cohort=suffix, used=1))):
        document, status_body = cluster_queue(name, **kwargs)
        created = cluster.apply(document)
        created["status"] = status_body
        assert cluster.request("PUT", f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/{name}/status", created)[0] == 200
    cluster.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                   "metadata": {"name": "models", "namespace": namespace}, "spec": {"clusterQueue": f"q-{suffix}"}},
                  namespace=namespace)
    body = model_deployment(namespace, "queued", 0)
    body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "models"
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body)[0] == 201
    key, s = (namespace, "queued"), settings(namespace, "queued")

    async def go(kube):
        cache = KubeCache(kube)
        await cache.start()
        try:
            assert await cache.wait_synced(30.0) and "clusterqueues" in cache.informers
            now = time.time()
            listed = await listing_state(kube, s, now)
            counter = RequestCounter(kube)
            cached = [await cache.cluster_source(key, s).read(now) for _ in range(3)]
            reads = counter.reads()
            patch = {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}}
            assert cluster.request("PATCH", f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/q-{suffix}", patch)[0] == 200
            deadline = time.monotonic() + 30
            while (changed := await cache.cluster_source(key, s).read(time.time())).budget_replicas == 11:
                assert time.monotonic() < deadline, "the quota change was not seen"
                await asyncio.sleep(0.2)
            return listed, cached, reads, changed
        finally:
            await cache.stop()

    listed, cached, reads, changed = with_kube(cluster, go)
    assert listed.budget_replicas == 11 and f"ClusterQueue q-{suffix}" in listed.budget_reason  # 8 + 3 lendable
    assert all((c.budget_replicas, c.budget_reason) == (listed.budget_replicas, listed.budget_reason) for c in cached)
    assert reads == 0
    assert changed.budget_replicas == 5  # 2 nominal + 3 lendable



class FakeWatchResponse:
    """What a watch request gives the client: lines of JSON events, then the end of the stream."""

    def __init__(self, *events: dict):
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]
        self.content = self

    async def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class SeamKube:
    async def call(self, what, fn, *args, **kwargs):
        return await fn(*args, **kwargs)


def deployment(name: str, version: str, **labels) -> dict:
    return {"metadata": {"name": name, "namespace": "n", "resourceVersion": version, "labels": labels}}


def test_a_watch_resumes_relists_on_410_and_backs_off_on_failures(monkeypatch):
    """At the seam (`Kube.call` and the API function the watch calls), the order the apiserver cannot be made
    to show on demand: a dropped connection (resume from the same version after a backoff), a 410 (list
    again), events, the end of a watch (resume)."""
    monkeypatch.setattr(cache_module, "BACKOFF_FIRST_S", 0.01)
    calls = []
    answers = [aiohttp.ClientConnectionError("reset"),
               FakeWatchResponse({"type": "ERROR", "object": {"code": 410, "reason": "Gone", "message": "old"}}),
               FakeWatchResponse({"type": "ADDED", "object": deployment("b", "6", app="x")},
                                 {"type": "MODIFIED", "object": deployment("b", "7", app="y")},
                                 {"type": "DELETED", "object": deployment("a", "8")})]

    async def list_deployments(**kwargs):
        """:rtype: V1DeploymentList"""
        calls.append(("watch" if kwargs.get("watch") else "list", kwargs.get("resource_version")))
        if not kwargs.get("watch"):
            return V1DeploymentList(items=[V1Deployment(metadata=V1ObjectMeta(name="a", namespace="n"))],
                                    metadata=V1ListMeta(resource_version=str(len(calls))))
        if not answers:
            await asyncio.sleep(3600)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def go():
        informer = Informer(SeamKube(), "deployments", list_deployments)
        task = asyncio.create_task(informer.run())
        for _ in range(200):
            if not answers and len(calls) >= 6:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return informer

    informer = asyncio.run(go())
    assert calls == [("list", None), ("watch", "1"), ("watch", "1"), ("list", None), ("watch", "4"), ("watch", "8")]
    assert informer.relists == 1 and list(informer.items) == [("n", "b")] and informer.resource_version == "8"
    assert informer.by_label == {("n", "app", "x"): {}, ("n", "app", "y"): {("n", "b"): informer.items[("n", "b")]}}
