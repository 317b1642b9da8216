"""The pooled warm pool's ready slots, read once for the whole fleet (autoscaler/kube/pooledwarm.py `ready`):
concurrent callers share the read in flight (one list, not one per model), and a failed read serves the last
good one for at most `stale_max_s`, then no slot, never an error. At our `Kube` seam with a manual clock, then
the list count on a real kube-apiserver serving the CapacityBuffer CRD (alone and in a fleet tick)."""

import asyncio
import contextlib
import logging
import time
from types import SimpleNamespace as NS

import structlog
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.clock import ManualClock
from autoscaler.kube.client import Kube
from autoscaler.kube.pooledwarm import SHAPE_LABEL, PooledCapacityBuffer
from autoscaler.kube.warmpool import BUFFER_PLURAL, MANAGED_BY

from loadtest.kubecount import RequestCounter

from helpers import with_kube
from test_fleet import Running, crd  # noqa: F401 - crd: the fixture
from test_fleet_allocation import RateHub, two_pooling_models
from test_pooled_buffer import buffer_api, buffers_path  # noqa: F401 - buffer_api: the fixture
from test_pooled_warm import PAUSE

FITS = {"type": "Provisioning", "status": "True", "reason": "Provisioned", "message": "fits",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}


class FakeKube:
    """The `Kube` seam: its `call` (errors translated) over a CapacityBuffer list that counts its requests,
    waits for `release` when set, and fails with HTTP `failing` when set."""

    call = Kube.call

    def __init__(self):
        self.clock, self.lists, self.failing, self.release = ManualClock(1000.0), 0, None, None

        async def list_buffers(group, version, namespace, plural, **kwargs):
            self.lists += 1
            if self.release is not None:
                await self.release.wait()
            if self.failing is not None:
                raise ApiException(status=self.failing, reason="Service Unavailable")
            return {"items": [{"metadata": {"name": "fleet-warm-1gpu", "labels": {SHAPE_LABEL: "1", **MANAGED_BY}},
                               "status": {"replicas": 2, "conditions": [FITS]}}]}

        self.custom = NS(list_namespaced_custom_object=list_buffers)


@contextlib.contextmanager
def every_level():
    """Log at every level for the block: a harness module run earlier in the process (loadtest.controllerday)
    configures structlog to drop lines below warning, and `capture_logs` keeps that filter."""
    saved = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET))
    try:
        yield
    finally:
        structlog.configure(wrapper_class=saved)


def test_concurrent_reads_share_one_list():
    """20 models reading at once while the list is in flight: one list, every one gets its answer; a caller
    cancelled (its tick's deadline) does not cancel the read the others await."""
    kube = FakeKube()
    pool = PooledCapacityBuffer(kube, namespace="ctl", priority_class="p", pause_image=PAUSE, max_slots=4)

    async def go():
        kube.release = asyncio.Event()
        readers = [asyncio.ensure_future(pool.ready()) for _ in range(20)]
        await asyncio.sleep(0)
        readers[0].cancel()
        kube.release.set()
        return await asyncio.gather(*readers[1:]), readers[0].cancelled()

    answers, cancelled = asyncio.run(go())
    assert kube.lists == 1 and cancelled
    assert answers == [{1: 2}] * 19


def test_a_failed_read_serves_the_last_one_for_a_few_seconds_then_no_slot():
    """A good read of 2 slots; the list fails (503) from then on: 2 s later the last read is served (and kept
    for the TTL: one list per second, not per model), still at 3 s, none 6 s after the good read; a log line
    says each change (not each failed read); a read that succeeds again counts the slots again."""
    kube = FakeKube()
    pool = PooledCapacityBuffer(kube, namespace="ctl", priority_class="p", pause_image=PAUSE, max_slots=4,
                                ready_ttl_s=1.0, stale_max_s=5.0)

    async def go():
        seen = [await pool.ready()]
        kube.failing = 503
        with every_level(), structlog.testing.capture_logs() as logs:
            await kube.clock.advance(2.0)
            seen += [await pool.ready(), await pool.ready()]
            await kube.clock.advance(1.0)
            seen.append(await pool.ready())
            await kube.clock.advance(3.0)
            seen += [await pool.ready()]
            await kube.clock.advance(1.0)
            seen += [await pool.ready()]
            kube.failing = None
            await kube.clock.advance(1.0)
            seen.append(await pool.ready())
        return seen, logs

    seen, logs = asyncio.run(go())
    assert seen == [{1: 2}, {1: 2}, {1: 2}, {1: 2}, {}, {}, {1: 2}]
    assert kube.lists == 6  # the good one, one per TTL while failing (at 2, 3, 6, 7 s), the good one again
    assert [(e["event"], e.get("kind")) for e in logs] == [
        ("pooled warm slots not read: the last read's are served", "apiserver_unavailable"),
        ("pooled warm slots not read: none counted until a read succeeds", "apiserver_unavailable"),
        ("pooled warm slots read again", None)]
    assert logs[0]["age_s"] == 2.0 and "HTTP 503" in logs[0]["error"]


def test_a_read_that_never_answers_fails_after_its_timeout_and_the_next_tick_reads_again():
    """A list that hangs (an apiserver stall; the client sets no timeout of its own) must not hold every model
    of every later tick on the one read in flight: it fails after `read_timeout_s` like an API error (the last
    good read is served), and the next read after the TTL is a new list."""
    kube = FakeKube()
    pool = PooledCapacityBuffer(kube, namespace="ctl", priority_class="p", pause_image=PAUSE, max_slots=4,
                                ready_ttl_s=1.0, stale_max_s=5.0, read_timeout_s=0.05)

    async def go():
        seen = [await pool.ready()]
        kube.release = asyncio.Event()  # never set: every list from now on hangs
        await kube.clock.advance(2.0)
        seen.append(await asyncio.wait_for(pool.ready(), 1.0))
        await kube.clock.advance(2.0)
        seen.append(await asyncio.wait_for(pool.ready(), 1.0))
        await kube.clock.advance(2.0)
        seen.append(await asyncio.wait_for(pool.ready(), 1.0))
        return seen

    assert asyncio.run(go()) == [{1: 2}, {1: 2}, {1: 2}, {}]
    assert kube.lists == 4


def lists_of_buffers(counter: RequestCounter) -> int:
    return sum(n for (method, path), n in counter.requests.items()
               if method == "GET" and path.endswith(f"/{BUFFER_PLURAL}"))


def test_twenty_concurrent_reads_make_one_list_on_the_apiserver(cluster, namespace, buffer_api):  # noqa: F811
    """A pooled 1-GPU buffer of ours whose status says 2 fit; 20 concurrent reads: 1 list, 2 slots each."""
    buffer = {"apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
              "metadata": {"name": "fleet-warm-1gpu", "labels": {SHAPE_LABEL: "1", **MANAGED_BY}},
              "spec": {"podTemplateRef": {"name": "fleet-warm-1gpu"}, "replicas": 2}}
    deadline = time.monotonic() + 30
    while (status := cluster.request("POST", buffers_path(namespace), buffer)[0]) != 201:  # storage starting: 429
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert cluster.request("PATCH", buffers_path(namespace, "fleet-warm-1gpu") + "/status",
                           {"status": {"replicas": 2, "conditions": [FITS]}})[0] == 200

    async def go(kube):
        pool = PooledCapacityBuffer(kube, namespace=namespace, priority_class="p", pause_image=PAUSE, max_slots=4)
        counter = RequestCounter(kube)
        answers = await asyncio.gather(*(pool.ready() for _ in range(20)))
        return answers, lists_of_buffers(counter)

    answers, lists = with_kube(cluster, go)
    assert answers == [{1: 2}] * 20 and lists == 1


def test_a_fleet_tick_lists_the_pooled_buffers_once(cluster, crd, namespace, buffer_api):  # noqa: F811
    """Two models of one shape on the fleet's watch cache, a pooled buffer: a tick reads the buffers' status
    once for both models; with the fleet's own list when it sizes the pool (its shapes gone), 2 lists (3
    before: one per model)."""
    settings = two_pooling_models(cluster, namespace)
    settings = settings.model_copy(update={"warm_pool": settings.warm_pool.model_copy(
        update={"backend": "capacity-buffer"})})

    async def go():
        hub = RateHub({(namespace, "a"): 64, (namespace, "b"): 64})
        async with Running(cluster, settings, hub, cached=True) as run:
            await run.fleet.tick()  # the models are built and the buffer written
            assert cluster.request("PATCH", buffers_path(namespace, "fleet-warm-1gpu") + "/status",
                                   {"status": {"replicas": 3, "conditions": [FITS]}})[0] == 200
            await asyncio.sleep(run.fleet.step.pooled.ready_ttl_s)
            counter = RequestCounter(run.kube)
            await run.fleet.tick()
            return lists_of_buffers(counter), {k[1]: m.decision for k, m in run.fleet.models.items()}

    lists, decisions = asyncio.run(go())
    assert lists == 2
    # both models decided on that read (how many of its slots each counts depends on the free room on the
    # shared control plane's Ready nodes, which other tests' nodes change: tests/test_capacity_kube.py pins it)
    assert sorted(decisions) == ["a", "b"] and all(d is not None and d.valid for d in decisions.values()), decisions
