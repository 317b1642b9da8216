"""Static peak and the clairvoyant reference: both are told the replicas each tick truly needs.

- static: the peak of that series, all the time (provisioning for the peak).
- clairvoyant: at every tick, the highest need within the next full cold start (pod start-up + node
  provisioning), so every replica is ordered exactly early enough and released as soon as it cannot be
  needed before it could come back. It pays only the unavoidable warm-up.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from policies.types import Decision, Signals


class OracleSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    needed: tuple[int, ...] = Field(description="Replicas needed per tick, from the actual future.")
    start_s: float
    tick_s: float = Field(gt=0)
    lead_s: float = Field(ge=0, description="Clairvoyant: full cold start. Static: ignored.")
    static: bool = False


def initial_state() -> int | None:
    return None


def decide(spec: OracleSpec, state: int | None, signals: Signals, now: float) -> tuple[Decision, int | None]:
    """The state caches the static peak (computed once, not every tick)."""
    if spec.static:
        peak = state if state is not None else max(spec.needed, default=1)
        return Decision(replicas=peak, reasons=(f"static: peak {peak}",)), peak
    i = max(0, int(math.floor((now - spec.start_s) / spec.tick_s + 1e-9)))
    horizon = int(math.ceil(spec.lead_s / spec.tick_s)) + 1
    window = spec.needed[i : i + horizon] or spec.needed[-1:]
    return Decision(replicas=max(window), reasons=(f"clairvoyant: need within {spec.lead_s:.0f} s",)), state
