"""The ModelAutoscaler API: one namespaced object per model, and its CRD generated from the pydantic models.

The spec reuses the models that validate the controller's config (`policies.PolicySpec`,
`autoscaler.config.PrometheusSource` and `ScrapeSource`), so an object is checked by the same rules as a config
file: the apiserver through the CRD's OpenAPI v3 schema, generated here from those models (`crd()`), and the
controller through `ModelAutoscalerSpec.model_validate(..., strict=True)`. The `policy` and `signals` sections
keep the config file's keys (snake_case) so a config's sections move into an object unchanged; the fields new
to the object are camelCase, as Kubernetes APIs are.

What OpenAPI can say comes from the models: types, enums, bounds, required fields, map sizes; unknown fields are
pruned (or refused with `fieldValidation=Strict`, kubectl's default). The cross-field rules of the models are
repeated as CEL `x-kubernetes-validations` (`CEL_RULES`), and tests check both sides reject the same bad specs.
What needs the controller's own config (a signal source, the admission classes) is checked by `settings_for`.

Invariants: no I/O at import; `python -m autoscaler.crd` prints the CRD (deploy/crds/modelautoscaler.yaml is
that output, checked by a test).
"""

from __future__ import annotations

import re
import sys
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

from autoscaler.config import PrometheusSource, ScrapeSource, Settings, describe, unknown_queries
from autoscaler.errors import ConfigError
from autoscaler.presets import PRESETS
from policies import PolicySpec
from policies.types import SAMPLE_SIGNALS

GROUP = "autoscaling.inference-autoscaler.io"
VERSION = "v1alpha1"
KIND = "ModelAutoscaler"
PLURAL = "modelautoscalers"
CONDITION_TYPES = ("Active", "CappedByBudget", "CapacityUnavailable", "SignalsMissing")

ModelServer = Literal[tuple(sorted(PRESETS))]  # type: ignore[valid-type]  # an enum in the schema


class _Api(BaseModel):
    """A Kubernetes-style part of the object: camelCase keys only, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)


class TargetRef(_Api):
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: str = Field(min_length=1, max_length=253, description="The model server's workload, in this namespace.")


class LabelSelector(_Api):
    match_labels: dict[str, str] = Field(
        default_factory=dict, description="The model server's pods; also the PromQL label matchers when "
        "signals.prometheus.selector is empty (with the namespace).")


class SignalSources(_Api):
    """The config file's `prometheus` and `scrape` sections, key for key."""

    prometheus: PrometheusSource = Field(default_factory=PrometheusSource)
    scrape: ScrapeSource = Field(default_factory=ScrapeSource)


class Budget(_Api):
    max_gpus: int | None = Field(None, ge=0, alias="maxGPUs",
                                 description="GPU cap of this model: replicas and warm slots together.")
    kueue_queue: str | None = Field(
        None, min_length=1, max_length=253, description="The Kueue LocalQueue whose ClusterQueue quota this model "
        "draws on; unset: the target's kueue.x-k8s.io/queue-name label, if any.")


class ModelAutoscalerSpec(_Api):
    target: TargetRef
    model_server: ModelServer = Field("vllm", description="Metric preset of the model server.")
    selector: LabelSelector = Field(default_factory=LabelSelector)
    signals: SignalSources = Field(default_factory=SignalSources)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    tier: int = Field(1, ge=0, le=100, description="Priority tier across the fleet; 0 is the highest.")
    weight: float = Field(1.0, gt=0, le=1000, description="Share of the budget within a tier, relative to the "
                          "tier's other models.")
    budget: Budget = Field(default_factory=Budget)

    @model_validator(mode="after")
    def _classes_of_queries(self) -> "ModelAutoscalerSpec":
        try:
            unknown_queries(self.signals.prometheus.queries, self.policy.priorities)
        except ValueError as exc:
            raise ValueError(f"signals.prometheus.queries: {exc}") from None
        return self


class Condition(_Api):
    type: Literal[CONDITION_TYPES]  # type: ignore[valid-type]
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", max_length=1024)
    message: str = Field("", max_length=32768)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, ge=0)


class ModelAutoscalerStatus(_Api):
    observed_generation: int | None = Field(None, ge=0)
    replicas: int | None = Field(None, ge=0, description="The latest decided replicas.")
    warm_slots: int | None = Field(None, ge=0, description="Warm (placeholder) GPU slots decided.")
    shed_fractions: dict[str, float] = Field(default_factory=dict, description="Fraction of requests shed, by class.")
    lead_time_s: float | None = Field(None, ge=0, alias="leadTimeSeconds", description="The lead time planned for.")
    reasons: list[str] = Field(default_factory=list, description="Why the latest decision is what it is.")
    last_decision_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})


# The models' cross-field checks that CEL can say, where they apply (a path of properties from the spec).
_SIGNALS = ", ".join(f"'{name}'" for name in SAMPLE_SIGNALS)
_PER_CLASS = "arrival_rate_"  # arrival_rate_<class>: a class of the policy (arrival_rate_per_s is a signal)
CEL_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    (): [
        {"rule": "!has(self.signals.prometheus.queries) || self.signals.prometheus.queries.all(k, "
                 f"!k.startsWith('{_PER_CLASS}') || k in [{_SIGNALS}] || k.substring({len(_PER_CLASS)}) in "
                 "self.policy.priorities)",
         "message": "signals.prometheus.queries: arrival_rate_<class> names a class not in policy.priorities"},
    ],
    ("signals", "prometheus"): [
        {"rule": f"!has(self.queries) || self.queries.all(k, k in [{_SIGNALS}] || "
                 f"(k.startsWith('{_PER_CLASS}') && k != '{_PER_CLASS}'))",
         "message": f"queries: unknown signal (known: {', '.join(SAMPLE_SIGNALS)}, arrival_rate_<class>)"},
        {"rule": "!has(self.url) || self.url.matches('^https?://[^/?#:]+')",
         "message": "url: expected an http(s) URL with a host, like http://prometheus:9090"},
    ],
    ("policy",): [
        {"rule": "self.min_replicas <= self.max_replicas", "message": "min_replicas must not exceed max_replicas"},
        {"rule": "self.saturation_wait_ratio <= self.saturation_wait_max_ratio",
         "message": "saturation_wait_ratio must not exceed saturation_wait_max_ratio"},
        {"rule": "self.forecast_bucket_s >= self.tick_s", "message": "forecast_bucket_s must be >= tick_s"},
        {"rule": "self.priorities.exists(k, self.priorities[k] >= self.shed_priority_below)",
         "message": "shed_priority_below would allow shedding the highest priority"},
        {"rule": "self.priorities.exists(k, self.priorities[k] >= self.guard_priority_below)",
         "message": "guard_priority_below would reject the highest priority"},
    ],
}

# Keywords of pydantic's JSON Schema that a structural Kubernetes schema does not take.
_DROPPED = {"title", "examples", "$defs", "const", "exclusiveMinimum", "exclusiveMaximum", "additionalProperties"}


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's JSON Schema of a model -> a structural OpenAPI v3 schema: $refs inlined, `X | None` as
    nullable X, numeric exclusive bounds in OpenAPI's boolean form, `const` as a one-value enum, no titles,
    no `additionalProperties: false` (Kubernetes prunes unknown fields instead)."""
    defs = schema.get("$defs", {})

    def walk(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        if "anyOf" in node:
            kinds = [k for k in node["anyOf"] if k.get("type") != "null"]
            if len(kinds) != 1:
                raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
            return {**walk({**kinds[0], **{k: v for k, v in node.items() if k != "anyOf"}}), "nullable": True}
        out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROPPED}
        if "const" in node:
            out["enum"] = [node["const"]]
        for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if bound in node:
                out[limit], out[bound] = node[bound], True
        if "default" in out:
            out["default"] = _without_nulls(out["default"])
            if out["default"] is None:
                del out["default"]  # the absence of a nullable field is its null
        if "properties" in node:
            out["properties"] = {name: walk(sub) for name, sub in node["properties"].items()}
        elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = walk(node["additionalProperties"])
        if "items" in node:
            out["items"] = walk(node["items"])
        return out

    return walk(schema)


class _FactoryDefaults(GenerateJsonSchema):
    """Defaults made by a factory (a whole section, the priority classes) in the schema too: the apiserver
    then fills in a section left out, as the model does, and the section's CEL rules see every field."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()
        return super().get_default_value(schema)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _with_rules(schema: dict[str, Any]) -> dict[str, Any]:
    for path, rules in CEL_RULES.items():
        node = schema
        for name in path:
            node = node["properties"][name]
        node["x-kubernetes-validations"] = rules
    return schema


PRINTER_COLUMNS = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
    {"name": "Tier", "type": "integer", "jsonPath": ".spec.tier"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Warm", "type": "integer", "jsonPath": ".status.warmSlots"},
    {"name": "Shed", "type": "string", "jsonPath": ".status.shedFractions"},
    {"name": "Lead-s", "type": "number", "jsonPath": ".status.leadTimeSeconds"},
    {"name": "Active", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Active\")].status"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of ModelAutoscaler, its schema generated from the models above."""
    spec = _with_rules(structural(ModelAutoscalerSpec.model_json_schema(schema_generator=_FactoryDefaults)))
    status = structural(ModelAutoscalerStatus.model_json_schema(schema_generator=_FactoryDefaults))
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": ["ma"], "categories": ["inference-autoscaler"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "required": ["spec"],
                    "description": "Autoscaling of one model server: its target, signals, policy and budget.",
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec, "status": status},
                }},
            }],
        },
    }


def render() -> str:
    header = "# Generated by `python -m autoscaler.crd` from the pydantic models; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


def parse_spec(spec: dict[str, Any], source: str = "spec") -> ModelAutoscalerSpec:
    """An object's spec, validated like the apiserver does (strictly typed: "3" is not a number)."""
    try:
        return ModelAutoscalerSpec.model_validate(spec, strict=True)
    except ValidationError as exc:
        raise ConfigError(describe(exc, source)) from None


class ObjectSettings(Settings):
    """Settings of one model of the fleet: from the object and the process's config only, never from the
    environment (AUTOSCALER_POLICY__MAX_REPLICAS must not set every model's bound)."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **_others):
        return (init_settings,)


def settings_for(*, namespace: str, spec: ModelAutoscalerSpec, base: dict[str, Any] | None = None) -> Settings:
    """The controller config of one model: the process's own config mapping `base` (mode, admission, KEDA,
    warm pool, the Prometheus URL...) with the object's target, preset, signals, policy and GPU cap. The
    environment is not read (one process serves many models). A ConfigError names what does not fit."""
    data = dict(base or {})
    prometheus = spec.signals.prometheus.model_dump()
    if prometheus["url"] is None:
        prometheus["url"] = data.get("prometheus", {}).get("url")
    if not prometheus["selector"]:
        labels = {"namespace": namespace, **spec.selector.match_labels}
        # a pod label is a Prometheus label with `.`, `/` and `-` as `_` (the usual relabelling)
        prometheus["selector"] = ",".join(f'{re.sub(r"[^a-zA-Z0-9_]", "_", k)}="{v}"' for k, v in labels.items())
    data.update(
        target={"namespace": namespace, "kind": spec.target.kind, "name": spec.target.name},
        model_server=spec.model_server, prometheus=prometheus, scrape=spec.signals.scrape.model_dump(),
        policy=spec.policy.model_dump(), capacity={**data.get("capacity", {}), "max_gpus": spec.budget.max_gpus},
    )
    try:
        return ObjectSettings(**data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, f"{KIND} {namespace}/{spec.target.name}")) from None


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
