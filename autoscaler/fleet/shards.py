"""Sharding the fleet over controller replicas with coordination.k8s.io Leases (no other consensus).

Models hash to a fixed number of shards (`shard_of`: jump consistent hash of a 64-bit BLAKE2b digest of
`namespace/name`, the same in every process and Python version, unlike the salted `hash()`). Shard `i` has
the Lease `<group>-shard-<i>`. A replica acts on a model only while it holds the model's shard Lease.

Membership, with Leases only: every replica holds its own Lease `<group>-member-<identity>`, renewed with
the shard Leases every `retry_period_s`. The live members are the member Leases renewed within their
duration by this replica's clock (itself always counted). With `n` members sorted by identity, the first
`shards % n` take `shards // n + 1` shards and the others `shards // n`: the targets sum to `shards`, so
when every replica has its target every shard is held. Member Leases expired for a further duration are
deleted (conditionally) by whoever sees them.

One round (every `retry_period_s`): renew the member Lease; list the group's Leases (one request); renew the
held shards; release the surplus over the target, but only while a live member holds fewer than its own
target (so a released shard has a taker at its next round: the hand-over leaves a shard unheld for at most
one retry period); take free shards (never created, released, or expired by our clock) up to the target,
and any shard left free for a whole lease duration regardless of the target, so no view of the membership
can leave a shard unattended. Every write is conditional on the resourceVersion listed: two replicas racing
for a shard cannot both win (`autoscaler.kube.lease.claim`, the rule leader election uses too).

Fencing (`owns`): a shard counts as ours only while `now < t + renew_deadline_s`, where `t` is our clock's
reading taken before the write that last renewed it (and written as its renewTime). Another replica takes
it over only once its own clock passes `renewTime + lease_duration_s`, so a replica that cannot renew stops
acting `lease_duration_s - renew_deadline_s` (the margin) before anyone else may start; the margin covers
the clock offset between replicas and the time a write checked by `owns` may take to land. A release
forgets the shard before the write that frees it. A failed renewal keeps the shard until its fence ends; a
conflict (someone else holds it) drops it at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from autoscaler.clock import Clock, SystemClock
from autoscaler.crd import GROUP
from autoscaler.errors import EdgeError, TransientError
from autoscaler.kube.client import Kube
from autoscaler.kube.lease import KubeLeases, LeaseRecord, LeaseStore, claim, release

GROUP_LABEL = f"{GROUP}/shard-group"
ROLE_LABEL = f"{GROUP}/lease-role"
SHARD_LABEL = f"{GROUP}/shard"
DEFAULT_GROUP = "inference-autoscaler"

log = structlog.get_logger("autoscaler")


def shard_of(namespace: str, name: str, shards: int) -> int:
    """The shard of the model `namespace/name`, in [0, shards). Jump consistent hash (Lamping and Veach
    2014): going from `shards` to `shards + 1` moves only a 1/(shards + 1) share of the models."""
    if shards < 1:
        raise ValueError(f"shards ({shards}) must be at least 1")
    key = int.from_bytes(hashlib.blake2b(f"{namespace}/{name}".encode(), digest_size=8).digest(), "big")
    bucket, jump = -1, 0
    while jump < shards:
        bucket = jump
        key = (key * 2862933555777941757 + 1) % (1 << 64)
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def even_share(members: list[str], identity: str, shards: int) -> int:
    """How many shards `identity` should hold among `members` (the first `shards % n` by name take one more)."""
    ordered = sorted(set(members) | {identity})
    base, extra = divmod(shards, len(ordered))
    return base + (1 if ordered.index(identity) < extra else 0)


def _dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:200] or "replica"


@dataclass
class _Held:
    record: LeaseRecord  # as last written (its resourceVersion is what the next write is conditional on)
    fence_start_s: float  # our clock before that write: we own the shard until this + renew_deadline_s


class ShardMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry or CollectorRegistry()
        self.held = Gauge("autoscaler_shards_held", "Shard Leases this replica holds (fenced)", registry=r)
        self.target = Gauge("autoscaler_shards_target", "Shards this replica should hold (its even share)",
                            registry=r)
        self.members = Gauge("autoscaler_shard_members", "Live controller replicas seen (member Leases)", registry=r)
        self.transitions = Counter("autoscaler_shard_transitions_total", "Shard Lease changes of this replica: "
                                   "acquired (free), taken_over (expired), released (hand-over), lost", ["event"],
                                   registry=r)


class ShardLeases:
    """A ShardGate: `run` keeps this replica's share of the shard Leases, `owns` fences every write."""

    def __init__(self, kube: Kube | None, *, namespace: str, identity: str, shards: int, lease_duration_s: float,
                 renew_deadline_s: float, retry_period_s: float, clock: Clock | None = None,
                 store: LeaseStore | None = None, group: str = DEFAULT_GROUP,
                 registry: CollectorRegistry | None = None) -> None:
        if shards < 1:
            raise ValueError(f"shards ({shards}) must be at least 1")
        if not 0 < retry_period_s < renew_deadline_s < max(1, round(lease_duration_s)):
            raise ValueError(f"need 0 < retry_period_s ({retry_period_s}) < renew_deadline_s ({renew_deadline_s}) "
                             f"< lease_duration_s ({lease_duration_s}, whole seconds in a Lease)")
        if store is None and kube is None:
            raise ValueError("ShardLeases needs a Kube client or a LeaseStore")
        self.store = store or KubeLeases(kube, namespace)  # type: ignore[arg-type]
        self.identity, self.shards, self.group = identity, shards, group
        self.duration_s, self.renew_deadline_s, self.retry_s = lease_duration_s, renew_deadline_s, retry_period_s
        self.clock = clock or (kube.clock if kube is not None else SystemClock())
        self.metrics = ShardMetrics(registry)
        self.member_name = f"{group}-member-{_dns_label(identity)}"
        self._member: LeaseRecord | None = None
        self._held: dict[int, _Held] = {}

    # --- the gate -------------------------------------------------------------------------------------------
    def _fenced(self, shard: int, now: float) -> bool:
        held = self._held.get(shard)
        return held is not None and now < held.fence_start_s + self.renew_deadline_s

    def owns(self, key: tuple[str, str]) -> bool:
        return self._fenced(shard_of(key[0], key[1], self.shards), self.clock.now())

    def held(self) -> frozenset[int]:
        now = self.clock.now()
        return frozenset(shard for shard in self._held if self._fenced(shard, now))

    # --- one round ------------------------------------------------------------------------------------------
    def _labels(self, role: str, shard: int | None = None) -> dict[str, str]:
        labels = {GROUP_LABEL: self.group, ROLE_LABEL: role}
        if shard is not None:
            labels[SHARD_LABEL] = str(shard)
        return labels

    async def _renew_member(self, now: float) -> None:
        try:
            current = self._member or await self.store.read(self.member_name)
            record = claim(current, name=self.member_name, identity=self.identity, now=now,
                           duration_s=self.duration_s, labels=self._labels("member"))
            self._member = await self.store.write(record) if record is not None else None
        except EdgeError as exc:
            self._member = None  # read it afresh next round
            log.warning("shard_member_renew_failed", identity=self.identity, error=str(exc))

    def _members(self, leases: list[LeaseRecord], now: float) -> list[str]:
        alive = {r.holder for r in leases if r.labels.get(ROLE_LABEL) == "member" and r.live(now)}
        return sorted({h for h in alive if h} | {self.identity})

    async def _forget_dead_members(self, leases: list[LeaseRecord], now: float) -> None:
        for record in leases:
            if record.labels.get(ROLE_LABEL) == "member" and now > record.renew_s + 2 * record.duration_s:
                try:
                    await self.store.delete(record)
                except EdgeError:
                    pass  # someone else deleted it, or it came back to life

    async def _write(self, shard: int, record: LeaseRecord, now: float, *, event: str | None = None,
                     previous: str | None = None) -> None:
        try:
            stored = await self.store.write(record)
        except TransientError as exc:
            if exc.kind == "conflict":
                self._drop(shard, "lost", reason=str(exc))
            return  # unreachable: our fence runs out on its own
        except EdgeError as exc:
            log.warning("shard_write_failed", shard=shard, error=str(exc))
            return
        self._held[shard] = _Held(stored, now)
        if event is not None:
            self.metrics.transitions.labels(event).inc()
            log.info(f"shard_{event}", shard=shard, identity=self.identity, previous_holder=previous)

    def _drop(self, shard: int, event: str, **fields) -> None:
        if self._held.pop(shard, None) is not None:
            self.metrics.transitions.labels(event).inc()
            log.info(f"shard_{event}", shard=shard, identity=self.identity, **fields)

    async def _release(self, shard: int, record: LeaseRecord, now: float) -> None:
        self._held.pop(shard, None)  # stop acting before the write that lets another take it
        self.metrics.transitions.labels("released").inc()
        log.info("shard_released", shard=shard, identity=self.identity)
        try:
            await release(self.store, record.name, identity=self.identity, now=now, current=record)
        except EdgeError as exc:
            log.warning("shard_release_failed", shard=shard, error=str(exc))  # it expires on its own

    def _plan(self, shards: dict[int, LeaseRecord], members: list[str], now: float
              ) -> tuple[list[int], list[int], list[int]]:
        """(held shards to renew, to release, free shards to take), from the listed Leases."""
        target = even_share(members, self.identity, self.shards)
        mine = sorted(s for s, r in shards.items() if r.holder == self.identity)
        free = [s for s in range(self.shards) if s not in mine and (s not in shards or not shards[s].live(now))]
        # Hand over only what others want and cannot find free: each release has a taker next round.
        deficit = sum(max(0, even_share(members, m, self.shards)
                          - sum(1 for r in shards.values() if r.holder == m and r.live(now)))
                      for m in members if m != self.identity)
        surplus = max(0, min(len(mine) - target, deficit - len(free)))
        keep, give = mine[:len(mine) - surplus], mine[len(mine) - surplus:]
        room = max(0, target - len(keep))
        orphans = [s for s in free[room:] if s in shards and now - _free_since(shards[s]) > self.duration_s]
        self.metrics.target.set(target)
        self.metrics.members.set(len(members))
        return keep, give, free[:room] + orphans

    async def round(self) -> None:
        now = self.clock.now()
        await self._renew_member(now)
        leases = await self.store.list(f"{GROUP_LABEL}={self.group}")
        shards = {int(r.labels[SHARD_LABEL]): r for r in leases
                  if r.labels.get(ROLE_LABEL) == "shard" and r.labels.get(SHARD_LABEL, "").isdigit()
                  and int(r.labels[SHARD_LABEL]) < self.shards}
        for shard in list(self._held):
            if shards.get(shard) is None or shards[shard].holder != self.identity:
                self._drop(shard, "lost", holder=record_holder(shards.get(shard)))
        keep, give, take = self._plan(shards, self._members(leases, now), now)
        writes = [self._release(s, shards[s], now) for s in give]
        for s in keep + take:
            current = shards.get(s)
            record = claim(current, name=f"{self.group}-shard-{s}", identity=self.identity, now=now,
                           duration_s=self.duration_s, labels=self._labels("shard", s))
            if record is None:
                continue
            event = None if s in keep else ("taken_over" if current is not None and current.holder else "acquired")
            writes.append(self._write(s, record, now, event=event, previous=record_holder(current)))
        await asyncio.gather(*writes)
        await self._forget_dead_members(leases, now)
        self.metrics.held.set(len(self.held()))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.round()
            except EdgeError as exc:
                log.warning("shard_round_failed", identity=self.identity, error=str(exc))
            await self.clock.wait(stop, self.retry_s)
        await self.release_all()

    async def release_all(self) -> None:
        """On a graceful stop: hand every shard over at once and leave the membership."""
        now = self.clock.now()
        await asyncio.gather(*(self._release(s, held.record, now) for s, held in list(self._held.items())))
        self.metrics.held.set(0)
        if self._member is not None:
            try:
                await self.store.delete(self._member)
            except EdgeError:
                pass  # it expires on its own
            self._member = None


def record_holder(record: LeaseRecord | None) -> str | None:
    return None if record is None else record.holder


def _free_since(record: LeaseRecord) -> float:
    """When a free shard's Lease became free: its release (holder cleared), or its expiry."""
    return record.renew_s if not record.holder else record.renew_s + record.duration_s
