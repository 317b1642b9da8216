"""The few error kinds at the edges, and what to do about each.

- `TransientError`: the server may answer next time (timeouts, connection refused, HTTP 5xx, 409
  conflicts, 429). Retried with backoff where a retry is useful; otherwise the tick holds.
- `PermanentError`: retrying will not help (HTTP 4xx other than 409/429, malformed answers, forbidden).
  Logged with the reason; the tick holds.
Both carry a `kind` used as the label of the error metric. `asyncio.CancelledError` is never caught.
"""

from __future__ import annotations


class EdgeError(Exception):
    kind = "error"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class TransientError(EdgeError):
    kind = "transient"


class PermanentError(EdgeError):
    kind = "permanent"
