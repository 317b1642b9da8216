"""The pure decision core: `decide(spec, state, signals, now) -> (Decision, PolicyState)`.

No clock, no I/O, no await: time arrives as `now`, memory as a frozen `PolicyState`. Replay is a fold of
`decide` over recorded signals, the very same code path as production."""

from policies.engine import decide, initial_state
from policies.spec import PRIORITY_CLASSES, PolicySpec
from policies.types import SAMPLE_SIGNALS, ClusterState, Decision, PolicyState, Sample, Signals

__all__ = [
    "PRIORITY_CLASSES",
    "SAMPLE_SIGNALS",
    "ClusterState",
    "Decision",
    "PolicySpec",
    "PolicyState",
    "Sample",
    "Signals",
    "decide",
    "initial_state",
]
