"""Leases on coordination.k8s.io: the record, the store that reads and writes it, and leader election.

A Lease is held by `holderIdentity` until `renewTime + leaseDurationSeconds`; a candidate takes it over only
once it has not been renewed for that long (`claim`). Every write carries the resourceVersion it read, so
two candidates racing for an expired Lease cannot both win (the loser gets a 409, a `TransientError` of
kind `conflict`). Time is the controller's clock (unix seconds, what other candidates compare the Lease's
renewTime against).

`LeaseStore` is the seam: `KubeLeases` talks to the apiserver, tests fake it in a few lines. The shard
Leases of the fleet (`autoscaler.fleet.shards`) use the same record, store and `claim` rule.

`LeaderElector`: the leader renews the Lease every `retry_period_s`. A leader that cannot renew within
`renew_deadline_s` steps down before another can take over. On shutdown the leader releases the Lease
(holder cleared) so a successor need not wait for it to expire.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from kubernetes_asyncio.client import V1DeleteOptions, V1Preconditions

from autoscaler.clock import Clock
from autoscaler.errors import EdgeError, PermanentError
from autoscaler.kube.client import Kube, object_time
from autoscaler.times import micro_time


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says; `resource_version` is None for one not yet created."""

    name: str
    holder: str | None
    renew_s: float
    acquire_s: float
    duration_s: float
    transitions: int = 0
    resource_version: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    def live(self, now: float) -> bool:
        """Held by someone, and renewed within its duration by the clock `now` comes from."""
        return bool(self.holder) and now < self.renew_s + self.duration_s


def claim(current: LeaseRecord | None, *, name: str, identity: str, now: float, duration_s: float,
          labels: Mapping[str, str] | None = None) -> LeaseRecord | None:
    """The record to write so that `identity` holds the Lease from `now` (a renewal, or a take-over of a free
    or expired one), or None while someone else holds it live."""
    if current is None:
        return LeaseRecord(name=name, holder=identity, renew_s=now, acquire_s=now, duration_s=duration_s,
                           labels=dict(labels or {}))
    if current.holder == identity:
        return dataclasses.replace(current, renew_s=now, duration_s=duration_s)
    if current.live(now):
        return None
    return dataclasses.replace(current, holder=identity, renew_s=now, acquire_s=now, duration_s=duration_s,
                               transitions=current.transitions + 1)


class LeaseStore(Protocol):
    async def read(self, name: str) -> LeaseRecord | None: ...

    async def list(self, label_selector: str) -> list[LeaseRecord]: ...

    async def write(self, record: LeaseRecord) -> LeaseRecord:
        """Create (no resource_version) or replace on the record's resource_version; the stored record back."""
        ...

    async def delete(self, record: LeaseRecord) -> None:
        """Delete if still at the record's resource_version."""
        ...


class KubeLeases:
    """Leases of one namespace on the apiserver."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace

    @staticmethod
    def _record(lease) -> LeaseRecord:
        spec = lease.spec
        return LeaseRecord(name=lease.metadata.name, holder=spec.holder_identity or None,
                           renew_s=object_time(spec.renew_time) or 0.0, acquire_s=object_time(spec.acquire_time) or 0.0,
                           duration_s=float(spec.lease_duration_seconds or 0), transitions=spec.lease_transitions or 0,
                           resource_version=lease.metadata.resource_version, labels=dict(lease.metadata.labels or {}))

    def _body(self, record: LeaseRecord) -> dict:
        metadata = {"name": record.name, "namespace": self.namespace}
        if record.labels:
            metadata["labels"] = dict(record.labels)
        if record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": record.holder,
                # an integer in the API: never round a duration down to below what the holder assumes
                "leaseDurationSeconds": max(1, int(round(record.duration_s))),
                "acquireTime": micro_time(record.acquire_s),
                "renewTime": micro_time(record.renew_s),
                "leaseTransitions": record.transitions,
            },
        }

    async def read(self, name: str) -> LeaseRecord | None:
        coordination = self.kube.coordination
        try:
            lease = await self.kube.call("read lease", coordination.read_namespaced_lease, name, self.namespace)
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            return None
        return self._record(lease)

    async def list(self, label_selector: str) -> list[LeaseRecord]:
        leases = await self.kube.call("list leases", self.kube.coordination.list_namespaced_lease, self.namespace,
                                      label_selector=label_selector)
        return [self._record(lease) for lease in leases.items]

    async def write(self, record: LeaseRecord) -> LeaseRecord:
        coordination, body = self.kube.coordination, self._body(record)
        if record.resource_version is None:
            lease = await self.kube.call("create lease", coordination.create_namespaced_lease, self.namespace, body)
        else:
            lease = await self.kube.call("update lease", coordination.replace_namespaced_lease, record.name,
                                         self.namespace, body)
        return self._record(lease)

    async def delete(self, record: LeaseRecord) -> None:
        options = V1DeleteOptions(preconditions=V1Preconditions(resource_version=record.resource_version))
        await self.kube.call("delete lease", self.kube.coordination.delete_namespaced_lease, record.name,
                             self.namespace, body=options)


class LeaderElector:
    def __init__(self, kube: Kube, *, namespace: str, name: str, identity: str, lease_duration_s: float,
                 renew_deadline_s: float, retry_period_s: float, clock: Clock | None = None,
                 store: LeaseStore | None = None) -> None:
        self.store = store or KubeLeases(kube, namespace)
        self.name, self.identity = name, identity
        self.duration, self.renew_deadline, self.retry = lease_duration_s, renew_deadline_s, retry_period_s
        self.clock = clock or kube.clock
        self.is_leader = False
        self._last_renew = 0.0

    async def try_acquire_or_renew(self) -> bool:
        """One round; returns whether we hold the Lease afterwards."""
        now = self.clock.now()
        record = claim(await self.store.read(self.name), name=self.name, identity=self.identity, now=now,
                       duration_s=self.duration)
        if record is None:
            return False  # someone else holds a live lease
        await self.store.write(record)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                held = await self.try_acquire_or_renew()
                if held:
                    self._last_renew = self.clock.now()
                self.is_leader = held
            except EdgeError:
                # Could not reach or update the Lease: keep leading only within the renew deadline.
                if self.is_leader and self.clock.now() - self._last_renew > self.renew_deadline:
                    self.is_leader = False
            await self.clock.wait(stop, self.retry)
        await self.release()

    async def release(self) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            await release(self.store, self.name, identity=self.identity, now=self.clock.now())
        except EdgeError:
            pass  # it expires on its own


async def release(store: LeaseStore, name: str, *, identity: str, now: float,
                  current: LeaseRecord | None = None) -> bool:
    """Clear the holder if it is still `identity` (conditional on the version read); whether it was written."""
    current = current if current is not None else await store.read(name)
    if current is None or current.holder != identity:
        return False
    await store.write(dataclasses.replace(current, holder=None, renew_s=now))
    return True
