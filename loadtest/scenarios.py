"""The closed-loop scenarios, each one object: its demand profile, the actions taken during it, the windows
its checks read, and the closed-loop settings it needs. Their requests are also traces for the benchmark:

    python -m loadtest.bench --trace scenario:doubling

Each scenario's demand profile (request rate over time, as multiples of a base rate) is turned into requests
by a seeded Poisson process (thinning), with token counts drawn from fixed distributions: input uniform
500-1500 tokens, output log-normal with mean 500 (clipped to 50-2000), about 10 s in a slot at the
simulator's default per-token times. Times are minutes at factor 1 (real time); a time-compressed run
divides them. What a scenario must show is its `check` (`loadtest.e2e.checks`), which reads the scenario's
named `windows`; `python -m loadtest.e2e --scenario NAME` runs it.

- `doubling`: 20 min steady, then the rate doubles linearly within 5 min and stays (seed 000's drill), 60 min;
  the warm pool insures the doubling.
- `short-burst`: steady, with one burst to 2x lasting 60 s (shorter than a pod's start-up), 40 min; sized
  for nginx's queue per server (`gateway_queues: per-replica`), as `controller-restart` and `doubling` are.
- `diurnal-down`: 15 min at 2x, down to 1x linearly over 60 min, 15 min at 1x: 90 min.
- `no-capacity`: 25 min steady, up to 2x within 5 min, held to minute 65; the NodePool's GPU limit is lowered
  to the steady fleet and one more at minute 12 (the doubling cannot be placed) and raised at minute 45.
- `controller-restart`: 15 min steady, up to 2x over 20 min, to 45 min; two controllers on the Lease, the
  leader killed at minute 25 (mid-ramp) and restarted at minute 27.
- `scale-to-zero`: 10 min steady, silent until minute 35, then steady again to minute 45: the controller
  (`idle_after_s` 300 s) scales the idle model to zero, Karpenter removes its empty nodes (consolidateAfter
  600 s), and the first requests after the silence are held at the gateway while a node and a replica
  start (`max_hold_s` 600 s: what the default, the learned cold start plus 60 s, comes to on this cluster).
- `scale-to-zero-warm`: the same with one warm slot pooled for the model (a placeholder outside its
  controller's warm pool, which scale to zero leaves in place): the wake is a pod start-up.
- `scale-to-zero-keda`: `scale-to-zero` with the controller in KEDA mode: KEDA's operator, metrics adapter
  and HPA scale the model (the shipped ScaledObject at `minReplicaCount: 0`); the first held request must
  scale it from zero within 1 s of wall clock (StreamIsActive pushes true).
- `silence`: 25 min steady, silent until minute 115, then the base rate again until minute 145, under the
  policy's defaults but one (it sizes for nginx's queue per server, `gateway_queues: per-replica`): the
  outage hold (1 h) holds the forecast, then the capacity for the rate the classes that are never shed sent
  is kept (`forecast.kept_through_silence`) and the rest released; the return is
  the interrupted level coming back, and the guarded classes are rejected at a queue of 1 until the replicas
  ordered for it are Ready (at most a start-up plus a node's provisioning), a Ready slot kept for critical
  meanwhile.
  Its requests are the trace `scenario:silence-live`; `scenario:silence` is a 6-hour profile for the
  benchmark only (3 h of silence: longer than a live run should take).
- `fleet`: three models behind one gateway under one fleet controller, each in its namespace with its own
  demand (`FleetModel`), on one NodePool whose GPU limit the fleet's budget equals: `batch` (tier 2) bursts
  to 4x at minutes 10-12 and borrows the GPUs the others free; `chat` (tier 0) doubles at minutes 19-22 while
  the limit binds, so the fleet reclaims GPUs from `batch` (its replicas drained) and chat's critical class holds;
  `code` (tier 1) is steady. 40 min. Every model's servers serve critical first (vLLM's `--scheduling-policy
  priority`, the load generator sending each class's `priority`). Its twin is the fleet benchmark's simulator
  on the same requests, its servers serving the same order.
- `fleet-smoke`: the fleet harness on its own: two models (tiers 0 and 1), steady for 10 min, under a
  limit they never reach: both served through the one gateway, nothing lost, within the budget.
- `fleet-3h` (a demand profile only, not a closed-loop scenario): the bundled recording's demand
  (`python -m loadtest.recordfleet`): a quiet first half hour at 0.8x, a ramp to 3x within an hour, a 2-minute
  burst to 4x, and back down to 0.8x by hour 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from autoscaler.errors import TraceError
from autoscaler.traces import RequestTrace
from loadtest.e2e import checks

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


@dataclass(frozen=True)
class Scenario:
    """One closed-loop scenario. Minutes at factor 1 throughout."""

    name: str
    profile: Profile
    check: Callable[[checks.CheckContext], list[dict]] = checks.none
    # Named (from, to) minutes that `check` reads, e.g. where shedding must happen and where it must stop.
    windows: Mapping[str, tuple[float, float]] = field(default_factory=lambda: MappingProxyType({}))
    actions: tuple[tuple[float, str], ...] = ()  # (minute, action), in order; `loadtest.e2e.run` takes them
    config: Mapping = field(default_factory=lambda: MappingProxyType({}))  # E2EConfig fields over the defaults
    controllers: int = 1  # controller processes on the Lease
    twin_checked: bool = True  # whether the simulated twin models the scenario (its prediction is checked)
    # The NodePool's GPU limit: the starting replicas plus one; from this minute the steady fleet (the
    # simulated policy's replicas then) plus one, so growth beyond it cannot be placed (see `actions`).
    limit_steady_at_min: float | None = None
    # A fleet scenario: its models (each with its own demand), under one fleet controller; `profile` is then
    # the first model's, and `config["gpu_limit"]` the NodePool's GPUs and the fleet's budget.
    models: tuple["FleetModel", ...] = ()
    # The `scenario:` trace its requests are (default: its name), when a trace of that name is another one.
    trace: str = ""

    @property
    def trace_name(self) -> str:
        return self.trace or self.name


@dataclass(frozen=True)
class FleetModel:
    """One model of a fleet scenario: where it runs, its tier (0 highest) and weight, and its demand profile
    at its own base rate (requests per second at 1x)."""

    namespace: str
    name: str
    tier: int
    profile: Profile
    base_rate_per_s: float
    weight: float = 1.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def profile_name(self) -> str:
        return f"fleet-{self.name}"


FLEET_MODELS = (
    FleetModel("chat", "chat", 0, Profile(((0, 1.0), (19, 1.0), (22, 2.0), (40, 2.0))), 1.0),
    FleetModel("code", "code", 1, Profile(((0, 1.0), (40, 1.0))), 0.6),
    FleetModel("batch", "batch", 2, Profile(((0, 1.0), (10, 1.0), (12, 4.0), (40, 4.0))), 0.6),
)
# the harness's smoke test: two models, steady, well within the limit
SMOKE_MODELS = (
    FleetModel("alpha", "alpha", 0, Profile(((0, 1.0), (10, 1.0))), 1.0),
    FleetModel("beta", "beta", 1, Profile(((0, 1.0), (10, 1.0))), 0.6),
)


ZERO_PROFILE = Profile(((0, 1.0), (10, 1.0), (10.01, 0.0), (35, 0.0), (35.01, 1.0), (45, 1.0)))
ZERO_WINDOWS = MappingProxyType({"traffic": (0, 10), "silence": (10, 35), "burst": (35, 45)})
ZERO_CONFIG = MappingProxyType({"policy": {"idle_after_s": 300.0}, "max_hold_s": 600.0})

# The live `silence`: 25 min steady, silent to minute 115, back at the full rate to minute 145. The policy's
# defaults throughout (nothing shortened): the outage hold (1 h) ends at minute 85; the 30 min of silence
# after it leave time for the scale-down to the kept capacity (up to the 10-min stabilization window) and for
# the freed nodes' removal (consolidateAfter, 10 min, plus Karpenter's own delay of up to ~4 min), so the
# return meets the fleet the silence left, and a node's provisioning for the rest.
SILENCE_PROFILE = Profile(((0, 1.0), (25, 1.0), (25.01, 0.0), (115, 0.0), (115.01, 1.0), (145, 1.0)))
SILENCE_WINDOWS = MappingProxyType({"before": (15, 25), "silence": (25, 115), "return": (115, 145)})

# nginx's least_conn commits each request to one server's queue: a drill whose critical class waited in one
# server's queue behind standard sizes for those queues as a user behind nginx would (the policy's
# `gateway_queues: per-replica`, which also keeps Ready slots for the top class as the load nears them), and
# its twin serves a queue per replica
PER_SERVER_QUEUES = MappingProxyType({"policy": {"gateway_queues": "per-replica"}, "dispatch": "least-conn"})

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    # the drill: the platform team insures against a doubling within node provisioning (warm pool)
    Scenario("doubling", Profile(((0, 1.0), (20, 1.0), (25, 2.0), (60, 2.0))), checks.doubling,
             # shedding while capacity comes (the ramp and a node's provisioning), none once it is Ready; warm
             # slots taken by the ramp are ready again from minute 27
             windows=MappingProxyType({"ramp": (20, 35), "settled": (50, 60), "refilled": (27, 60)}),
             # nginx's least_conn commits each request to one server: the policy sizes for that (critical
             # waited 2-4 s in one server's queue at the ramp's end when it sized for one shared queue, doubling
             # runs 60 and 61) and the twin serves a queue per replica
             config=MappingProxyType({"policy": {"warm_growth_min_ratio": 1.0, "gateway_queues": "per-replica"},
                                      "dispatch": "least-conn"})),
    Scenario("short-burst", Profile(((0, 1.0), (20, 1.0), (20.01, 2.0), (21, 2.0), (21.01, 1.0), (40, 1.0))),
             # critical waited 2.5-3.4 s in one server's queue at the burst's start in runs 3 and 5 of a series
             checks.short_burst, windows=MappingProxyType({"before": (14, 20), "after": (20, 30)}),
             config=PER_SERVER_QUEUES),
    Scenario("diurnal-down", Profile(((0, 2.0), (15, 2.0), (75, 1.0), (90, 1.0))), checks.diurnal_down,
             windows=MappingProxyType({"start": (0, 15), "end": (80, 90)})),
    Scenario("no-capacity", Profile(((0, 1.0), (25, 1.0), (30, 2.0), (65, 2.0))), checks.no_capacity,
             # capped: the doubling meets the lowered limit; recovered: well after the limit is raised
             windows=MappingProxyType({"capped": (30, 45), "recovered": (55, 65)}),
             actions=((12, "lower-gpu-limit"), (45, "raise-gpu-limit")), limit_steady_at_min=12),
    Scenario("controller-restart", Profile(((0, 1.0), (15, 1.0), (35, 2.0), (45, 2.0))), checks.controller_restart,
             windows=MappingProxyType({"around": (20, 35)}), controllers=2,
             actions=((25, "kill-leader"), (27, "restart-killed")),
             # critical waited 2.1-3.4 s in one server's queue on the ramp in runs 2 and 5 of a series
             config=PER_SERVER_QUEUES),
    # silence: the last requests drain, idle_after_s passes, the model goes to zero, its nodes go after
    # consolidateAfter (plus up to 260 s of Karpenter's own delay, measured in the scenarios above)
    Scenario("scale-to-zero", ZERO_PROFILE, checks.scale_to_zero, windows=ZERO_WINDOWS, config=ZERO_CONFIG),
    # the twin has no slot outside the policy's warm pool: it would predict a node's wait
    Scenario("scale-to-zero-warm", ZERO_PROFILE, checks.scale_to_zero_warm, windows=ZERO_WINDOWS,
             config=MappingProxyType({**ZERO_CONFIG, "pooled_warm_slots": 1}), twin_checked=False),
    # the same in KEDA mode: KEDA's operator and HPA scale, the held request wakes it through StreamIsActive
    Scenario("scale-to-zero-keda", ZERO_PROFILE, checks.scale_to_zero_keda, windows=ZERO_WINDOWS,
             config=MappingProxyType({**ZERO_CONFIG, "mode": "keda"})),
    # traffic stops for longer than the outage hold and comes back at its usual level: the capacity of the
    # classes that are never shed is kept through the silence, the return is the level coming back (not a
    # burst to confirm), and the lower classes are guarded hard until the rest is Ready. Its
    # requests are the trace `scenario:silence-live` (`scenario:silence` is the benchmark's 6-h profile).
    # nginx's least_conn commits each request to one server: the policy sizes for that and keeps a slot for
    # critical while the return's guard is hard (`gateway_queues: per-replica`, policies/stages/shedding.py),
    # and the twin serves a queue per replica (`dispatch: least-conn`).
    Scenario("silence", SILENCE_PROFILE, checks.silence, windows=SILENCE_WINDOWS, trace="silence-live",
             config=MappingProxyType({"service_by_completion": True, "policy": {"gateway_queues": "per-replica"},
                                      "dispatch": "least-conn"})),
    # a fleet: batch bursts (minutes 10-12) and borrows what chat and code free as they come down from their
    # start; chat doubles (minutes 19-22) while the limit binds. Every model's servers run vLLM's priority
    # scheduling (critical first in the queue), as a fleet with tiers and classes would: a critical request
    # that arrives at the end of chat's ramp waits for a slot, not behind the standard requests before it.
    # Each request waits in the queue of the server nginx's least_conn sent it to: the policy sizes for that
    # (`gateway_queues: per-replica`) and the twin serves a queue per replica (`dispatch: least-conn`).
    Scenario("fleet", FLEET_MODELS[0].profile, checks.fleet, models=FLEET_MODELS,
             windows=MappingProxyType({"borrowed": (12, 20), "reclaimed": (26, 40), "doubled": (22, 40)}),
             config=MappingProxyType({"gpu_limit": 14, "policy": {"warm_growth_min_ratio": 1.0,
                                                                    "gateway_queues": "per-replica"},
                                      "server_priority": True, "dispatch": "least-conn"})),
    Scenario("fleet-smoke", SMOKE_MODELS[0].profile, checks.fleet_smoke, models=SMOKE_MODELS,
             config=MappingProxyType({"gpu_limit": 16})),
)}

# Demand profiles by name: every scenario's, and profiles that are no closed-loop scenario (the bundled
# recording's), usable as `scenario:NAME` traces.
PROFILES: dict[str, Profile] = {s.trace_name: s.profile for s in SCENARIOS.values()} | {
    "fleet-3h": Profile(((0, 0.8), (30, 0.8), (90, 3.0), (110, 3.0), (110.01, 4.0), (112, 4.0), (112.01, 3.0),
                         (130, 3.0), (165, 0.8), (180, 0.8))),
    # a long-tail model: 20-minute sessions two hours apart, silent in between (scale to zero)
    "on-off-4h": Profile(((0, 1.0), (20, 1.0), (20.01, 0.0), (120, 0.0), (120.01, 1.0), (140, 1.0), (140.01, 0.0),
                          (240, 0.0), (240.01, 1.0), (260, 1.0))),
    # traffic that stops for hours (an outage upstream, a client pausing) and comes back at its usual level
    "silence": Profile(((0, 1.0), (90, 1.0), (90.01, 0.0), (270, 0.0), (270.01, 1.0), (360, 1.0))),
} | {m.profile_name: m.profile for s in SCENARIOS.values() for m in s.models}
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
