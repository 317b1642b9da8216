"""From a trace to a workload the simulated cluster serves: service times, priorities and scale.

Capacity model (defaults, documented in the README): a replica serves `concurrency` requests at once; a
request occupies its slot for prefill_s_per_token x input + decode_s_per_token x output seconds (about an
8B model on one H100 with vLLM at moderate batch: 10k prompt tokens/s, 50 generated tokens/s per stream).

Scale: by default every trace is scaled so that its busiest minute (busiest window for rate traces) keeps
`peak_replicas` x `concurrency` x `peak_utilization` slots busy, i.e. needs tens of replicas. Request traces
are scaled up by superposing copies shifted by up to `copy_shift_s` (which keeps their minute-scale burst
shape), the last copy thinned to the fractional part; rate traces multiply their rates (thinning below 1,
which makes each client's counts less dispersed: `scaled_cv2`).

Priorities: the classes are the policy's (`PolicySpec.priorities`, highest first); each request gets one
deterministically from a per-request hash, by a configurable mix of shares (the benchmark's default
20 % / 50 % / 30 % of critical / standard / sheddable). A rate workload may instead carry a mix per window
(a recording's per-priority arrival rates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from autoscaler.errors import TraceError
from autoscaler.limits import MAX_SIMULATED_REQUESTS
from autoscaler.traces import RateTrace, RequestTrace
from policies import PolicySpec

CLASSES = PolicySpec().classes  # the policy's default classes, highest priority first
DEFAULT_MIX = (0.2, 0.5, 0.3)  # the benchmark's shares of critical, standard, sheddable


@dataclass(frozen=True)
class ServerModel:
    concurrency: int = 16
    prefill_s_per_token: float = 0.0001
    decode_s_per_token: float = 0.02
    default_input_tokens: float = 1000.0  # when a rate trace has no token distributions
    default_output_tokens: float = 250.0

    def service_s(self, input_tokens, output_tokens):
        return self.prefill_s_per_token * input_tokens + self.decode_s_per_token * output_tokens


@dataclass(frozen=True)
class WorkloadConfig:
    peak_replicas: int = 40
    peak_utilization: float = 0.85
    scale: float | None = None  # explicit factor; overrides peak_replicas
    copy_shift_s: float = 30.0
    classes: tuple[str, ...] = CLASSES  # highest priority first
    priority_mix: tuple[float, ...] = DEFAULT_MIX  # a share per class, in the same order
    seed: int = 1
    server: ServerModel = field(default_factory=ServerModel)


@dataclass(frozen=True)
class RequestWorkload:
    name: str
    scale: float
    arrival_s: np.ndarray
    service_s: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray  # index into `classes`
    uniform: np.ndarray  # per-request U(0,1) for deterministic shedding
    span_s: float
    classes: tuple[str, ...] = CLASSES


@dataclass(frozen=True)
class RateWorkload:
    name: str
    scale: float
    window_s: float
    rate_per_s: np.ndarray
    client_rate_per_s: np.ndarray  # clients x windows
    client_cv2: np.ndarray
    service_s: np.ndarray  # mean per window
    output_tokens: np.ndarray
    priority_mix: np.ndarray  # shares per class (classes,), or per window (windows x classes)
    span_s: float
    classes: tuple[str, ...] = CLASSES

    def shares(self, window: int) -> np.ndarray:
        """The classes' shares of the window's arrivals (summing to 1)."""
        mix = np.asarray(self.priority_mix, dtype=float)
        mix = mix if mix.ndim == 1 else mix[window]
        return mix / mix.sum()


def check_mix(classes: tuple[str, ...], mix: tuple[float, ...]) -> None:
    if len(mix) != len(classes):
        raise ValueError(f"priority_mix needs one share per class {list(classes)}, got {list(mix)}")
    if sum(mix) <= 0 or min(mix) < 0:
        raise ValueError(f"priority_mix must be non-negative with a positive sum, got {list(mix)}")


def _priorities(count: int, mix: tuple[float, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    total = sum(mix)
    # A multiplicative hash of the request index: the same request always gets the same class.
    index = np.arange(count, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B9)
    hashed = (index * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(11)
    u_class = hashed.astype(np.float64) / float(1 << 53)
    bounds = np.cumsum(np.array(mix) / total)
    priority = np.searchsorted(bounds, u_class, side="right").clip(0, len(mix) - 1).astype(np.int8)
    rng = np.random.default_rng(seed + 7)
    return priority, rng.random(count)


def _peak_busy_slots(arrival: np.ndarray, service: np.ndarray, span: float) -> float:
    minutes = max(1, math.ceil(span / 60.0))
    work = np.bincount(np.minimum((arrival // 60).astype(int), minutes - 1), weights=service, minlength=minutes)
    return float(work.max() / 60.0)


def request_workload(trace: RequestTrace, config: WorkloadConfig) -> RequestWorkload:
    check_mix(config.classes, config.priority_mix)
    server = config.server
    service = server.service_s(trace.input_tokens, trace.output_tokens)
    span = max(trace.span_s, 1.0)
    if config.scale is not None:
        scale = config.scale
    else:
        target = config.peak_replicas * server.concurrency * config.peak_utilization
        scale = target / max(_peak_busy_slots(trace.arrival_s, service, span), 1e-9)
    if scale * len(service) > MAX_SIMULATED_REQUESTS:  # copies of the trace: memory and time grow with them
        raise TraceError(f"trace {trace.name!r}: scaling by x{scale:.3g} makes {scale * len(service):.3g} requests, "
                         f"more than the {MAX_SIMULATED_REQUESTS} a run may simulate; lower --scale or --peak-replicas")
    rng = np.random.default_rng(config.seed)
    arrivals, services, outputs = [], [], []
    copies = math.ceil(scale)
    for copy in range(copies):
        keep = np.ones(len(service), dtype=bool)
        if copy == copies - 1 and scale < copies:
            keep = rng.random(len(service)) < (scale - (copies - 1))
        shift = 0.0 if copy == 0 else rng.uniform(0.0, config.copy_shift_s)
        arrivals.append((trace.arrival_s[keep] + shift) % (span + 1e-9))
        services.append(service[keep])
        outputs.append(trace.output_tokens[keep])
    arrival = np.concatenate(arrivals)
    order = np.argsort(arrival, kind="stable")
    priority, uniform = _priorities(len(arrival), config.priority_mix, config.seed)
    return RequestWorkload(
        name=trace.name, scale=scale, arrival_s=arrival[order], service_s=np.concatenate(services)[order],
        output_tokens=np.concatenate(outputs)[order], priority=priority, uniform=uniform, span_s=span,
        classes=config.classes,
    )


def rate_workload(trace: RateTrace, config: WorkloadConfig) -> RateWorkload:
    check_mix(config.classes, config.priority_mix)
    server = config.server
    tok_in = np.where(np.isfinite(trace.input_tokens), trace.input_tokens, server.default_input_tokens)
    tok_out = np.where(np.isfinite(trace.output_tokens), trace.output_tokens, server.default_output_tokens)
    service = server.service_s(tok_in, tok_out)
    if config.scale is not None:
        scale = config.scale
    else:
        target = config.peak_replicas * server.concurrency * config.peak_utilization
        scale = target / max(float((trace.rate_per_s * service).max()), 1e-9)
    return RateWorkload(
        name=trace.name, scale=scale, window_s=trace.window_s, rate_per_s=trace.rate_per_s * scale,
        client_rate_per_s=trace.client_rate_per_s * scale, client_cv2=scaled_cv2(trace.client_cv2, scale),
        service_s=service, output_tokens=tok_out, priority_mix=np.array(config.priority_mix, dtype=float),
        span_s=trace.span_s, classes=config.classes,
    )


def scaled_cv2(cv2: np.ndarray, scale: float) -> np.ndarray:
    """A client's count dispersion after scaling its rate. Below 1 the scale keeps each request with
    probability p = scale (thinning): a count N becomes Binomial(N, p), so the index of dispersion ca2
    becomes p ca2 + 1 - p. Above 1 it superposes independent copies, which keeps the dispersion."""
    if scale >= 1.0:
        return cv2
    return scale * cv2 + (1.0 - scale)


def build(trace: RequestTrace | RateTrace, config: WorkloadConfig) -> RequestWorkload | RateWorkload:
    if isinstance(trace, RequestTrace):
        return request_workload(trace, config)
    return rate_workload(trace, config)
