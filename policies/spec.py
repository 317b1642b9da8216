"""The predictive policy's configuration: validated once, units in every name.

Defaults follow from principles, not from any trace:
- lead time: a GPU replica needs ~120 s to start (image pull, weight load, warm-up) and ~300 s more when a
  node must be provisioned; the policy learns the start-up part from observed pod creation -> Ready times.
- capacity: a replica serves `replica_concurrency` requests at once (vLLM's max_num_seqs); the number of
  slots needed for an arrival rate is sized with Erlang C so that P(queue wait > SLO) stays under
  `slo_miss_target_ratio`.
- queues at the gateway: Erlang C pools every slot into one queue, as a gateway that holds requests until a
  slot frees (or the simulator's `--dispatch shared`) does. A least-connections gateway (the shipped nginx
  `least_conn`) commits each request to one server's queue on arrival, and one server's queue can wait while
  another has a free slot. `gateway_queues: per-replica` counts one slot per replica as lost to that imbalance:
  the Erlang C slots are ordered in replicas of k - 1 usable slots, at most k / (k - 1) more replicas (16
  slots: 6.7 % more). Measured behind least connections over the pods only, at k = 8 and 16; refused below
  k = 3 (at k = 1 it would size as shared, too few; at k = 2 twice shared, too many). Behind a plain Service
  (random routing per connection) the imbalance is far larger than one slot: neither setting holds there.
- stabilization: never release capacity that could not come back before it may be needed again, so the
  scale-down window is at least the full cold-start time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PRIORITY_CLASSES: dict[str, int] = {"critical": 1, "standard": 0, "sheddable": -1}
IDLE_MIN_TICKS = 4  # idle_after_s spans at least this many ticks of zero demand


class PolicySpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    min_replicas: int = Field(1, ge=0, description="Never fewer replicas than this.")
    max_replicas: int = Field(64, ge=1, description="Never more replicas than this.")
    tick_s: float = Field(15.0, ge=1, le=300, description="Control-loop period (at least 1 s).")
    replica_concurrency: int = Field(16, ge=1, description="Requests one replica serves at once.")
    gateway_queues: Literal["shared", "per-replica"] = Field(
        "shared", description="How the gateway queues requests: shared (one queue any free slot serves) or "
        "per-replica (each request waits in the queue of the server a least-connections balancer over the pods "
        "sent it to); per-replica sizes with replica_concurrency - 1 usable slots per replica, keeps Ready slots "
        "free for the highest priority when the load nears them, and one while traffic back after a silence is "
        "guarded hard (policies/reserve.py, policies/stages/shedding.py), and needs "
        "replica_concurrency >= 3. Not for a plain Service's random routing, whose imbalance is larger.")
    initial_service_time_s: float = Field(
        2.0, gt=0, description="Mean time a request occupies a slot, until learned from in-flight/arrivals."
    )
    slo_queue_wait_s: float = Field(2.0, gt=0, description="Queue-wait objective per request.")
    slo_miss_target_ratio: float = Field(
        0.001, gt=0, lt=0.5, description="Sizing target: modelled P(queue wait > SLO) at the forecast rate."
    )
    p99_latency_target_s: float | None = Field(
        None, gt=0, description="If set, a measured p99 above it adds scale-up pressure."
    )
    slo_feedback_step_ratio: float = Field(
        0.05, ge=0, le=1, description="Per violating tick, grow the sizing headroom by this fraction."
    )
    slo_feedback_decay_ratio: float = Field(
        0.002, ge=0, le=1, description="Per quiet tick (p99 < half its target), shrink it by this fraction."
    )
    max_headroom_ratio: float = Field(2.0, ge=1, description="Upper bound of the learned sizing headroom.")
    capacity_ratio: float = Field(
        1.0, gt=0, le=10, description="Provision this multiple of what the queueing model asks for (1.1: 10 % "
        "more, 0.9: 10 % less): the one knob to trade GPU-hours for attainment."
    )
    gpu_memory_headroom_floor_ratio: float = Field(
        0.05, ge=0, lt=1, description="Below this free KV-cache/GPU-memory fraction, add pressure."
    )
    target_tokens_per_s_per_replica: float | None = Field(
        None, gt=0, description="If set, token rate is one more reactive signal."
    )
    max_signal_age_s: float = Field(60.0, gt=0, description="Older samples are stale and ignored.")
    max_clock_skew_s: float = Field(
        5.0, ge=0, description="Samples up to this far in the future are accepted (clocks of Prometheus and "
        "the controller differ a little); further ahead they are dropped."
    )
    default_startup_s: float = Field(120.0, gt=0, description="Pod creation -> Ready, until learned.")
    startup_percentile: float = Field(
        0.9, gt=0, lt=1,
        description="Learned lead time (start-up, and node provisioning per node type) uses this percentile.")
    startup_samples_kept: int = Field(50, ge=1, description="Most recent start-ups (and node waits) learned from.")
    node_provisioning_s: float = Field(
        300.0, ge=0, description="Added to lead time when no warm or idle slot is free, until pods' waits for new "
        "nodes are learned.")
    forecast_bucket_s: float = Field(300.0, gt=0, description="Demand history resolution.")
    rate_window_s: float | None = Field(
        None, ge=0, description="The window the arrival-rate signal is averaged over (in the controller: "
        "prometheus.rate_window_s when unset): for this long after a model's first request the rate under-reads "
        "and the forecaster does not learn it. Unset: a rate per tick (the simulator's).")
    season_s: float = Field(86400.0, gt=0, description="Seasonal period of demand (daily).")
    seasonal_min_cycles: int = Field(2, ge=2, description="Full seasons of history before Holt-Winters.")
    history_kept_s: float = Field(7 * 86400.0, gt=0)
    refit_interval_s: float = Field(6 * 3600.0, gt=0, description="statsmodels refit schedule.")
    burst_lookback_s: float = Field(3600.0, gt=0, description="Window of observed/expected rate ratios.")
    burst_quantile: float = Field(0.99, gt=0.5, lt=1, description="Upper bound = forecast x this ratio quantile.")
    calibrate_upper: bool = Field(
        False, description="Multiply the upper forecast at the lead time by the burst_quantile of its own past "
        "observed / bound scores over burst_lookback_s (split conformal; policies/stages/calibration.py)."
    )
    burst_confirm_s: float | None = Field(
        None, ge=0, description="Reactive need above the forecast must persist this long to be provisioned "
        "(None: the learned pod start-up time); a steady climb counts at once."
    )
    outage_hold_s: float = Field(
        3600.0, ge=0, description="An abrupt, implausible drop to ~zero demand is treated as an outage (not "
        "learned, capacity held at the forecast) for at most this long."
    )
    scale_up_limit_ratio: float = Field(1.0, gt=0, description="Per tick, add at most this fraction...")
    scale_up_limit_replicas: int = Field(4, ge=1, description="...or this many replicas, whichever is more.")
    scale_down_stabilization_s: float = Field(
        600.0, ge=0, description="Scale down only to the max recommendation of this window (>= lead time)."
    )
    steady_burst_ratio: float = Field(
        1.5, ge=0, description="Traffic whose p99 per-tick rate / forecast over burst_lookback_s is at most this "
        "is steady: scale-down waits one lead time, not scale_down_stabilization_s (0: never steady)."
    )
    max_warm_slots: int = Field(8, ge=0, description="Upper bound on placeholder (warm) GPU slots.")
    warm_growth_quantile: float = Field(
        0.99, gt=0, le=1, description="Warm capacity covers growth up to this quantile of past increases over the "
        "node-provisioning time (relative to the level at the start of each window)."
    )
    warm_growth_min_ratio: float = Field(
        0.0, ge=0, le=10, description="...and at least this growth whatever the history says (1.0: a doubling)."
    )
    saturation_wait_ratio: float = Field(
        0.5, gt=0, le=1, description="Guard: the lowest priority is rejected once the queue means this x SLO of wait."
    )
    saturation_wait_max_ratio: float = Field(
        0.8, gt=0, le=1, description="Guard: the highest guarded priority is rejected at this x SLO of wait."
    )
    guard_priority_below: int = Field(
        1, description="The saturation guard applies to priorities below this; the highest is never guarded."
    )
    shed_priority_below: int = Field(
        0, le=1, description="Only priorities below this are ever shed (Gateway API: negative = sheddable)."
    )
    priorities: dict[str, int] = Field(default_factory=lambda: dict(PRIORITY_CLASSES), min_length=1)
    idle_after_s: float | None = Field(
        None, gt=0, description="Scale to zero (replicas and warm slots) after this long with no request arriving, "
        "none in flight and none queued (None: never); any demand wakes it to at least one replica at once."
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> "PolicySpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas ({self.max_replicas})"
            )
        if max(self.priorities.values(), default=0) < self.shed_priority_below:
            raise ValueError(
                f"shed_priority_below ({self.shed_priority_below}) would allow shedding the highest priority "
                f"({max(self.priorities.values())}); the highest priority is never shed"
            )
        if max(self.priorities.values(), default=0) < self.guard_priority_below:
            raise ValueError(
                f"guard_priority_below ({self.guard_priority_below}) would reject the highest priority "
                f"({max(self.priorities.values())}); the highest priority is always admitted"
            )
        if self.gateway_queues == "per-replica" and self.replica_concurrency < 3:
            raise ValueError(
                f"gateway_queues: per-replica needs replica_concurrency >= 3 (got {self.replica_concurrency}): "
                "one slot per replica counted as lost to the balancer holds behind least connections at 8 or 16 "
                "slots, not at 1 (too few replicas) or 2 (twice too many); use shared"
            )
        if self.saturation_wait_ratio > self.saturation_wait_max_ratio:
            raise ValueError(
                f"saturation_wait_ratio ({self.saturation_wait_ratio}) must not exceed saturation_wait_max_ratio "
                f"({self.saturation_wait_max_ratio})"
            )
        if self.forecast_bucket_s < self.tick_s:
            raise ValueError(
                f"forecast_bucket_s ({self.forecast_bucket_s}) must be >= tick_s ({self.tick_s})"
            )
        if self.idle_after_s is not None and self.idle_after_s < IDLE_MIN_TICKS * self.tick_s:
            raise ValueError(
                f"idle_after_s ({self.idle_after_s:g}) must be at least {IDLE_MIN_TICKS} ticks "
                f"({IDLE_MIN_TICKS * self.tick_s:g} s): one quiet scrape is not idleness"
            )
        return self

    @property
    def classes(self) -> tuple[str, ...]:
        """The priority classes, highest first: the order of every per-class figure and column."""
        return tuple(sorted(self.priorities, key=lambda name: -self.priorities[name]))

    @property
    def queueing_slots_per_replica(self) -> int:
        """Slots per replica the Erlang C sizing counts: one fewer behind per-replica queues (k >= 3 there)."""
        if self.gateway_queues == "per-replica":
            return self.replica_concurrency - 1
        return self.replica_concurrency

    @property
    def queueing_note(self) -> str:
        """What the reasons say about the sizing's slots per replica ("" with a shared queue)."""
        if self.gateway_queues == "shared":
            return ""
        k = self.replica_concurrency
        return f"; per-replica gateway queues: {self.queueing_slots_per_replica} of {k} slots per replica sized"

    @property
    def season_buckets(self) -> int:
        return max(1, round(self.season_s / self.forecast_bucket_s))
