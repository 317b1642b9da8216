"""PromQL for a whole fleet: one query per signal per refresh, answers split per model (a `SignalHub`).

A model's preset query (`autoscaler/presets.py`, as `PrometheusSource` gets it from `Settings.queries`) is
rewritten once for the fleet: every aggregation in it also keeps `namespace` and the model label
(`sum(x{sel})` -> `sum by (namespace, app) (x{fleet sel})`, `sum by (le)` -> `sum by (le, namespace, app)`),
so the binary operators between its parts match model by model and the answer holds one series per model.
The fleet selector takes every series carrying the model label in the models' namespaces.

The model label is the label that tells models apart: `model_label` if given, else the one label besides
`namespace` in the model's selector (`settings_for` makes it `namespace="ns",app="llama"` from the
ModelAutoscaler's pod selector). Models whose selector is not exactly `namespace="..."` and that label
(equality matchers) cannot be told apart in a grouped answer without changing what is summed: they, the
signals a model overrides with its own query, and the gateway preset's signals (selected by their own
gateway selector) are queried per model, as `PrometheusSource` does. Models are grouped by Prometheus URL,
preset, rate window, DCGM headroom and model label; each group costs one query per signal.

Semantics equal `PrometheusSource`'s, model by model: a model without a series gets no sample (the signal
is missing, never zero; the hub logs which models, when that set changes, and `missing(key)` tells);
"NaN" stays NaN (the policy drops it); a failed fleet query is that signal's error for every model of the
group. Each query is bounded by `timeout_s`; all run concurrently. `source(key).collect(now)` serves the
answers of the latest `refresh` (Prometheus' evaluation time is each sample's time, so the policy sees their
age); a model the latest refresh did not cover reports its signals as an error (the policy holds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import aiohttp
import structlog

from autoscaler.config import Settings
from autoscaler.errors import TransientError
from autoscaler.presets import DCGM_HEADROOM, PRESETS
from autoscaler.signals.prometheus import (
    PrometheusSource, QueryResult, gather_named, instant_query, query_url, series_sample, vector_series,
)
from policies.types import Sample

log = structlog.get_logger("autoscaler")

Key = tuple[str, str]

_AGGREGATION = re.compile(r"\b(sum|avg|min|max|count)\s*(?:by\s*\(([^)]*)\))?\s*\(")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def fleet_template(template: str, labels: tuple[str, ...]) -> str:
    """A preset query whose aggregations also keep `labels` (one series per model instead of one in all)."""
    def by(match: re.Match) -> str:
        kept = [name.strip() for name in (match.group(2) or "").split(",") if name.strip()]
        return f"{match.group(1)} by ({', '.join([*kept, *labels])}) ("

    rewritten, count = _AGGREGATION.subn(by, template)
    if count == 0:
        raise ValueError(f"{template!r} aggregates nothing: it cannot be split per model")
    return rewritten


def equality_matchers(selector: str) -> dict[str, str] | None:
    """`a="x",b="y"` -> {a: x, b: y}; None when the selector has any other matcher or does not parse."""
    found: dict[str, str] = {}
    position = 0
    text = selector.strip()
    while position < len(text):
        match = _MATCHER.match(text, position)
        if match is None or match.group(2) != "=" or match.group(1) in found:
            return None
        found[match.group(1)] = match.group(3)
        position = match.end()
    return found


@dataclass(frozen=True)
class Group:
    """Models whose preset queries differ only in the model's label value: one fleet query per signal."""

    url: str
    preset: str
    window_s: float
    dcgm: bool
    label: str


@dataclass(frozen=True)
class Plan:
    """How one model's signals are served: `shared` from its group's answers under `series` (namespace,
    label value), the rest by `fallback` (its own queries), if any."""

    group: Group | None
    series: tuple[str, str] | None
    shared: frozenset[str]
    fallback: PrometheusSource | None


def template_of(group: Group, signal: str) -> str:
    if group.dcgm and signal == "gpu_memory_headroom_ratio":
        return DCGM_HEADROOM
    return PRESETS[group.preset][signal]


def fleet_query(group: Group, signal: str, namespaces: set[str]) -> str:
    """The one query of `signal` for every model of `group` in `namespaces`."""
    window_s = group.window_s
    window = f"{int(window_s)}s" if window_s == int(window_s) else f"{round(window_s * 1000)}ms"
    spaces = "|".join(sorted(re.escape(n) for n in namespaces))
    selector = f'{group.label}!="",namespace=~"{spaces}"'
    return (fleet_template(template_of(group, signal), ("namespace", group.label))
            .replace("$selector", selector).replace("$window", window))


@dataclass
class FleetPrometheus:
    """The fleet's SignalHub over Prometheus (see the module docstring)."""

    session: aiohttp.ClientSession
    timeout_s: float = 3.0
    model_label: str | None = None
    _plans: dict[Key, Plan] = field(default_factory=dict)
    _answers: dict[tuple[Group, str], dict[tuple[str, str], Sample]] = field(default_factory=dict)
    _errors: dict[tuple[Group, str], Exception] = field(default_factory=dict)
    _missing: dict[Key, frozenset[str]] = field(default_factory=dict)
    _logged: dict[str, frozenset[Key]] = field(default_factory=dict)

    def plan(self, settings: Settings) -> Plan:
        """Which of a model's signals the fleet queries serve, and its own queries for the rest."""
        prometheus = settings.prometheus
        own = settings.queries
        if prometheus.url is None or not own:
            return Plan(None, None, frozenset(), None)
        matchers = equality_matchers(prometheus.selector) or {}
        others = sorted(set(matchers) - {"namespace"})
        label = self.model_label or (others[0] if len(others) == 1 else None)
        shared: frozenset[str] = frozenset()
        group = series = None
        if label is not None and set(matchers) == {"namespace", label}:
            group = Group(str(prometheus.url), settings.model_server, prometheus.rate_window_s,
                          prometheus.dcgm_memory, label)
            series = (matchers["namespace"], matchers[label])
            preset = set(PRESETS[settings.model_server]) | ({"gpu_memory_headroom_ratio"} if group.dcgm else set())
            shared = frozenset(preset & set(own)) - set(prometheus.queries)
        rest = {name: q for name, q in own.items() if name not in shared}
        fallback = (PrometheusSource(self.session, str(prometheus.url), rest, timeout_s=prometheus.timeout_s)
                    if rest else None)
        return Plan(group, series, shared, fallback)

    async def _query(self, group: Group, signal: str, namespaces: set[str], now: float) -> dict:
        query = fleet_query(group, signal, namespaces)
        body = await instant_query(self.session, query_url(group.url), query, now=now,
                                   timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        answers = {}
        for series in vector_series(body, query):
            labels = (series.get("metric") if isinstance(series, dict) else None) or {}
            answers[(labels.get("namespace", ""), labels.get(group.label, ""))] = series_sample(series, query)
        return answers

    async def refresh(self, now: float, models: Mapping[Key, Settings]) -> None:
        """One query per signal per group of models, concurrently; the answers are kept for `source`."""
        plans = {key: self.plan(settings) for key, settings in models.items()}
        wanted: dict[tuple[Group, str], set[str]] = {}
        for plan in plans.values():
            for signal in plan.shared:
                wanted.setdefault((plan.group, signal), set()).add(plan.series[0])
        answers, errors = await gather_named({(g, s): self._query(g, s, spaces, now)
                                              for (g, s), spaces in wanted.items()})
        self._plans, self._answers, self._errors = plans, answers, errors
        self._missing = {key: frozenset(s for s in plan.shared if (plan.group, s) in answers
                                        and plan.series not in answers[(plan.group, s)])
                         for key, plan in plans.items()}
        self._name_missing()

    def _name_missing(self) -> None:
        """Log the models each signal has no series for, when that set changes."""
        by_signal: dict[str, set[Key]] = {}
        for key, signals in self._missing.items():
            for signal in signals:
                by_signal.setdefault(signal, set()).add(key)
        for signal in set(by_signal) | set(self._logged):
            keys = frozenset(by_signal.get(signal, ()))
            if keys != self._logged.get(signal, frozenset()):
                if keys:
                    log.warning("no series for these models: the signal is missing (not zero)", signal=signal,
                                models=sorted(f"{ns}/{name}" for ns, name in keys))
                self._logged[signal] = keys

    def missing(self, key: Key) -> frozenset[str]:
        """The signals the latest refresh found no series of for this model."""
        return self._missing.get(key, frozenset())

    def source(self, key: Key) -> "ModelSignals":
        return ModelSignals(self, key)

    async def collect(self, key: Key, now: float) -> QueryResult:
        plan = self._plans.get(key)
        if plan is None:
            return QueryResult(errors={"signals": TransientError(
                f"{key[0]}/{key[1]} was not in the fleet's latest signal refresh", kind="not_refreshed")})
        result = await plan.fallback.collect(now) if plan.fallback is not None else QueryResult()
        for signal in plan.shared:
            if (plan.group, signal) in self._errors:
                result.errors[signal] = self._errors[(plan.group, signal)]
            elif plan.series in self._answers[(plan.group, signal)]:
                result.samples[signal] = self._answers[(plan.group, signal)][plan.series]
        return result


@dataclass(frozen=True)
class ModelSignals:
    """One model's SampleSource on the hub."""

    hub: FleetPrometheus
    key: Key

    async def collect(self, now: float) -> QueryResult:
        return await self.hub.collect(self.key, now)
