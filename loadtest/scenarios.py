"""Synthetic request traces with a known shape: the drills of the closed-loop scenarios, also for the benchmark.

    python -m loadtest.bench --trace scenario:doubling

Each scenario is a demand profile (request rate over time, as multiples of a base rate), turned into
requests by a seeded Poisson process (thinning), with token counts drawn from fixed distributions: input
uniform 500-1500 tokens, output log-normal with mean 500 (clipped to 50-2000), about 10 s in a slot at the
simulator's default per-token times. Times are at factor 1 (real time); a time-compressed run divides them.

- `doubling`: 20 min steady, then the rate doubles linearly within 5 min and stays (seed 000's drill), 60 min.
- `short-burst`: steady, with one burst to 2x lasting 60 s (shorter than a pod's start-up), 40 min.
- `diurnal-down`: 15 min at 2x, down to 1x linearly over 60 min, 15 min at 1x: 90 min.
- `no-capacity`: 25 min steady, up to 2x within 5 min, held to minute 65 (the node pool's limit binds).
- `controller-restart`: 15 min steady, up to 2x over 20 min (the controller is killed mid-ramp), to 45 min.
- `fleet-3h`: the bundled recording's demand (`python -m loadtest.recordfleet`): a quiet first half hour at
  0.8x, a ramp to 3x within an hour, a 2-minute burst to 4x, and back down to 0.8x by hour 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler.errors import TraceError
from autoscaler.traces import RequestTrace

PREFIX = "scenario:"


@dataclass(frozen=True)
class Profile:
    """Piecewise-linear rate multiplier: (minute, multiple of the base rate) points; the last sets the end."""

    points: tuple[tuple[float, float], ...]

    @property
    def span_s(self) -> float:
        return self.points[-1][0] * 60.0

    def multiple(self, t_s: np.ndarray) -> np.ndarray:
        minutes, values = zip(*self.points)
        return np.interp(t_s / 60.0, minutes, values)


PROFILES: dict[str, Profile] = {
    "doubling": Profile(((0, 1.0), (20, 1.0), (25, 2.0), (60, 2.0))),
    "short-burst": Profile(((0, 1.0), (20, 1.0), (20.01, 2.0), (21, 2.0), (21.01, 1.0), (40, 1.0))),
    "diurnal-down": Profile(((0, 2.0), (15, 2.0), (75, 1.0), (90, 1.0))),
    "no-capacity": Profile(((0, 1.0), (25, 1.0), (30, 2.0), (65, 2.0))),
    "controller-restart": Profile(((0, 1.0), (15, 1.0), (35, 2.0), (45, 2.0))),
    "fleet-3h": Profile(((0, 0.8), (30, 0.8), (90, 3.0), (110, 3.0), (110.01, 4.0), (112, 4.0), (112.01, 3.0),
                         (130, 3.0), (165, 0.8), (180, 0.8))),
}
BASE_RATE_PER_S = 2.5  # ~25 busy slots at ~10 s per request: 5-6 replicas of 8 slots, 10-12 at 2x


def synthetic(name: str, *, base_rate_per_s: float = BASE_RATE_PER_S, seed: int = 0) -> RequestTrace:
    """The requests of a scenario (arrival times from 0, token counts), reproducible from the seed."""
    if name not in PROFILES:
        raise TraceError(f"unknown scenario {name!r}; choose one of {sorted(PROFILES)}")
    profile = PROFILES[name]
    rng = np.random.default_rng(seed)
    peak = base_rate_per_s * max(v for _, v in profile.points)
    candidates = np.cumsum(rng.exponential(1.0 / peak, int(peak * profile.span_s * 1.2) + 100))
    candidates = candidates[candidates < profile.span_s]
    keep = rng.random(len(candidates)) < profile.multiple(candidates) * base_rate_per_s / peak
    arrival = candidates[keep]
    n = len(arrival)
    input_tokens = rng.integers(500, 1501, n).astype(float)
    sigma = 0.5
    output = rng.lognormal(np.log(500.0) - sigma**2 / 2, sigma, n)
    output_tokens = np.clip(np.round(output), 50, 2000)
    return RequestTrace(f"{PREFIX}{name}", arrival - arrival[0], input_tokens, output_tokens)


def is_scenario(path: str) -> bool:
    return str(path).startswith(PREFIX)


def read(path: str) -> RequestTrace:
    return synthetic(str(path)[len(PREFIX):])
