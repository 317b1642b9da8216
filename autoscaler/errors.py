"""The one error family of the runtime shell, and what to do about each member.

Bad input (exit status 2 from the CLI, nothing started or written):
- `ConfigError`: a config file, policy file, flag or environment variable that cannot be used.
- `RecordingError`: a recording (`autoscaler replay`) that cannot be read.
- `TraceError`: a trace file that cannot be read.
Each message names the file, line or field and the value. `autoscaler record` counts a server that does not
answer as Prometheus does (a JSON array, HTML) as a wrong URL: a `ConfigError` naming it. Inputs beyond the
caps of `autoscaler.limits` are bad input too. docs/faults.md lists what is refused and how.

The edges at run time (`EdgeError`, exit status 1 from a one-shot command; the control loop holds the tick):
- `TransientError`: the server may answer next time (timeouts, connection refused, HTTP 5xx, 409 conflicts,
  429). Retried with backoff where a retry is useful; otherwise the tick holds.
- `PermanentError`: retrying will not help (HTTP 4xx other than 409/429, malformed answers, forbidden).
  Logged with the reason; the tick holds.
Edge errors carry a `kind` used as the label of the error metric. `asyncio.CancelledError` is never caught.
"""

from __future__ import annotations


class AutoscalerError(Exception):
    """Every error the shell raises on purpose; the CLI catches this one type."""

    kind = "error"
    exit_status = 1

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class InputError(AutoscalerError, ValueError):
    """Input that cannot be used; the message says where and why."""

    exit_status = 2


class ConfigError(InputError):
    kind = "config"


class RecordingError(InputError):
    kind = "recording"


class TraceError(InputError):
    kind = "trace"


class EdgeError(AutoscalerError):
    """A server at the edge (Prometheus, the apiserver, a pod) did not give a usable answer."""


class TransientError(EdgeError):
    kind = "transient"


class PermanentError(EdgeError):
    kind = "permanent"
