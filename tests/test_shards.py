"""Shard Leases as timelines: replicas on a manual clock (each with its own offset) over an in-memory Lease
store with the apiserver's rule (writes conditional on the resourceVersion read). At every step of 0.05 s
no shard may be owned by two replicas, each by its own clock's fencing rule."""

import asyncio
import dataclasses
import itertools
from collections import Counter

import pytest

from autoscaler.clock import ManualClock
from autoscaler.errors import PermanentError, TransientError
from autoscaler.fleet.shards import ShardLeases, even_share, shard_of
from autoscaler.kube.lease import LeaseRecord

SHARDS = 12
DURATION_S, RENEW_DEADLINE_S, RETRY_S = 4.0, 3.0, 0.5
STEP_S = 0.05


class FakeLeases:
    """The apiserver's Lease rules at our seam: create fails on an existing name, replace and delete on a
    stale resourceVersion (409); `down` makes every call of this view fail like an unreachable apiserver."""

    def __init__(self, leases: dict | None = None, versions=None) -> None:
        self.leases: dict[str, LeaseRecord] = {} if leases is None else leases
        self.versions = versions or itertools.count(1)
        self.down = False

    def view(self) -> "FakeLeases":
        return FakeLeases(self.leases, self.versions)

    def _reach(self) -> None:
        if self.down:
            raise TransientError("apiserver unreachable", kind="apiserver_unavailable")

    async def read(self, name):
        self._reach()
        return self.leases.get(name)

    async def list(self, label_selector):
        self._reach()
        key, value = label_selector.split("=")
        return [r for r in self.leases.values() if r.labels.get(key) == value]

    async def write(self, record):
        self._reach()
        current = self.leases.get(record.name)
        if record.resource_version is None and current is not None:
            raise TransientError("already exists", kind="conflict")
        if record.resource_version is not None:
            if current is None:
                raise PermanentError("not found", kind="not_found")
            if current.resource_version != record.resource_version:
                raise TransientError("stale resourceVersion", kind="conflict")
        stored = dataclasses.replace(record, resource_version=str(next(self.versions)))
        self.leases[record.name] = stored
        return stored

    async def delete(self, record):
        self._reach()
        current = self.leases.get(record.name)
        if current is None or current.resource_version != record.resource_version:
            raise TransientError("stale resourceVersion", kind="conflict")
        del self.leases[record.name]


class OffsetClock:
    """A replica's own clock: the shared manual time plus a fixed offset (clocks of two nodes differ)."""

    def __init__(self, base: ManualClock, offset_s: float) -> None:
        self.base, self.offset_s = base, offset_s

    def now(self) -> float:
        return self.base.now() + self.offset_s

    async def sleep(self, seconds):
        await self.base.sleep(seconds)

    async def wait(self, event, timeout_s):
        return await self.base.wait(event, timeout_s)


class Fleet:
    """Replicas sharing one store, stepped in time; `step` checks the fencing invariant every time."""

    def __init__(self) -> None:
        self.clock = ManualClock(1_000_000.0)
        self.store = FakeLeases()
        self.replicas: dict[str, tuple[ShardLeases, asyncio.Event, asyncio.Task]] = {}
        self.unowned_since: dict[int, float] = {}
        self.longest_unowned_s = 0.0

    def start(self, identity: str, offset_s: float = 0.0) -> ShardLeases:
        gate = ShardLeases(None, namespace="ns", identity=identity, shards=SHARDS, lease_duration_s=DURATION_S,
                           renew_deadline_s=RENEW_DEADLINE_S, retry_period_s=RETRY_S,
                           clock=OffsetClock(self.clock, offset_s), store=self.store.view())
        stop = asyncio.Event()
        self.replicas[identity] = (gate, stop, asyncio.ensure_future(gate.run(stop)))
        return gate

    async def kill(self, identity: str) -> None:
        """SIGKILL: the task ends without releasing anything."""
        _, _, task = self.replicas.pop(identity)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def stop(self, identity: str) -> None:
        _, stop, task = self.replicas.pop(identity)
        stop.set()
        await self.clock.advance(0)
        await task

    def owners(self) -> dict[int, list[str]]:
        owners: dict[int, list[str]] = {s: [] for s in range(SHARDS)}
        for identity, (gate, _, _) in self.replicas.items():
            for shard in gate.held():
                owners[shard].append(identity)
        return owners

    async def run(self, seconds: float) -> None:
        for _ in range(int(round(seconds / STEP_S))):
            await self.clock.advance(STEP_S)
            now = self.clock.now()
            for shard, who in self.owners().items():
                assert len(who) <= 1, f"shard {shard} owned by {who} at {now}"
                if who:
                    if shard in self.unowned_since:
                        self.longest_unowned_s = max(self.longest_unowned_s, now - self.unowned_since.pop(shard))
                else:
                    self.unowned_since.setdefault(shard, now)

    def counts(self) -> dict[str, int]:
        return {identity: len(gate.held()) for identity, (gate, _, _) in self.replicas.items()}

    async def close(self) -> None:
        for identity in list(self.replicas):
            await self.kill(identity)


def fleet_test(fn):
    def run():
        async def go():
            fleet = Fleet()
            try:
                await fn(fleet)
            finally:
                await fleet.close()

        asyncio.run(go())

    run.__name__ = fn.__name__
    return run


def even(counts: dict[str, int]) -> bool:
    return sum(counts.values()) == SHARDS and max(counts.values()) - min(counts.values()) <= 1


def test_shard_of_is_stable_spread_and_consistent():
    # The same in every process (a salted hash() would differ per process): pinned values.
    assert [shard_of("llm", f"model-{i}", 16) for i in range(8)] == [4, 14, 14, 0, 2, 10, 10, 9]
    counts = Counter(shard_of("ns", f"m{i}", SHARDS) for i in range(12_000))
    assert set(counts) == set(range(SHARDS)) and 900 < min(counts.values()) <= max(counts.values()) < 1100
    moved = sum(shard_of("ns", f"m{i}", SHARDS) != shard_of("ns", f"m{i}", SHARDS + 1) for i in range(12_000))
    assert moved < 1.2 * 12_000 / (SHARDS + 1)  # only the new shard's share moves
    with pytest.raises(ValueError, match="shards"):
        shard_of("ns", "m", 0)


def test_even_share_gives_the_remainder_to_the_first_by_name():
    assert [even_share(["a", "b", "c"], m, 8) for m in "abc"] == [3, 3, 2]
    assert even_share([], "solo", 8) == 8


def test_bad_timings_are_rejected():
    with pytest.raises(ValueError, match="renew_deadline_s"):
        ShardLeases(None, namespace="ns", identity="a", shards=4, lease_duration_s=4, renew_deadline_s=4,
                    retry_period_s=1, store=FakeLeases())


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 5])
def test_even_share_for_1_to_5_replicas(replicas):
    @fleet_test
    async def go(fleet):
        for i in range(replicas):
            fleet.start(f"r{i}", offset_s=0.1 * i)
        await fleet.run(3 * DURATION_S)
        counts = fleet.counts()
        assert even(counts), counts
        assert all(len(who) == 1 for who in fleet.owners().values())

    go()


@fleet_test
async def test_a_dead_replicas_shards_are_taken_over_after_expiry_only(fleet):
    for name, offset_s in (("a", 0.0), ("b", 0.3), ("c", -0.3)):
        fleet.start(name, offset_s)
    await fleet.run(3 * DURATION_S)
    gate_a = fleet.replicas["a"][0]
    orphaned = set(gate_a.held())
    last_renew_s = max(fleet.store.leases[f"inference-autoscaler-shard-{s}"].renew_s for s in orphaned)
    await fleet.kill("a")
    # Before a's Leases expire (by the earliest clock, b's +0.3 s) nobody has them.
    await fleet.run(last_renew_s + DURATION_S - 0.3 - fleet.clock.now() - STEP_S)
    assert not orphaned & {s for s, who in fleet.owners().items() if who}
    # Within one retry period more they are all taken, and the two share the twelve evenly.
    await fleet.run(RETRY_S + 2 * STEP_S + 0.3)
    assert all(fleet.owners()[s] for s in orphaned)
    await fleet.run(DURATION_S)
    assert even(fleet.counts()), fleet.counts()


@fleet_test
async def test_a_partitioned_replica_stops_before_another_starts(fleet):
    """The replica that cannot reach the apiserver keeps running with a clock 0.9 s behind; the others take
    its shards over by theirs: the invariant checked at every step says it stopped owning first."""
    fleet.start("a", offset_s=-0.9)
    fleet.start("b", offset_s=0.0)
    await fleet.run(2 * DURATION_S)
    gate_a = fleet.replicas["a"][0]
    mine = set(gate_a.held())
    assert mine
    gate_a.store.down = True
    await fleet.run(RENEW_DEADLINE_S + 0.9)
    assert not gate_a.held()  # fenced: its own clock says the renew deadline passed
    await fleet.run(DURATION_S)
    assert fleet.counts()["b"] == SHARDS
    gate_a.store.down = False  # it comes back: it takes its share again, from b's releases
    await fleet.run(2 * DURATION_S)
    assert even(fleet.counts()), fleet.counts()


@fleet_test
async def test_a_joining_replica_takes_its_share_without_a_shard_going_unattended(fleet):
    fleet.start("a")
    fleet.start("b", offset_s=0.2)
    await fleet.run(2 * DURATION_S)
    assert fleet.counts() == {"a": 6, "b": 6}
    await fleet.run(0.2)  # c's rounds fall between theirs
    fleet.longest_unowned_s = 0.0
    fleet.start("c", offset_s=-0.2)
    await fleet.run(3 * DURATION_S)
    assert fleet.counts() == {"a": 4, "b": 4, "c": 4}
    assert not fleet.unowned_since
    # A released shard is taken at the taker's next round: unheld for at most one retry period.
    assert 0 < fleet.longest_unowned_s <= RETRY_S + STEP_S


@fleet_test
async def test_a_graceful_stop_hands_over_at_once_and_leaves_the_membership(fleet):
    for name in "abc":
        fleet.start(name)
    await fleet.run(2 * DURATION_S)
    await fleet.stop("c")
    assert "inference-autoscaler-member-c" not in fleet.store.leases
    fleet.longest_unowned_s = 0.0
    await fleet.run(2 * RETRY_S)
    assert fleet.counts() == {"a": 6, "b": 6}
    assert fleet.longest_unowned_s <= RETRY_S + STEP_S


@fleet_test
async def test_owns_fences_each_model_by_its_shard(fleet):
    gate = fleet.start("a")
    await fleet.run(1.0)
    key = ("llm", "model-1")
    assert gate.owns(key) and shard_of(*key, SHARDS) in gate.held()
    gate.store.down = True
    await fleet.run(RENEW_DEADLINE_S - RETRY_S - STEP_S)
    assert gate.owns(key)  # still within the renew deadline of its last renewal
    await fleet.run(RETRY_S + STEP_S)
    assert not gate.owns(key) and not gate.held()
    assert fleet.store.leases[f"inference-autoscaler-shard-{shard_of(*key, SHARDS)}"].holder == "a"  # not expired yet


@fleet_test
async def test_dead_members_are_forgotten(fleet):
    fleet.start("a")
    fleet.start("b")
    await fleet.run(1.0)
    await fleet.kill("b")
    await fleet.run(2 * DURATION_S + 2 * RETRY_S)
    assert "inference-autoscaler-member-b" not in fleet.store.leases
    assert fleet.counts() == {"a": SHARDS}
