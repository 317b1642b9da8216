"""A Prometheus `query_range` answer read into one signal's (times, values), checked field by field.

`autoscaler replay` reads recordings with it, and `autoscaler record` checks every answer with it before
writing, so what record writes replay reads. Several series in one result are combined per signal: summed
for counts and rates, max for p99, min for headroom, mean for service time. Bad input raises
`RecordingError` naming where (the file or URL, the series and point) and the field.
"""

from __future__ import annotations

from autoscaler.errors import RecordingError
from autoscaler.times import parse_time

_COMBINE = {"p99_latency_s": max, "gpu_memory_headroom_ratio": min, "service_time_s": lambda v: sum(v) / len(v)}


def number(text, where: str, field: str) -> float | None:
    if text is None or (isinstance(text, str) and text.strip() == ""):
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise RecordingError(f"{where}: field {field!r}: not a number: {text!r}") from None
    return value  # NaN and Inf are kept: the policy reports them as unusable, never as zero


def time_of(text, where: str, field: str) -> float:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise RecordingError(f"{where}: field {field!r}: {exc}") from None


def query_range(name: str, body, where: str) -> tuple[list[float], list[float]]:
    """One signal from a Prometheus query_range response; several series are combined."""
    if not isinstance(body, dict) or body.get("status") != "success":
        raise RecordingError(f"{where}: field 'status': expected a successful query_range response")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise RecordingError(f"{where}: field 'data.resultType': expected 'matrix' (a query_range result)")
    result = data.get("result")
    if not isinstance(result, list):
        raise RecordingError(f"{where}: field 'data.result': expected a list of series")
    merged: dict[float, list[float]] = {}
    for index, series in enumerate(result):
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(values, list):
            raise RecordingError(f"{where}: series {index}: field 'values': expected [[time, \"value\"], ...]")
        for point, pair in enumerate(values):
            if not isinstance(pair, list) or len(pair) != 2:
                raise RecordingError(f"{where}: series {index} point {point}: field 'values': expected [time, value]")
            t = time_of(pair[0], f"{where}: series {index} point {point}", "time")
            v = number(pair[1], f"{where}: series {index} point {point}", "value")
            if v is not None:
                merged.setdefault(t, []).append(v)
    combine = _COMBINE.get(name, sum)
    times = sorted(merged)
    return times, [float(combine(merged[t])) for t in times]
