"""The admission endpoint's saturation guard as the simulators apply it, from one decision."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from policies.release import PerReplica, per_replica_of
from policies.types import Decision


@dataclass(frozen=True)
class Guard:
    depth: Mapping[str, int] = field(default_factory=dict)  # per class: rejected while the queue is this deep
    slots: int = 0  # ready slots, and the requests/s they complete: how the endpoint carries a reading
    drain_per_s: float = 0.0
    reserve: int = 0  # slots kept for the top class: the guarded classes rejected while slots - reserve are busy

    @classmethod
    def of(cls, decision: Decision) -> "Guard":
        return cls(dict(decision.saturation_queue_depth), decision.saturation_slots, decision.saturation_drain_per_s,
                   decision.saturation_reserve)

    def depths(self, classes: tuple[str, ...]) -> list[float]:
        """Per class, in the order given; infinite for a class never guarded."""
        return [float(self.depth.get(c, math.inf)) for c in classes]

    def per_replica(self, replica_slots: int) -> PerReplica | None:
        """What one Ready replica takes of held requests (`policies.release`); None: decided with none Ready."""
        return per_replica_of(slots=self.slots, depths=self.depth, drain_per_s=self.drain_per_s,
                              replica_slots=replica_slots)
