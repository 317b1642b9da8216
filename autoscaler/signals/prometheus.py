"""PromQL instant queries for the loop, one per signal, concurrently, against one Prometheus.

A query that returns no series gives no sample (the signal is missing, and the policy holds rather than
read it as zero); several series are summed; "NaN" comes back as NaN, which the policy drops. The sample
time is the evaluation time Prometheus reports: a dead scrape target makes its series vanish (staleness
markers), which the policy sees as a missing signal.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import aiohttp

from autoscaler.errors import PermanentError, TransientError
from policies.types import Sample


@dataclass
class QueryResult:
    samples: dict[str, Sample] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)


def parse_vector(body: object, query: str) -> Sample | None:
    """An instant-query response -> one Sample, or None when no series matched."""
    if not isinstance(body, dict):
        raise PermanentError(f"query {query!r}: response is not a JSON object", kind="bad_response")
    if body.get("status") != "success":
        raise PermanentError(f"query {query!r}: {body.get('errorType')}: {body.get('error')}", kind="query_error")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
        raise PermanentError(f"query {query!r}: expected a vector result", kind="bad_response")
    result = data.get("result")
    if data["resultType"] == "scalar":
        result = [{"value": result}]
    if not isinstance(result, list):
        raise PermanentError(f"query {query!r}: 'result' is not a list", kind="bad_response")
    if not result:
        return None
    total, at = 0.0, -math.inf
    for series in result:
        try:
            t, v = series["value"]
            total += float(v)
            at = max(at, float(t))
        except (KeyError, TypeError, ValueError):
            raise PermanentError(f"query {query!r}: malformed sample {series!r}", kind="bad_response") from None
    return Sample(total, at)


class PrometheusSource:
    def __init__(self, session: aiohttp.ClientSession, url: str, queries: dict[str, str], *, timeout_s: float) -> None:
        self.session = session
        self.url = url.rstrip("/") + "/api/v1/query"
        self.queries = queries
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _one(self, query: str, now: float) -> Sample | None:
        try:
            async with self.session.get(self.url, params={"query": query, "time": f"{now:.3f}"},
                                        timeout=self.timeout) as response:
                if response.status >= 500 or response.status == 429:
                    raise TransientError(f"query {query!r}: HTTP {response.status}", kind="prometheus_unavailable")
                try:
                    body = await response.json(content_type=None)
                except (aiohttp.ContentTypeError, ValueError):
                    raise PermanentError(
                        f"query {query!r}: HTTP {response.status}, not JSON", kind="bad_response"
                    ) from None
                if response.status >= 400 and body.get("status") != "error":
                    raise PermanentError(f"query {query!r}: HTTP {response.status}", kind="query_error")
                return parse_vector(body, query)
        except asyncio.TimeoutError:
            raise TransientError(f"query {query!r}: timed out", kind="prometheus_timeout") from None
        except aiohttp.ClientError as exc:
            raise TransientError(f"query {query!r}: {exc}", kind="prometheus_unavailable") from None

    async def collect(self, now: float) -> QueryResult:
        names = list(self.queries)
        answers = await asyncio.gather(*(self._one(self.queries[n], now) for n in names), return_exceptions=True)
        result = QueryResult()
        for name, answer in zip(names, answers):
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                result.errors[name] = answer
            elif answer is not None:
                result.samples[name] = answer
        return result
