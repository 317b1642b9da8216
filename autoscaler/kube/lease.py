"""Leader election on a coordination.k8s.io Lease, so two controller replicas can run and one acts.

The leader renews the Lease every `retry_period_s`; a candidate takes it over only once it has not been
renewed for `lease_duration_s`. Every write carries the resourceVersion it read, so two candidates
racing for an expired Lease cannot both win (the loser gets a 409). A leader that cannot renew within
`renew_deadline_s` steps down before another can take over. On shutdown the leader releases the Lease
(holder cleared) so a successor need not wait for it to expire. Time is the controller's clock (unix
seconds, what other candidates compare the Lease's renewTime against).
"""

from __future__ import annotations

import asyncio

from autoscaler.clock import Clock
from autoscaler.errors import EdgeError, PermanentError
from autoscaler.kube.client import Kube, object_time
from autoscaler.times import micro_time


class LeaderElector:
    def __init__(self, kube: Kube, *, namespace: str, name: str, identity: str, lease_duration_s: float,
                 renew_deadline_s: float, retry_period_s: float, clock: Clock | None = None) -> None:
        self.kube = kube
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration, self.renew_deadline, self.retry = lease_duration_s, renew_deadline_s, retry_period_s
        self.clock = clock or kube.clock
        self.is_leader = False
        self._last_renew = 0.0

    def _body(self, now: float, *, resource_version: str | None, acquire: float, transitions: int,
              holder: str | None) -> dict:
        metadata = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": int(round(self.duration)),
                "acquireTime": micro_time(acquire),
                "renewTime": micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    async def try_acquire_or_renew(self) -> bool:
        """One round; returns whether we hold the Lease afterwards."""
        now = self.clock.now()
        coordination = self.kube.coordination
        try:
            lease = await self.kube.call("read lease", coordination.read_namespaced_lease, self.name, self.namespace)
        except PermanentError as exc:
            if exc.kind != "not_found":
                raise
            body = self._body(now, resource_version=None, acquire=now, transitions=0, holder=self.identity)
            await self.kube.call("create lease", coordination.create_namespaced_lease, self.namespace, body)
            return True
        spec = lease.spec
        holder = spec.holder_identity
        renewed = object_time(spec.renew_time) or 0.0
        duration = spec.lease_duration_seconds or self.duration
        transitions = spec.lease_transitions or 0
        if holder == self.identity:
            acquire = object_time(spec.acquire_time) or now
        elif holder and now < renewed + duration:
            return False  # someone else holds a live lease
        else:
            acquire, transitions = now, transitions + 1
        body = self._body(now, resource_version=lease.metadata.resource_version, acquire=acquire,
                          transitions=transitions, holder=self.identity)
        await self.kube.call("update lease", coordination.replace_namespaced_lease, self.name, self.namespace, body)
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
            lease = await self.kube.call("read lease", self.kube.coordination.read_namespaced_lease, self.name,
                                         self.namespace)
            if lease.spec.holder_identity != self.identity:
                return
            now = self.clock.now()
            body = self._body(now, resource_version=lease.metadata.resource_version,
                              acquire=object_time(lease.spec.acquire_time) or now,
                              transitions=lease.spec.lease_transitions or 0, holder=None)
            await self.kube.call("release lease", self.kube.coordination.replace_namespaced_lease, self.name,
                                 self.namespace, body)
        except EdgeError:
            pass  # it expires on its own
