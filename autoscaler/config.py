"""Typed configuration, validated once at start: environment variables and a YAML file (the ConfigMap).

Environment variables use the prefix `AUTOSCALER_` and `__` for nesting, e.g. `AUTOSCALER_MODE=shadow`,
`AUTOSCALER_PROMETHEUS__URL=http://prometheus:9090`; they override the file. An invalid config exits
non-zero with a message naming each bad field and its value (see `load_config`).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from autoscaler.policyfile import ConfigError, describe, read_yaml_mapping
from autoscaler.presets import DCGM_HEADROOM, PRESETS, queries
from policies import PolicySpec


class Mode(str, Enum):
    actuate = "actuate"  # scale, warm pool, shed
    shadow = "shadow"  # decide and log everything, write nothing to the cluster
    keda = "keda"  # publish decisions over gRPC only; KEDA's HPA scales


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    namespace: str = Field(min_length=1)
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: str = Field(min_length=1)


class PrometheusSource(_Strict):
    url: str | None = Field(None, description="Base URL; None disables PromQL signals.")
    timeout_s: float = Field(3.0, gt=0, le=60)
    selector: str = Field("", description="Label matchers put into every preset query, e.g. namespace=\"llm\".")
    queries: dict[str, str] = Field(default_factory=dict, description="Per-signal PromQL overriding the preset.")
    dcgm_memory: bool = Field(False, description="GPU memory headroom from DCGM framebuffer metrics.")


class ScrapeSource(_Strict):
    enabled: bool = False
    port: int = Field(8000, ge=1, le=65535)
    path: str = "/metrics"
    timeout_s: float = Field(2.0, gt=0, le=60)


class WarmPool(_Strict):
    enabled: bool = True
    name_suffix: str = "-warm-pool"
    priority_class: str = Field("autoscaler-placeholder", min_length=1)
    pause_image: str = "registry.k8s.io/pause:3.10"


class Admission(_Strict):
    enabled: bool = True
    port: int = Field(8081, ge=1, le=65535)
    priority_header: str = "x-request-priority"
    default_priority: str = "standard"
    retry_after_s: int = Field(5, ge=1, le=3600)
    queue_probe_interval_s: float | None = Field(
        1.0, gt=0, le=60, description="Scrape the pods' queue gauge this often for the saturation guard "
        "(port and path from `scrape`); None: use the tick's queue depth."
    )


class Keda(_Strict):
    port: int = Field(9090, ge=1, le=65535)
    metric_name: str = "desired-replicas"


class LeaderElection(_Strict):
    enabled: bool = True
    lease_name: str | None = None
    lease_duration_s: float = Field(15.0, gt=1)
    renew_deadline_s: float = Field(10.0, gt=0)
    retry_period_s: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _order(self) -> "LeaderElection":
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                f"need retry_period_s ({self.retry_period_s}) < renew_deadline_s ({self.renew_deadline_s}) "
                f"< lease_duration_s ({self.lease_duration_s})"
            )
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOSCALER_", env_nested_delimiter="__", extra="forbid", frozen=True)

    target: Target
    mode: Mode = Mode.shadow
    model_server: str = Field("vllm", description=f"Metric preset: one of {sorted(PRESETS)}")
    tick_s: float = Field(15.0, gt=0, le=300)
    tick_deadline_s: float | None = Field(None, gt=0, description="Default: 80 % of tick_s.")
    http_port: int = Field(8080, ge=1, le=65535, description="Health, readiness and /metrics.")
    prometheus: PrometheusSource = Field(default_factory=PrometheusSource)
    scrape: ScrapeSource = Field(default_factory=ScrapeSource)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    warm_pool: WarmPool = Field(default_factory=WarmPool)
    admission: Admission = Field(default_factory=Admission)
    keda: Keda = Field(default_factory=Keda)
    leader_election: LeaderElection = Field(default_factory=LeaderElection)

    @model_validator(mode="after")
    def _cross_checks(self) -> "Settings":
        if self.model_server not in PRESETS:
            raise ValueError(f"model_server {self.model_server!r} is not one of {sorted(PRESETS)}")
        if self.prometheus.url is None and not self.scrape.enabled:
            raise ValueError("no signal source: set prometheus.url or enable scrape")
        if self.policy.tick_s != self.tick_s:
            raise ValueError(f"policy.tick_s ({self.policy.tick_s}) must equal tick_s ({self.tick_s})")
        if self.deadline_s > self.tick_s:
            raise ValueError(f"tick_deadline_s ({self.tick_deadline_s}) must not exceed tick_s ({self.tick_s})")
        if self.admission.default_priority not in self.policy.priorities:
            raise ValueError(
                f"admission.default_priority {self.admission.default_priority!r} is not one of "
                f"{sorted(self.policy.priorities)}"
            )
        return self

    @property
    def deadline_s(self) -> float:
        return self.tick_deadline_s if self.tick_deadline_s is not None else 0.8 * self.tick_s

    @property
    def queries(self) -> dict[str, str]:
        overrides = dict(self.prometheus.queries)
        if self.prometheus.dcgm_memory:
            overrides.setdefault("gpu_memory_headroom_ratio", DCGM_HEADROOM)
        return queries(self.model_server, self.prometheus.selector, overrides)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment over the file (passed as init values), as operators expect.
        return env_settings, init_settings


def _merge_tick(data: dict[str, Any]) -> dict[str, Any]:
    """The policy's tick follows the loop's unless set explicitly."""
    tick = data.get("tick_s")
    policy = data.get("policy")
    if tick is not None and isinstance(policy, dict) and "tick_s" not in policy:
        data = {**data, "policy": {**policy, "tick_s": tick}}
    elif tick is not None and policy is None:
        data = {**data, "policy": {"tick_s": tick}}
    return data


def load_config(path: str | Path | None) -> Settings:
    data: dict[str, Any] = {}
    source = "environment"
    if path is not None:
        source = str(path)
        data = read_yaml_mapping(path)
    try:
        return Settings(**_merge_tick(data))
    except ValidationError as exc:
        raise ConfigError(describe(exc, source)) from None
