"""Recorded signals for dry-run replay: read, validate, and turn into one `Signals` per tick.

Accepted inputs (signal names are the fields of `policies.Signals`, plus cluster fields):
- CSV with a header: a time column `t_s` (seconds) or `timestamp` (unix seconds or ISO 8601), then any of
  the signal columns below; an empty cell is a missing sample.
- JSONL: one object per line with the same keys.
- Prometheus `query_range` exports (`{"status": "success", "data": {"resultType": "matrix", ...}}`, what
  `curl .../api/v1/query_range` returns): either a folder of `<signal>.json` files, or one JSON object
  keyed by signal name whose values are such responses. Several series in one result are combined per
  signal (summed for counts and rates, max for p99, min for headroom, mean for service time).

At tick t every signal takes its latest sample at or before t, with that sample's time, so a gap in the
recording shows up to the policy as a stale signal, exactly as it would live. Bad input raises
`RecordingError` naming the file, the line (or series) and the field: a file that is not UTF-8 text, and a
recording spanning more than `autoscaler.limits.MAX_SPAN_S`, too.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from autoscaler.errors import RecordingError
from autoscaler.limits import check_span
from autoscaler.promrange import number, query_range, time_of
from autoscaler.textfile import lines, read_text
from autoscaler.traces import iter_json_objects
from policies.types import SAMPLE_SIGNALS, ClusterState, Sample, Signals

CLUSTER_FIELDS = ("spec_replicas", "ready_replicas", "starting_replicas", "warm_slots_ready", "unschedulable_pods")
PRIORITY_PREFIX = "arrival_rate_"  # arrival_rate_<priority>, e.g. arrival_rate_sheddable
KNOWN = set(SAMPLE_SIGNALS) | set(CLUSTER_FIELDS)


@dataclass
class Recording:
    """Per signal: sorted sample times and values."""

    source: str
    series: dict[str, tuple[list[float], list[float]]]

    @property
    def start_s(self) -> float:
        return min(times[0] for times, _ in self.series.values())

    @property
    def end_s(self) -> float:
        return max(times[-1] for times, _ in self.series.values())

    def step_s(self) -> float:
        """The recording's own resolution (median gap of its densest signal)."""
        best = math.inf
        for times, _ in self.series.values():
            gaps = sorted(b - a for a, b in zip(times, times[1:]) if b > a)
            if gaps:
                best = min(best, gaps[len(gaps) // 2])
        return best if math.isfinite(best) else 15.0

    def latest(self, name: str, t: float) -> Sample | None:
        entry = self.series.get(name)
        if entry is None:
            return None
        times, values = entry
        i = bisect.bisect_right(times, t) - 1
        return Sample(values[i], times[i]) if i >= 0 else None

    def signals_at(self, t: float) -> Signals:
        samples = {name: self.latest(name, t) for name in SAMPLE_SIGNALS}
        cluster = None
        spec = self.latest("spec_replicas", t)
        if spec is not None and math.isfinite(spec.value):
            def count(name: str) -> int:
                s = self.latest(name, t)
                return int(s.value) if s is not None and math.isfinite(s.value) else 0

            ready = self.latest("ready_replicas", t)
            cluster = ClusterState(
                spec_replicas=int(spec.value),
                ready_replicas=(int(ready.value) if ready is not None and math.isfinite(ready.value)
                                else int(spec.value)),
                starting_replicas=count("starting_replicas"),
                warm_slots_ready=count("warm_slots_ready"),
                unschedulable_pods=count("unschedulable_pods"),
                at_s=spec.at_s,
            )
        return Signals(cluster=cluster, arrival_rate_by_priority=self.by_priority(t), **samples)

    def priorities(self) -> list[str]:
        """The classes with a per-priority arrival series (`arrival_rate_<class>`)."""
        return [name[len(PRIORITY_PREFIX):] for name in self.series
                if name.startswith(PRIORITY_PREFIX) and name not in KNOWN]

    def by_priority(self, t: float) -> dict[str, float]:
        """The latest finite per-priority arrival rates at `t`."""
        rates = {}
        for name in self.priorities():
            s = self.latest(PRIORITY_PREFIX + name, t)
            if s is not None and math.isfinite(s.value):
                rates[name] = s.value
        return rates


def _check_name(name: str, where: str) -> None:
    if name not in KNOWN and not name.startswith(PRIORITY_PREFIX):
        allowed = ", ".join(sorted(KNOWN)) + f", {PRIORITY_PREFIX}<priority>"
        raise RecordingError(f"{where}: unknown signal {name!r}; known: {allowed}")


def _from_rows(source: str, rows) -> Recording:
    series: dict[str, tuple[list[float], list[float]]] = {}
    last_t = -math.inf
    for where, row in rows:
        time_field = "t_s" if "t_s" in row else "timestamp"
        if time_field not in row:
            raise RecordingError(f"{where}: no time field (expected 't_s' or 'timestamp')")
        t = time_of(row[time_field], where, time_field)
        if t < last_t:
            raise RecordingError(f"{where}: field {time_field!r}: time goes backwards ({t} < {last_t})")
        last_t = t
        for name, raw in row.items():
            if name in ("t_s", "timestamp"):
                continue
            _check_name(name, where)
            value = number(raw, where, name)
            if value is not None:
                times, values = series.setdefault(name, ([], []))
                times.append(t)
                values.append(value)
    if not series:
        raise RecordingError(f"{source}: no samples")
    return _checked(Recording(source, series))


def _checked(recording: Recording) -> Recording:
    check_span(start_s=recording.start_s, end_s=recording.end_s, source=recording.source, error=RecordingError)
    return recording


def read_csv(path: Path) -> Recording:
    reader = csv.DictReader(lines(path, RecordingError))
    if not reader.fieldnames:
        raise RecordingError(f"{path}:1: empty file, expected a header")

    def rows():
        for line, row in enumerate(reader, start=2):
            if None in row:
                raise RecordingError(f"{path}:{line}: more fields than the header has")
            yield f"{path}:{line}", row

    return _from_rows(str(path), rows())


def read_jsonl(path: Path) -> Recording:
    rows = ((f"{path}:{line}", row) for line, row in iter_json_objects(path, RecordingError))
    return _from_rows(str(path), rows)


def read_prometheus(path: Path) -> Recording:
    bodies: dict[str, tuple[str, object]] = {}
    if path.is_dir():
        for file in sorted(path.glob("*.json")):
            try:
                bodies[file.stem] = (str(file), json.loads(read_text(file, RecordingError)))
            except json.JSONDecodeError as exc:
                raise RecordingError(f"{file}:{exc.lineno}: not JSON: {exc.msg}") from None
    else:
        try:
            document = json.loads(read_text(path, RecordingError))
        except json.JSONDecodeError as exc:
            raise RecordingError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
        if not isinstance(document, dict):
            raise RecordingError(f"{path}: expected an object keyed by signal name")
        bodies = {name: (f"{path}: signal {name!r}", body) for name, body in document.items()}
    series = {}
    for name, (where, body) in bodies.items():
        _check_name(name, where)
        times, values = query_range(name, body, where)
        if times:
            series[name] = (times, values)
    if not series:
        raise RecordingError(f"{path}: no samples in any signal")
    return _checked(Recording(str(path), series))


def read_recording(path: str | Path, fmt: str = "auto") -> Recording:
    path = Path(path)
    if not path.exists():
        raise RecordingError(f"{path}: no such file or folder")
    if fmt == "auto":
        if path.is_dir() or path.suffix == ".json":
            fmt = "prometheus"
        elif path.suffix == ".jsonl":
            fmt = "jsonl"
        elif path.suffix == ".csv":
            fmt = "csv"
        else:
            raise RecordingError(f"{path}: cannot tell the format; pass --format csv, jsonl or prometheus")
    readers = {"csv": read_csv, "jsonl": read_jsonl, "prometheus": read_prometheus}
    if fmt not in readers:
        raise RecordingError(f"unknown format {fmt!r}; choose csv, jsonl or prometheus")
    return readers[fmt](path)
