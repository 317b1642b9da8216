"""Each model's latest decision written to its ModelAutoscaler's status subresource.

`status_of` turns a Decision (or a spec that did not validate) into the status: replicas, warm slots, shed
fractions, lead time, reasons, last decision time, observedGeneration and four conditions:
- Active: True while decisions are valid; False with the hold's reasons (the policy cannot decide), or with
  the validation error of a spec the controller cannot use (reason InvalidSpec).
- CappedByBudget: the GPU budget held the replicas below demand (`Decision.capped_by_budget`).
- CapacityUnavailable: ordered replicas no node can be provisioned for (`Decision.unplaceable_replicas`).
- SignalsMissing: a signal reported before is missing now, or nothing could be sized on (the reasons say
  which, as `policies/stages/sanitize.py` words them).
A condition's lastTransitionTime moves only when its status does.

`StatusWriter.write` sends a JSON merge patch to `.../modelautoscalers/NAME/status`, only when the status
changed (the decision time aside) or every `every_ticks` ticks at most otherwise, to keep apiserver writes low;
the caller writes only for the models this replica owns. A failed write is counted and retried next tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autoscaler.crd import GROUP, PLURAL, VERSION
from autoscaler.errors import EdgeError
from autoscaler.kube.client import Kube
from autoscaler.times import rfc3339
from policies import Decision

Key = tuple[str, str]
MERGE_PATCH = "application/merge-patch+json"
MAX_REASONS = 20
MAX_MESSAGE_CHARS = 4096


def _missing(reasons: tuple[str, ...]) -> list[str]:
    return [r for r in reasons if "missing" in r or "nothing to size on" in r or "no usable" in r]


def conditions_of(decision: Decision | None, error: str | None) -> dict[str, tuple[str, str, str]]:
    """type -> (status, reason, message)."""
    if error is not None:
        return {"Active": ("False", "InvalidSpec", error[:MAX_MESSAGE_CHARS])}
    assert decision is not None
    missing = _missing(decision.reasons)
    holds = "; ".join(decision.reasons)[:MAX_MESSAGE_CHARS]
    return {
        "Active": ("True", "Deciding", "") if decision.valid else ("False", "Holding", holds),
        "CappedByBudget": ("True", "BudgetReached", "") if decision.capped_by_budget else ("False", "WithinBudget", ""),
        "CapacityUnavailable": (("True", "Unplaceable", f"{decision.unplaceable_replicas} replicas cannot be placed")
                                if decision.unplaceable_replicas else ("False", "Placeable", "")),
        "SignalsMissing": (("True", "Missing", "; ".join(missing)[:MAX_MESSAGE_CHARS]) if missing
                           else ("False", "Present", "")),
    }


def status_of(*, decision: Decision | None, error: str | None, generation: int | None, decided_s: float | None,
              previous: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The status subresource's content (camelCase, as the CRD's schema)."""
    before = {c["type"]: c for c in previous}
    conditions = []
    for kind, (status, reason, message) in conditions_of(decision, error).items():
        old = before.get(kind)
        since = old["lastTransitionTime"] if old is not None and old["status"] == status else rfc3339(now)
        condition = {"type": kind, "status": status, "reason": reason, "message": message,
                     "lastTransitionTime": since}
        if generation is not None:
            condition["observedGeneration"] = generation
        conditions.append(condition)
    status: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
    if decision is not None:
        status.update(replicas=decision.replicas, warmSlots=decision.warm_slots,
                      shedFractions={k: float(v) for k, v in decision.shed.items()},
                      leadTimeSeconds=decision.lead_time_s, reasons=list(decision.reasons[:MAX_REASONS]),
                      lastDecisionTime=rfc3339(decided_s) if decided_s is not None else None)
    return status


@dataclass
class _Written:
    status: dict[str, Any]
    tick: int


@dataclass
class StatusWriter:
    kube: Kube
    every_ticks: int = 20
    on_error: Callable[[EdgeError], None] = lambda exc: None
    writes: int = 0
    _last: dict[Key, _Written] = field(default_factory=dict)
    _ticks: int = 0

    def previous_conditions(self, key: Key) -> list[dict[str, Any]]:
        last = self._last.get(key)
        return last.status["conditions"] if last is not None else []

    def next_tick(self) -> None:
        self._ticks += 1

    def forget(self, key: Key) -> None:
        self._last.pop(key, None)

    def due(self, key: Key, status: dict[str, Any]) -> bool:
        last = self._last.get(key)
        if last is None or self._ticks - last.tick >= self.every_ticks:
            return True
        return {k: v for k, v in status.items() if k != "lastDecisionTime"} != \
            {k: v for k, v in last.status.items() if k != "lastDecisionTime"}

    async def write(self, key: Key, status: dict[str, Any]) -> bool:
        """Patch the status if due; True if written."""
        if not self.due(key, status):
            return False
        namespace, name = key
        try:
            await self.kube.call(f"patch {PLURAL}/{name}/status",
                                 self.kube.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
                                 PLURAL, name, {"status": status}, _content_type=MERGE_PATCH)
        except EdgeError as exc:
            self.on_error(exc)
            return False
        self._last[key] = _Written(status, self._ticks)
        self.writes += 1
        return True
