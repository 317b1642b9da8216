"""Demand as the preflight analysis reads it: one row per tick, from a recording or a trace.

Per tick: the arrival rate, the mean time a request holds a slot, the concurrency (in-flight requests:
measured when a recording has it, else Little's law, rate x service time), the replicas the demand needs
at the SLO (the policy's queueing model: Erlang C slots / slots per replica), the replicas that were
loaded (a recording's ready replicas; none for a trace) and each priority class's share. A trace also
gives every request's service time and tokens (for the duration variance); a recording only the mean.

Traces are read as the benchmark reads them (`autoscaler.sim.workload.build`: rate traces spread over
ticks with each client's burstiness), at scale 1 unless `scale` or `peak_replicas` says otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autoscaler.errors import ConfigError, RecordingError, TraceError
from autoscaler.limits import check_ticks
from autoscaler.replay.recording import Recording, read_recording
from autoscaler.sim.ticks import replicas_for_rates, tick_demand
from autoscaler.sim.workload import RequestWorkload, WorkloadConfig, build
from autoscaler.traces import read_trace
from policies import PolicySpec


@dataclass
class Demand:
    name: str
    source: str  # "recording" or "trace"
    tick_s: float
    rate: np.ndarray  # req/s per tick
    service_s: np.ndarray  # mean slot time per tick
    concurrency: np.ndarray  # in-flight requests per tick
    needed: np.ndarray  # replicas the demand needs at the SLO, per tick
    loaded: np.ndarray | None  # replicas that were up (recording), per tick
    class_share: dict[str, float]  # share of requests per priority class
    class_source: str
    request_service_s: np.ndarray | None = None  # per request (traces)
    request_tokens: dict[str, np.ndarray] = field(default_factory=dict)
    startup_s: list[float] = field(default_factory=list)  # observed pod start-ups (recording)
    start_s: float = 0.0  # time of the first tick (unix seconds for recordings, 0 for traces)

    @property
    def span_s(self) -> float:
        return len(self.rate) * self.tick_s


def replicas_needed(spec: PolicySpec, rate: np.ndarray, service: np.ndarray) -> np.ndarray:
    """The replicas each tick's demand needs at the SLO: the policy's rule, service times of at least 1 ms."""
    return replicas_for_rates(spec, rate, np.maximum(service, 1e-3))


def from_trace(path: str, spec: PolicySpec, *, scale: float | None, peak_replicas: int | None) -> Demand:
    from autoscaler.sim.workload import CLASSES, DEFAULT_MIX, ServerModel

    trace = read_trace(path)
    check_ticks(span_s=trace.span_s, tick_s=spec.tick_s, source=path, error=TraceError)
    server = ServerModel(concurrency=spec.replica_concurrency)
    if scale is None and peak_replicas is None:
        scale = 1.0
    config = WorkloadConfig(peak_replicas=peak_replicas or 40, scale=scale, server=server)
    workload = build(trace, config)
    tick = spec.tick_s
    rate, service = tick_demand(workload, tick)
    tokens: dict[str, np.ndarray] = {}
    per_request = None
    if isinstance(workload, RequestWorkload):
        per_request = workload.service_s
        tokens = {"input": trace.input_tokens, "output": trace.output_tokens}
    share = dict(zip(CLASSES, (x / sum(DEFAULT_MIX) for x in DEFAULT_MIX)))
    return Demand(
        name=workload.name, source="trace", tick_s=tick, rate=rate, service_s=service, concurrency=rate * service,
        needed=replicas_needed(spec, rate, service), loaded=None, class_share=share,
        class_source="not in the data: the benchmark's 20/50/30 assignment by request hash",
        request_service_s=per_request, request_tokens=tokens,
    )


def _series(recording: Recording, name: str, times: np.ndarray, max_age_s: float) -> np.ndarray | None:
    if name not in recording.series:
        return None
    out = np.full(len(times), np.nan)
    for i, t in enumerate(times):
        sample = recording.latest(name, float(t))
        if sample is not None and t - sample.at_s <= max_age_s and math.isfinite(sample.value):
            out[i] = sample.value
    return out


def from_recording(path: str, fmt: str, spec: PolicySpec) -> Demand:
    from autoscaler.replay.simulated import demand_per_tick

    recording = read_recording(path, fmt)
    tick = spec.tick_s
    check_ticks(span_s=recording.end_s - recording.start_s, tick_s=tick, source=recording.source, error=RecordingError)
    rate, _ = demand_per_tick(recording, tick)
    times = recording.start_s + np.arange(len(rate)) * tick
    age = 2 * tick
    service = _series(recording, "service_time_s", times, age)
    fallback = float(np.nanmedian(service)) if service is not None and np.isfinite(service).any() \
        else spec.initial_service_time_s
    service = np.where(np.isfinite(service), service, fallback) if service is not None else np.full(len(rate), fallback)
    in_flight = _series(recording, "in_flight", times, age)
    concurrency = (np.where(np.isfinite(in_flight), in_flight, rate * service) if in_flight is not None
                   else rate * service)
    loaded = _series(recording, "ready_replicas", times, age)
    if loaded is not None:
        loaded = np.where(np.isfinite(loaded), loaded, np.nan)
    classes = recording.priorities()
    totals = {c: float(np.nansum(_series(recording, f"arrival_rate_{c}", times, age))) for c in classes}
    everything = sum(totals.values())
    if everything > 0:
        share, source = {c: v / everything for c, v in totals.items()}, "recorded per-priority arrival rates"
    else:
        share, source = {}, "no per-priority series in the recording"
    startup = []
    if "pod_startup_s" in recording.series:
        startup = [v for v in recording.series["pod_startup_s"][1] if math.isfinite(v) and v > 0]
    return Demand(
        name=Path(path).name, source="recording", tick_s=tick, rate=rate, service_s=service, concurrency=concurrency,
        needed=replicas_needed(spec, rate, service), loaded=loaded, class_share=share, class_source=source,
        startup_s=startup, start_s=recording.start_s,
    )


def load(path: str, fmt: str, spec: PolicySpec, *, scale: float | None = None,
         peak_replicas: int | None = None) -> Demand:
    if fmt == "trace" or (fmt == "auto" and _looks_like_trace(Path(path))):
        return from_trace(path, spec, scale=scale, peak_replicas=peak_replicas)
    if scale is not None or peak_replicas is not None:
        raise ConfigError("--scale and --peak-replicas apply to traces; a recording is analyzed as recorded")
    return from_recording(path, fmt, spec)


def _looks_like_trace(path: Path) -> bool:
    """A ServeGen folder, a Mooncake .jsonl or an Azure .csv (by its header), rather than a recording."""
    if path.is_dir():
        if any(path.glob("chunk-*-trace.csv")):
            return True
        files = sorted(path.glob("*.csv")) + sorted(path.glob("*.jsonl"))
        return len(files) == 1 and _looks_like_trace(files[0])
    if path.suffix == ".csv":  # bytes: a file that is not text is the reader's to report, with its line
        with path.open("rb") as handle:
            return handle.readline().strip().startswith(b"TIMESTAMP")
    if path.suffix == ".jsonl":
        with path.open("rb") as handle:
            return b'"input_length"' in handle.readline()
    return False
