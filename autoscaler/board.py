"""The latest decision, shared by the loop (writer) and the KEDA and admission servers (readers).

Readers never wait on I/O: they read the last published value. Watchers (streaming RPCs) are woken when
it changes. Before the first valid decision nothing is published, and readers say so."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from policies import Decision


@dataclass
class Published:
    decision: Decision
    current_replicas: int
    queue_depth: float | None
    at_s: float

    @property
    def replicas(self) -> int:
        """What to publish: the decision if valid, else hold what runs."""
        return self.decision.replicas if self.decision.valid else self.current_replicas


@dataclass
class DecisionBoard:
    latest: Published | None = None
    _changed: asyncio.Condition | None = field(default=None, repr=False)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def publish(self, value: Published) -> None:
        previous = self.latest
        self.latest = value
        if previous is None or previous.replicas != value.replicas or previous.decision.shed != value.decision.shed:
            async with self._condition():
                self._condition().notify_all()

    async def wait_change(self, timeout_s: float | None = None) -> None:
        async with self._condition():
            try:
                await asyncio.wait_for(self._condition().wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
