"""The one parser of points in time for the shell: flags, recordings and Kubernetes timestamps.

Accepted: a number or a string of unix seconds; a `datetime`; ISO 8601 text (`Z` or an offset; without one
it is UTC); and, where the caller passes `now`, `now` and `now-<N>[smhd]` (e.g. `now-6h`). Anything else
raises `ValueError` saying what was expected; callers turn it into their own error with the file, line or
flag it came from."""

from __future__ import annotations

import math
from datetime import datetime, timezone

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _relative(text: str, now: float) -> float | None:
    if not text.startswith("now"):
        return None
    rest = text[3:]
    if not rest:
        return now
    if rest[0] == "-" and rest[-1:] in _UNITS:
        try:
            return now - float(rest[1:-1]) * _UNITS[rest[-1]]
        except ValueError:
            pass
    raise ValueError(f"{text!r}: expected now or now-<N>[smhd]")


def parse_time(value: object, *, now: float | None = None) -> float:
    """Unix seconds of `value` (see the module docstring); `now` enables the relative forms."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: not a time")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{value!r}: not a finite time")
        return float(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    if not isinstance(value, str):
        raise ValueError(f"{value!r}: not a time")
    text = value.strip()
    if now is not None:
        relative = _relative(text, now)
        if relative is not None:
            return relative
    try:
        return parse_time(float(text))
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        forms = "unix seconds or ISO 8601" + (", now or now-<N>[smhd]" if now is not None else "")
        raise ValueError(f"{value!r}: expected {forms}") from None
    return parse_time(stamp)


def micro_time(at_s: float) -> str:
    """RFC 3339 with microseconds, as Kubernetes MicroTime fields require."""
    return datetime.fromtimestamp(at_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(at_s: float) -> str:
    """RFC 3339 to the second, as Kubernetes Time fields take it."""
    return datetime.fromtimestamp(at_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
