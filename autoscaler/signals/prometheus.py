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
from typing import Awaitable, Hashable, Mapping, TypeVar

import aiohttp

from autoscaler.errors import PermanentError, TransientError
from policies.types import Sample

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class QueryResult:
    samples: dict[str, Sample] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)


def vector_series(body: object, query: str) -> list:
    """The series of an instant-query response (a scalar as one series), checked for shape."""
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
    return result


def series_sample(series: object, query: str) -> Sample:
    """One series' (time, value) pair as a Sample ("NaN" stays NaN)."""
    try:
        t, v = series["value"]  # type: ignore[index]
        return Sample(float(v), float(t))
    except (KeyError, TypeError, ValueError):
        raise PermanentError(f"query {query!r}: malformed sample {series!r}", kind="bad_response") from None


def parse_vector(body: object, query: str) -> Sample | None:
    """An instant-query response -> one Sample, or None when no series matched."""
    result = vector_series(body, query)
    if not result:
        return None
    total, at = 0.0, -math.inf
    for series in result:
        sample = series_sample(series, query)
        total += sample.value
        at = max(at, sample.at_s)
    return Sample(total, at)


async def instant_query(session: aiohttp.ClientSession, url: str, query: str, *, now: float,
                        timeout: aiohttp.ClientTimeout) -> object:
    """The JSON body of one instant query at `now` (`url` ends in /api/v1/query); HTTP and network failures
    become the edge error kinds."""
    try:
        async with session.get(url, params={"query": query, "time": f"{now:.3f}"}, timeout=timeout) as response:
            if response.status >= 500 or response.status == 429:
                raise TransientError(f"query {query!r}: HTTP {response.status}", kind="prometheus_unavailable")
            try:
                body = await response.json(content_type=None)
            except (aiohttp.ContentTypeError, ValueError):
                raise PermanentError(f"query {query!r}: HTTP {response.status}, not JSON",
                                     kind="bad_response") from None
            if response.status >= 400 and (not isinstance(body, dict) or body.get("status") != "error"):
                raise PermanentError(f"query {query!r}: HTTP {response.status}", kind="query_error")
            return body
    except asyncio.TimeoutError:
        raise TransientError(f"query {query!r}: timed out", kind="prometheus_timeout") from None
    except aiohttp.ClientError as exc:
        raise TransientError(f"query {query!r}: {exc}", kind="prometheus_unavailable") from None


def query_url(base: str) -> str:
    return base.rstrip("/") + "/api/v1/query"


class PrometheusSource:
    def __init__(self, session: aiohttp.ClientSession, url: str, queries: dict[str, str], *, timeout_s: float) -> None:
        self.session = session
        self.url = query_url(url)
        self.queries = queries
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _one(self, query: str, now: float) -> Sample | None:
        body = await instant_query(self.session, self.url, query, now=now, timeout=self.timeout)
        return parse_vector(body, query)

    async def collect(self, now: float) -> QueryResult:
        samples, errors = await gather_named({n: self._one(q, now) for n, q in self.queries.items()})
        return QueryResult(samples={n: s for n, s in samples.items() if s is not None}, errors=errors)


async def gather_named(calls: Mapping[K, Awaitable[T]]) -> tuple[dict[K, T], dict[K, Exception]]:
    """Await `calls` concurrently: (answers, errors) by name. Cancellation and non-Exception errors propagate."""
    names = list(calls)
    results = await asyncio.gather(*(calls[n] for n in names), return_exceptions=True)
    answers: dict[K, T] = {}
    errors: dict[K, Exception] = {}
    for name, answer in zip(names, results):
        if isinstance(answer, asyncio.CancelledError) or (isinstance(answer, BaseException)
                                                          and not isinstance(answer, Exception)):
            raise answer
        if isinstance(answer, Exception):
            errors[name] = answer
        else:
            answers[name] = answer
    return answers, errors
