"""The fleet decision step of a fleet tick: after every model's own `decide`, before any model is finished.

Each model first decides alone (`loop.Controller.decide`). This step then reads, for every model, what it
decided, its replica shape (GPUs per replica, from its pod template) and its ModelAutoscaler's tier and
weight, and decides the fleet together with `policies.fleet.allocate` on the fleet's budgets. Every model
then finishes its tick (`loop.Controller.finish`: publish, status, scale) with its allocation in place of
its own replicas, warm slots and shed levels. The allocation's reasons are added to the model's own, and
`capped_by_budget` is set when the fleet gave fewer replicas than the model asked for (the status condition
CappedByBudget).

Budgets. In fleet mode the process config's `capacity.max_gpus` is the fleet's GPU cap (each model's own cap
is its object's `budget.maxGPUs`, which its own `decide` applies), and `capacity.namespace_max_gpus` is
every namespace's cap.

Pooled warm capacity. With a `PooledWarmPool` the warm slots are the fleet's, one placeholder set per replica
shape (`autoscaler/kube/pooledwarm.py`), sized from `FleetDecision.warm_by_shape`. Each model's warm pool is
then its view of the pooled one (`PooledWarmPool.share`, given to its controller by `ModelBuilder`): its
cluster reader counts the ready pooled slots of its shape (its lead time is the start-up alone while one is
free), and it writes no placeholder of its own (its decision's `warm_slots` is 0; a reason names its share
of the pool). The pool is written only where `write_pool` holds (actuate mode, and the process's leader).

Drains. Each model's `drain_s` is its pods' termination grace period (30 s, Kubernetes' default, when
unset): the longest a reclaim of its GPUs waits for one of its replicas to drain. It ranks a higher tier's
warm slots before this model's replicas when the budget binds (the higher tier's growth risk over that
drain, over its node provisioning time, the window its warm need covers), and it is part of a nominal
claim's reclaim horizon (policies/fleet.py).

Floors. A model's `min_replicas` (0 when it may scale to zero) is the floor its scale actuator keeps
whatever it is told, so the fleet guarantees it as the model's nominal quota (served before every tier;
what the model does not use of it is lent). Floors that sum above the cap are still raised by the actuators:
the reasons of the models left short say so ("capped by fleet budget").

Safe holds. A model whose own decision is invalid still counts, with its current replicas as its demand, so
that what it holds is not given to others; its decision stays invalid and nothing is applied to it. A model
whose pod template cannot be read (or whose input the fleet decision refuses) is held with a reason and left
out of the allocation. A model that decided nothing this tick (it failed or was late) is also left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import structlog

from autoscaler.errors import EdgeError
from autoscaler.kube.capacity import replica_shape
from autoscaler.kube.pooledwarm import PooledWarmPool
from autoscaler.loop import Decided
from policies import Decision
from policies.fleet import Budgets, FleetDecision, FleetSpec, FleetState, ModelDemand, allocate, class_demand

log = structlog.get_logger("autoscaler")

Key = tuple[str, str]
DEFAULT_GRACE_S = 30.0  # a pod's terminationGracePeriodSeconds when its spec leaves it out


@dataclass(frozen=True)
class Member:
    """One model as the fleet step reads it."""

    key: Key
    decided: Decided
    template: Any  # its pod template (V1PodTemplateSpec)
    tier: int = 1
    weight: float = 1.0
    drain_s: float = 0.0
    min_replicas: int = 0  # the floor its scale actuator keeps: guaranteed by the fleet (as a nominal quota)


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def _finite(seconds: float | None) -> float | None:
    return seconds if seconds is not None and math.isfinite(seconds) else None


def demand_of(member: Member, spec: FleetSpec) -> ModelDemand:
    """What the fleet decision reads of one model; a held model asks for what it has. ValueError on bad input."""
    decision, cluster = member.decided.decision, member.decided.signals.cluster
    gpus = replica_shape(member.template).gpus
    if gpus <= 0 or gpus != int(gpus):
        raise ValueError(f"its replica requests {gpus} GPUs; the fleet budget counts whole GPUs (>= 1)")
    asked = decision if decision.valid else Decision(replicas=cluster.spec_replicas if cluster else 0)
    lead = _finite(decision.lead_time_s)
    return ModelDemand(
        name=_name(member.key), namespace=member.key[0], tier=member.tier, weight=member.weight,
        demand_replicas=class_demand(asked, member.decided.signals.arrival_rate_by_priority, spec.classes),
        gpus_per_replica=int(gpus), warm_slots=decision.warm_slots if decision.valid else 0, lead_time_s=lead,
        drain_s=member.drain_s, shed=dict(asked.shed), nominal_gpus=member.min_replicas * int(gpus),
        warm_window_s=_finite(decision.node_provisioning_s))


def drain_s(template: Any) -> float:
    """The longest one of the model's replicas may take to drain: its pods' termination grace period
    (Kubernetes' default 30 s when unset). A reclaim of its GPUs waits for it (policies/fleet.py)."""
    grace = getattr(getattr(template, "spec", None), "termination_grace_period_seconds", None)
    return float(grace) if isinstance(grace, (int, float)) and grace >= 0 else DEFAULT_GRACE_S


def with_allocation(decision: Decision, allocation, *, pooled: bool) -> Decision:
    """The model's decision with the fleet's allocation in place of its replicas, warm slots and shedding."""
    reasons = decision.reasons + tuple(f"fleet: {r}" for r in allocation.reasons)
    if not decision.valid:
        return replace(decision, reasons=reasons)
    return replace(decision, replicas=allocation.replicas, warm_slots=0 if pooled else allocation.warm_slots,
                   shed=dict(allocation.shed), reasons=reasons,
                   capped_by_budget=decision.capped_by_budget or allocation.replicas < decision.replicas)


def held(decided: Decided, why: str) -> Decided:
    """Nothing applied to this model this tick, and why."""
    decision = replace(decided.decision, valid=False, reasons=decided.decision.reasons + (f"fleet: held: {why}",))
    return replace(decided, decision=decision)


class FleetStep:
    """The fleet decision of every fleet tick, and its state between ticks."""

    def __init__(self, *, budgets: Budgets, namespace_gpus_each: int | None = None, spec: FleetSpec | None = None,
                 pooled: PooledWarmPool | None = None) -> None:
        """`namespace_gpus_each`: one cap for every namespace of the fleet (besides `budgets.namespace_gpus`)."""
        self.budgets, self.spec, self.pooled = budgets, spec or FleetSpec(), pooled
        self.namespace_gpus_each = namespace_gpus_each
        self.state = FleetState()
        self.last: FleetDecision | None = None

    def decide(self, members: list[Member]) -> dict[Key, Decided]:
        """Every member's tick with the fleet's allocation (pure but for the state it keeps)."""
        out: dict[Key, Decided] = {}
        demands, included = [], []
        self.last = None
        for member in members:
            try:
                demands.append(demand_of(member, self.spec))
                included.append(member)
            except ValueError as exc:
                out[member.key] = held(member.decided, f"the fleet decision refused its input: {exc}")
        if not included:
            return out
        now = max(m.decided.now for m in included)
        budgets = self.budgets
        if self.namespace_gpus_each is not None:
            each = {m.key[0]: self.namespace_gpus_each for m in included}
            budgets = replace(budgets, namespace_gpus={**each, **budgets.namespace_gpus})
        fleet, self.state = allocate(self.spec, demands, budgets, self.state, now)
        self.last = fleet
        for member in included:
            allocation = fleet.models[_name(member.key)]
            decision = with_allocation(member.decided.decision, allocation, pooled=self.pooled is not None)
            out[member.key] = replace(member.decided, decision=decision)
        return out

    def reclaimable(self, key: Key) -> int:
        """Replicas of the model's shape the last fleet decision would give it at once from lower tiers' GPUs
        (`policies.fleet.reclaimable`; 0 before any decision or when it was left out)."""
        allocation = self.last.models.get(_name(key)) if self.last is not None else None
        return allocation.reclaimable_replicas if allocation is not None else 0

    def pooled_share(self, key: Key) -> int | None:
        """The model's part of the pooled warm slots of the last tick (0 if it was left out); None without a
        pooled pool. Its decision's own `warm_slots` is 0 then (it writes no placeholder of its own), so this
        is what its `autoscaler_warm_slots` gauge shows."""
        if self.pooled is None:
            return None
        allocation = self.last.models.get(_name(key)) if self.last is not None else None
        return allocation.warm_slots if allocation is not None else 0

    async def run(self, decided: Mapping[Key, Decided], *, controllers: Mapping[Key, Any],
                  objects: Mapping[Key, Any], write_pool: bool) -> dict[Key, Decided]:
        """Read each model's pod template, decide the fleet, and size the pooled warm pool (`write_pool`)."""
        members, out = [], {}
        for key, d in decided.items():
            obj = objects.get(key)
            try:
                template = await controllers[key].cluster.pod_template()
            except EdgeError as exc:
                out[key] = held(d, f"its pod template could not be read: {exc}")
                continue
            policy = controllers[key].settings.policy
            floor = 0 if policy.idle_after_s is not None else policy.min_replicas  # as the scale actuator's
            members.append(Member(key, d, template, tier=getattr(obj, "tier", 1), weight=getattr(obj, "weight", 1.0),
                                  min_replicas=floor, drain_s=drain_s(template)))
        out.update(self.decide(members))
        if self.pooled is not None and write_pool and self.last is not None:
            try:
                await self.pooled.ensure(self.last.warm_by_shape, {_name(m.key): m.template for m in members})
            except EdgeError as exc:
                log.warning("error", where="pooled warm pool", kind=exc.kind, error=str(exc))
        return out
