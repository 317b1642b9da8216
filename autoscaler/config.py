"""Typed configuration, validated once at start: environment variables and a YAML file (the ConfigMap).

Environment variables use the prefix `AUTOSCALER_` and `__` for nesting, e.g. `AUTOSCALER_MODE=shadow`,
`AUTOSCALER_PROMETHEUS__URL=http://prometheus:9090`; they override the file. An invalid config exits
non-zero with a message naming each bad field and its value (see `load_config`). The control-loop period
is set in one place, `policy.tick_s` (the policy sizes its windows in ticks; the loop runs at its pace).
The policy section alone is what `autoscaler replay --policy FILE` reads (`load_policy_spec`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import ssl
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from autoscaler.errors import ConfigError
from autoscaler.presets import DCGM_HEADROOM, GATEWAY_PRESETS, PRESETS, queries
from autoscaler.textfile import read_text
from policies import PolicySpec
from policies.fleet import FleetSpec
from policies.types import SAMPLE_SIGNALS

# Unless set, a tick must finish its I/O within 80 % of the period: the rest keeps ticks from overlapping
# when the apiserver or Prometheus is slow (a late answer is dropped; the tick holds).
DEFAULT_DEADLINE_RATIO = 0.8


class Mode(str, Enum):
    actuate = "actuate"  # scale, warm pool, shed
    shadow = "shadow"  # decide and log everything, write nothing to the cluster
    keda = "keda"  # publish decisions over gRPC only; KEDA's HPA scales


ENV_PREFIX = "AUTOSCALER_"


def http_url(value: str) -> str:
    """An http(s) URL with a host, e.g. http://prometheus:9090 (an empty or schemeless value is refused)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http(s) URL with a host, like http://prometheus:9090")
    return value.strip()


HttpUrl = Annotated[str, AfterValidator(http_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    namespace: str = Field(min_length=1)
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: str = Field(min_length=1)


class PrometheusConfig(_Strict):
    url: HttpUrl | None = Field(None, description="Base URL; unset (null) disables PromQL signals.")
    timeout_s: float = Field(3.0, gt=0, le=60)
    selector: str = Field("", description="Label matchers put into every preset query, e.g. namespace=\"llm\".")
    queries: dict[str, str] = Field(
        default_factory=dict, max_length=64,
        description="Per-signal PromQL overriding the preset; keys are signal names "
        "(`policies.Signals` fields, or arrival_rate_<class> for a priority class of the policy).")
    dcgm_memory: bool = Field(False, description="GPU memory headroom from DCGM framebuffer metrics.")
    rate_window_s: float = Field(60.0, gt=0, le=3600, description="Window of rate() in the preset queries.")
    gateway: Literal[tuple(GATEWAY_PRESETS)] | None = Field(  # type: ignore[valid-type]
        None, description=f"Gateway preset: one of {sorted(GATEWAY_PRESETS)} (llm-d: requests held in the endpoint "
        "picker's flow control are read as held_requests); unset: none.")
    gateway_selector: str = Field("", description="Label matchers of the gateway preset's series, e.g. "
                                  "inference_pool=\"llama\".")

    @field_validator("queries")
    @classmethod
    def _signal_names(cls, value: dict[str, str]) -> dict[str, str]:
        unknown_queries(value, priorities=None)
        return value


class ScrapeConfig(_Strict):
    enabled: bool = False
    port: int = Field(8000, ge=1, le=65535)
    path: str = "/metrics"
    timeout_s: float = Field(2.0, gt=0, le=60)


class WarmPool(_Strict):
    enabled: bool = True
    backend: Literal["placeholders", "capacity-buffer"] = Field(
        "placeholders", description="placeholders: a Deployment of low-priority pods (any node provisioner); "
        "capacity-buffer: a SIG Autoscaling CapacityBuffer the provisioner honours (Karpenter, cluster-autoscaler)."
    )
    name_suffix: str = "-warm-pool"
    priority_class: str = Field("autoscaler-placeholder", min_length=1)
    pause_image: str = "registry.k8s.io/pause:3.10"


class Capacity(_Strict):
    gpu_resource: str | None = Field(
        None, description="The replica's GPU resource (e.g. nvidia.com/mig-3g.40gb); default: the first GPU or MIG "
        "resource its pod template requests."
    )
    max_gpus: int | None = Field(None, ge=0, description="GPU cap of this target: replicas and warm slots together.")
    namespace_max_gpus: int | None = Field(
        None, ge=0, description="GPU cap of the target's namespace; the namespace's other pods count against it."
    )
    kueue: bool = Field(True, description="Follow the kueue.x-k8s.io/queue-name label to its ClusterQueue's quota.")
    kueue_api_version: Literal["v1beta1", "v1beta2"] = "v1beta1"
    read_nodes: bool = Field(
        False, description="Count free replica-shaped room on existing nodes (idle slots). Needs list on nodes and on "
        "pods in every namespace (deploy/components/idle-slots grants it); without, idle slots count as 0."
    )
    gpu_hour_price: dict[str, float] = Field(
        default_factory=dict, description="Price per GPU-hour by node type (the node.kubernetes.io/instance-type or "
        "nvidia.com/gpu.product label), `default` for the rest: decisions and metrics report the target's cost."
    )

    @model_validator(mode="after")
    def _prices(self) -> "Capacity":
        bad = {k: v for k, v in self.gpu_hour_price.items() if not v >= 0}
        if bad:
            raise ValueError(f"gpu_hour_price must be >= 0, got {bad}")
        return self


class AdmissionConfig(_Strict):
    enabled: bool = True
    port: int = Field(8081, ge=1, le=65535)
    priority_header: str = "x-request-priority"
    default_priority: str = "standard"
    unknown_priority: str | None = Field(
        None, description="The class of a priority header naming no class (counted in "
        "autoscaler_admission_unknown_priority_total); None: default_priority."
    )
    retry_after_s: int = Field(5, ge=1, le=3600)
    max_hold_s: float | None = Field(
        None, gt=0, le=3600, description="Scale to zero: a request held for a Ready replica longer than this "
        "gets 503 with Retry-After; None: the learned cold start plus 60 s, at most 600 s. The gateway's hold "
        "timeout must exceed it (the shipped nginx.conf allows 660 s; docs/gateway.md)."
    )
    max_held_requests: int = Field(
        10_000, ge=1, description="Held requests at most; beyond, a new request below the top class gets 503 at "
        "once (the top class is always held)."
    )
    queue_probe_interval_s: float | None = Field(
        1.0, gt=0, le=60, description="Scrape the pods' queue gauge this often for the saturation guard "
        "(port and path from `scrape`); None: use the tick's queue depth."
    )


class ScalerTLS(_Strict):
    """TLS of the KEDA gRPC scaler: PEM files mounted from a Secret (cert-manager's layout: tls.crt, tls.key,
    ca.crt). Checked at start: each file readable, the key matching the certificate, the CA parseable."""

    cert_file: str = Field(min_length=1, description="The server's certificate (chain), PEM.")
    key_file: str = Field(min_length=1, description="The server certificate's private key, PEM.")
    client_ca_file: str | None = Field(
        None, min_length=1, description="Mutual TLS: a client must present a certificate signed by this CA "
        "(KEDA's tlsClientCert); None: any client may connect over TLS."
    )

    @field_validator("cert_file", "key_file", "client_ca_file")
    @classmethod
    def _readable(cls, path: str | None) -> str | None:
        if path is not None:
            try:
                Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        return path

    @model_validator(mode="after")
    def _usable(self) -> "ScalerTLS":
        problem = tls_files_problem(self.cert_file, self.key_file, self.client_ca_file)
        if problem is not None:
            raise ValueError(problem)
        return self


def tls_files_problem(cert_file: str, key_file: str, client_ca_file: str | None) -> str | None:
    """Why these files cannot serve TLS (not PEM, the key not the certificate's), or None when they can."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        return (f"cert_file {cert_file} and key_file {key_file} are not a PEM certificate and its private key "
                f"({getattr(exc, 'reason', None) or exc})")
    if client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            return f"client_ca_file {client_ca_file} holds no PEM certificate ({getattr(exc, 'reason', None) or exc})"
    return None


class Keda(_Strict):
    tls: ScalerTLS | None = Field(None, description="Serve gRPC over TLS (and mTLS); None: plaintext.")
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


class FleetDecision(_Strict):
    """How the fleet decision orders and smooths the models (policies.fleet.FleetSpec; docs/fleet.md)."""

    levels: list[tuple[Annotated[int, Field(ge=0, le=1000)], str]] = Field(
        default_factory=list, description="(tier, class) pairs served in this order, highest first, e.g. class-major "
        "[[0, critical], [1, critical], [0, standard], ...]; levels not named come after, tier-major; empty: "
        "tier-major (tier 0 critical first, the lowest tier's sheddable last).")
    warm_after: str = Field("last", description="Where a tier's pooled warm slots rank: last (after every "
                            "replica), tier (after the tier's own replicas), or a class name.")
    warm_stabilization_s: float = Field(0.0, ge=0, le=86400, description="The pooled warm size shrinks only to "
                                        "the largest it needed within this window.")
    warm_correlation_ratio: float = Field(0.0, ge=0, le=1, description="0: the pool sized for the fleet's summed "
                                          "demand's growth; 1: the sum of each model's own (surges that coincide).")
    zero_wake_slots: int = Field(1, ge=0, le=64, description="Pooled warm slots risked for each model at zero "
                                 "(its wake's first replica); 0: none.")

    @model_validator(mode="after")
    def _valid_spec(self) -> FleetDecision:
        self.spec()  # FleetSpec's own checks (classes named in levels, warm_after), as one clear error
        return self

    def spec(self) -> FleetSpec:
        return FleetSpec(levels=tuple((t, c) for t, c in self.levels), warm_after=self.warm_after,
                         warm_stabilization_s=self.warm_stabilization_s,
                         warm_correlation_ratio=self.warm_correlation_ratio, zero_wake_slots=self.zero_wake_slots)


class Fleet(_Strict):
    """Fleet mode: control every ModelAutoscaler object (docs/fleet-controller.md) instead of one `target`."""

    enabled: bool = False
    namespaces: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list, description="Namespaces whose ModelAutoscalers are served; empty: all namespaces.")
    status_every_ticks: int = Field(
        20, ge=1, le=10_000, description="A model's status is written when it changes, and at least this often "
        "(in ticks) otherwise, as a heartbeat.")
    shards: int = Field(0, ge=0, le=4096, description="Shard Leases the models are split over (several replicas); "
                        "0: no sharding, the process's leader election gates every write.")
    lease_namespace: str | None = Field(
        None, min_length=1, description="Namespace of the controller's Leases; default: POD_NAMESPACE, else default.")
    decision: FleetDecision = Field(default_factory=FleetDecision, description="The fleet decision's order and "
                                    "pooled warm capacity (used when capacity caps the fleet's GPUs).")
    queue_probe: bool = Field(
        False, description="Each model's admission endpoint probes its pods' queue and running requests every "
        "admission.queue_probe_interval_s, as in single-model mode (the saturation guard, the overrun rule and the "
        "slots kept for the top class read it); off: they read the tick's queue, and no slot is kept. Costs one "
        "/metrics read per pod per interval and one pod list per model every 15 s.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True)

    # None only in fleet mode (checked below). Annotated `Target`, not `Target | None`: pydantic-settings reads
    # a variable of an optional nested field that is not JSON as a plain string, and its "not valid JSON"
    # message would be lost.
    target: Target = Field(None, validate_default=False,  # type: ignore[assignment]
                           description="The one model's workload; unset in fleet mode.")
    fleet: Fleet = Field(default_factory=Fleet)
    mode: Mode = Mode.shadow
    model_server: str = Field("vllm", description=f"Metric preset: one of {sorted(PRESETS)}")
    tick_deadline_s: float | None = Field(None, gt=0, description="Default: 80 % of policy.tick_s.")
    http_port: int = Field(8080, ge=1, le=65535, description="Health, readiness and /metrics.")
    stale_after_ticks: int = Field(
        4, ge=2, le=1000, description="A decision older than this many policy.tick_s is stale: KEDA gets UNAVAILABLE, "
        "the admission endpoint admits. At least 2: a healthy loop's latest decision is up to ~1.8 ticks old."
    )
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    warm_pool: WarmPool = Field(default_factory=WarmPool)
    capacity: Capacity = Field(default_factory=Capacity)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    keda: Keda = Field(default_factory=Keda)
    leader_election: LeaderElection = Field(default_factory=LeaderElection)

    @model_validator(mode="after")
    def _cross_checks(self) -> "Settings":
        if self.target is None and not self.fleet.enabled:
            raise ValueError("no target: set target (one model) or fleet.enabled (every ModelAutoscaler object)")
        if self.target is not None and self.fleet.enabled:
            raise ValueError(f"target {self.target.namespace}/{self.target.name} and fleet.enabled: pick one (in "
                             "fleet mode each ModelAutoscaler names its target)")
        self._decision_applies()
        if self.model_server not in PRESETS:
            raise ValueError(f"model_server {self.model_server!r} is not one of {sorted(PRESETS)}")
        if self.prometheus.url is None and not self.scrape.enabled:
            raise ValueError("no signal source: set prometheus.url or enable scrape")
        if self.deadline_s > self.tick_s:
            raise ValueError(f"tick_deadline_s ({self.tick_deadline_s}) must not exceed policy.tick_s ({self.tick_s})")
        try:
            unknown_queries(self.prometheus.queries, self.policy.priorities)
        except ValueError as exc:
            raise ValueError(f"prometheus.queries: {exc}") from None
        for key in ("default_priority", "unknown_priority"):
            value = getattr(self.admission, key)
            if value is not None and value not in self.policy.priorities:
                raise ValueError(f"admission.{key} {value!r} is not one of {sorted(self.policy.priorities)}")
        folded = sorted(name.casefold() for name in self.policy.priorities)
        if len(set(folded)) < len(folded):
            raise ValueError(f"policy.priorities {sorted(self.policy.priorities)}: names must differ in more than "
                             "case (the admission endpoint matches them case-insensitively)")
        return self._with_rate_window()

    def _decision_applies(self) -> None:
        """A `fleet.decision` that nothing would read is refused, not silently ignored."""
        if self.fleet.decision == FleetDecision():
            return
        if not self.fleet.enabled:
            raise ValueError("fleet.decision is set but fleet.enabled is not: the fleet decision runs in fleet mode")
        if self.capacity.max_gpus is None and self.capacity.namespace_max_gpus is None:
            raise ValueError("fleet.decision is set but no GPU cap is: the fleet decision runs under "
                             "capacity.max_gpus or capacity.namespace_max_gpus (without one each model decides alone)")

    def _with_rate_window(self) -> "Settings":
        """The policy told the window its arrival rate is averaged over, when unset there and the rate is the
        preset query's (`policy.rate_window_s`: a rate read within it of the first request is not learned);
        an overridden query's window is not known."""
        preset = self.prometheus.url is not None and "arrival_rate_per_s" not in self.prometheus.queries
        if self.policy.rate_window_s is None and preset:
            # frozen: set once, here, before anyone holds the settings
            object.__setattr__(self, "policy",
                               self.policy.model_copy(update={"rate_window_s": self.prometheus.rate_window_s}))
        return self

    @property
    def tick_s(self) -> float:
        return self.policy.tick_s

    @property
    def deadline_s(self) -> float:
        return self.tick_deadline_s if self.tick_deadline_s is not None else DEFAULT_DEADLINE_RATIO * self.tick_s

    @property
    def queries(self) -> dict[str, str]:
        overrides = dict(self.prometheus.queries)
        if self.prometheus.dcgm_memory:
            overrides.setdefault("gpu_memory_headroom_ratio", DCGM_HEADROOM)
        return queries(self.model_server, self.prometheus.selector, overrides, window_s=self.prometheus.rate_window_s,
                       gateway=self.prometheus.gateway, gateway_selector=self.prometheus.gateway_selector)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment over the file (passed as init values), as operators expect.
        return env_settings, init_settings


def unknown_queries(overrides: dict[str, str], priorities: dict[str, int] | None) -> None:
    """A query for a signal nothing reads is a typo (`queue_depht`): refused, with the closest name.
    Per-class arrival rates are `arrival_rate_<class>`, for a class of `priorities` (any, when None)."""
    classes = ["<class>"] if priorities is None else list(priorities)
    known = list(SAMPLE_SIGNALS) + [f"arrival_rate_{name}" for name in classes]
    for name in overrides:
        per_class = priorities is None and name.startswith("arrival_rate_") and name != "arrival_rate_"
        if name not in known and not per_class:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown signal {name!r}{hint} (known: {', '.join(known)})")


def describe(error: ValidationError, source: str, env: dict[tuple[str, ...], str] | None = None) -> str:
    """One line per error: the source (the file, or the environment variable that set the field), the
    field and the value. `env` maps the field paths set by environment variables to the variables."""
    lines = []
    for item in error.errors():
        loc = tuple(str(p) for p in item["loc"])
        field = ".".join(loc) or "(spec)"
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{_blame(loc, source, env or {})}: field {field!r}: {item['msg']}{shown}")
    return "\n".join(lines)


def _blame(loc: tuple[str, ...], source: str, env: dict[tuple[str, ...], str]) -> str:
    for path, var in env.items():
        if loc[: len(path)] == path:
            return f"environment variable {var}"  # the variable set this field (or a parent of it)
    involved = [var for path, var in env.items() if path[: len(loc)] == loc]
    if involved:  # a check across fields some of which came from the environment
        return f"{source} with environment variable{'s' if len(involved) > 1 else ''} {', '.join(involved)}"
    return source


def env_fields(environ: dict[str, str] | None = None) -> dict[tuple[str, ...], str]:
    """Field paths set by `AUTOSCALER_*` variables: AUTOSCALER_POLICY__MAX_REPLICAS -> (policy, max_replicas)."""
    environ = os.environ if environ is None else environ
    fields = set(Settings.model_fields)
    out = {}
    for var in environ:
        upper = var.upper()
        if upper.startswith(ENV_PREFIX):
            path = tuple(upper[len(ENV_PREFIX):].lower().split("__"))
            if path[0] in fields:
                out[path] = var
    return out


def _env_json_error(exc: SettingsError, env: dict[tuple[str, ...], str]) -> ConfigError:
    """pydantic-settings reads a nested field's variable as JSON; say which variable is not JSON."""
    match = re.search(r'field "(\w+)"', str(exc))
    field = match.group(1) if match else None
    suspects = []
    for path, var in env.items():
        text = os.environ.get(var, "")
        try:
            json.loads(text)
        except ValueError as bad:
            if path[0] == field:
                suspects.append((not text.lstrip().startswith(("{", "[")), len(path), var, bad))
    if not suspects:
        return ConfigError(f"environment: {exc}")
    *_, var, bad = min(suspects)
    return ConfigError(f"environment variable {var}: not valid JSON ({bad}): got {os.environ[var]!r}; a nested field "
                       f"takes a JSON object, or set its fields one by one ({ENV_PREFIX}{field.upper()}__<FIELD>)")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`:line: not valid YAML: what`, on one line (a control character has no line: its offset instead)."""
    if isinstance(exc, yaml.reader.ReaderError):
        code = ord(exc.character) if isinstance(exc.character, str) else exc.character
        return f": not valid YAML: character 0x{code:02x} at offset {exc.position}: {exc.reason}"
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}" if mark is not None else ""
    return f"{where}: not valid YAML: {' '.join(str(getattr(exc, 'problem', None) or exc).split())}"


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file that must hold a mapping (empty file: empty mapping), or a ConfigError saying why."""
    path = Path(path)
    text = read_text(path, ConfigError)
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}{_yaml_problem(exc)}") from None
    except ValueError as exc:  # PyYAML builds dates as it reads: `2023-13-45` is a date it cannot build
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(loaded).__name__}")
    for key in loaded:
        if not isinstance(key, str):
            raise ConfigError(f"{path}: key {key!r}: expected a field name")
    return loaded


def load_policy_spec(path: str | Path | None, **overrides) -> PolicySpec:
    """A `PolicySpec` from a YAML mapping of its fields (or the `policy:` section of a controller config)."""
    data: dict = {}
    source = "policy"
    if path is not None:
        source = str(path)
        data = read_yaml_mapping(path)
        if isinstance(data.get("policy"), dict):
            data = data["policy"]  # a controller config (or a `policy:` section alone): the policy part
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return PolicySpec(**data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, source)) from None


def load_config(path: str | Path | None) -> Settings:
    data: dict[str, Any] = {}
    source = "environment"
    if path is not None:
        source = str(path)
        data = read_yaml_mapping(path)
    if "tick_s" in data:
        raise ConfigError(f"{source}: field 'tick_s': set the loop's period as policy.tick_s (one place for both)")
    env = env_fields()
    try:
        return Settings(**data)
    except SettingsError as exc:
        raise _env_json_error(exc, env) from None
    except ValidationError as exc:
        raise ConfigError(describe(exc, source, env)) from None
