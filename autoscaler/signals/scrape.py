"""Direct scrape of the model pods' /metrics, the alternative to Prometheus (no Prometheus needed).

Each tick, every ready pod of the target is scraped concurrently and the preset's metrics are combined:
queue and in-flight gauges summed, KV-cache usage averaged (headroom = 1 - usage), the request counter
kept as one monotonic counter for the policy (which derives the rate), the mean slot time from the
inference-time histogram's sum/count deltas.

Safety: if any pod cannot be scraped, the summed signals are withheld for that tick (a partial sum would
look like less demand); the policy sees them missing and holds. A pod that appears starts from a baseline
(its past requests are not demand now); a pod that disappears keeps what it counted. A pod whose counter
went down restarted: the combined counter is reported restarting from zero, which the policy recognises
as a counter reset (that tick's rate unknown, never negative or zero), and counting resumes from there.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.errors import PermanentError, TransientError
from autoscaler.kube.client import Kube
from autoscaler.kube.cluster import label_selector
from autoscaler.kube.pods import pod_facts
from autoscaler.signals.prometheus import QueryResult
from policies.types import Sample


class PodEndpoints(Protocol):
    async def endpoints(self) -> dict[str, str]:
        """pod name -> base URL of its metrics endpoint."""
        ...


class KubePodEndpoints:
    """Ready pods of the target (its selector) and their pod IPs."""

    def __init__(self, kube: Kube, *, namespace: str, kind: str, name: str, port: int, path: str) -> None:
        self.kube, self.namespace, self.kind, self.name = kube, namespace, kind, name
        self.port, self.path = port, path

    async def endpoints(self) -> dict[str, str]:
        read = (self.kube.apps.read_namespaced_deployment if self.kind == "Deployment"
                else self.kube.apps.read_namespaced_stateful_set)
        workload = await self.kube.call(f"read {self.kind} {self.name}", read, self.name, self.namespace)
        selector = label_selector(workload.spec.selector.match_labels or {})
        pods = await self.kube.call("list pods", self.kube.core.list_namespaced_pod, self.namespace,
                                    label_selector=selector)
        out = {}
        for pod in map(pod_facts, pods.items):
            if pod.ready and pod.ip and not pod.deleting:
                out[pod.name] = f"http://{pod.ip}:{self.port}{self.path}"
        return out


class Refused(TransientError):
    """The pod refused the connection: nothing listens at its address (a server not started yet, or gone), so
    it serves no request."""


async def fetch_metrics(session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> dict[str, float]:
    """One pod's /metrics, as sample name -> value summed over label sets."""
    try:
        async with session.get(url, timeout=timeout) as response:
            if response.status != 200:
                raise TransientError(f"scrape {url}: HTTP {response.status}", kind="scrape_failed")
            text = await response.text()
    except asyncio.TimeoutError:
        raise TransientError(f"scrape {url}: timed out", kind="scrape_failed") from None
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, ConnectionRefusedError):
            raise Refused(f"scrape {url}: connection refused", kind="scrape_failed") from None
        raise TransientError(f"scrape {url}: {exc}", kind="scrape_failed") from None
    except aiohttp.ClientError as exc:
        raise TransientError(f"scrape {url}: {exc}", kind="scrape_failed") from None
    try:
        return _read(text)
    except ValueError as exc:
        raise PermanentError(f"scrape {url}: not Prometheus text: {exc}", kind="bad_response") from None


def _read(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets, for one pod."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


class PodInFlight:
    """Requests in flight per pod, read from each pod's /metrics on demand (for the order in which a
    scale-down removes pods, `autoscaler.kube.deletion`). A pod that cannot be read, or lacks the gauge, is
    left out: unknown, never zero."""

    def __init__(self, session: aiohttp.ClientSession, metric: str, *, port: int, path: str, timeout_s: float) -> None:
        self.session, self.metric, self.port, self.path = session, metric, port, path
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def in_flight(self, pods: dict[str, str]) -> dict[str, float]:
        """`pods`: pod name -> pod IP."""
        names = list(pods)
        read = await asyncio.gather(*(fetch_metrics(self.session, f"http://{pods[n]}:{self.port}{self.path}",
                                                    self.timeout) for n in names), return_exceptions=True)
        out = {}
        for name, got in zip(names, read):
            if isinstance(got, asyncio.CancelledError):
                raise got
            if isinstance(got, dict) and self.metric in got:
                out[name] = got[self.metric]
        return out


class ScrapeSource:
    def __init__(self, session: aiohttp.ClientSession, endpoints: PodEndpoints, metrics: dict[str, str], *,
                 timeout_s: float) -> None:
        self.session, self.pods, self.metrics = session, endpoints, metrics
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._baseline: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._retired = 0.0
        self._hist: dict[str, tuple[float, float]] = {}

    async def _fetch(self, url: str) -> dict[str, float]:
        return await fetch_metrics(self.session, url, self.timeout)

    def _counter(self, per_pod: dict[str, float]) -> float:
        reset = any(p in self._last and v < self._last[p] for p, v in per_pod.items())
        gone = set(self._last) - set(per_pod)
        for p in gone:
            self._retired += self._last[p] - self._baseline.get(p, 0.0)
            self._baseline.pop(p, None)
        for p, v in per_pod.items():
            self._baseline.setdefault(p, v)
        self._last = dict(per_pod)
        if reset:
            self._retired = 0.0
            self._baseline = dict(per_pod)
            return 0.0
        return self._retired + sum(v - self._baseline[p] for p, v in per_pod.items())

    def _service(self, sums: dict[str, float], counts: dict[str, float]) -> float | None:
        d_sum = d_count = 0.0
        ok = True
        for p in counts:
            before = self._hist.get(p)
            if before is not None:
                if counts[p] < before[1]:
                    ok = False
                d_sum += sums.get(p, 0.0) - before[0]
                d_count += counts[p] - before[1]
        self._hist = {p: (sums.get(p, 0.0), counts[p]) for p in counts}
        return d_sum / d_count if ok and d_count > 0 else None

    async def collect(self, now: float) -> QueryResult:
        result = QueryResult()
        try:
            pods = await self.pods.endpoints()
        except (TransientError, PermanentError) as exc:
            result.errors["pods"] = exc
            return result
        if not pods:
            result.errors["pods"] = TransientError("no ready model pods to scrape", kind="scrape_no_pods")
            return result
        names = list(pods)
        scraped = await asyncio.gather(*(self._fetch(pods[n]) for n in names), return_exceptions=True)
        values: dict[str, dict[str, float]] = {}
        for name, got in zip(names, scraped):
            if isinstance(got, asyncio.CancelledError):
                raise got
            if isinstance(got, Exception):
                result.errors[f"pod {name}"] = got
            else:
                values[name] = got
        if len(values) < len(names):
            return result  # partial: hold rather than under-count
        m = self.metrics

        def per_pod(sample: str) -> dict[str, float] | None:
            found = {p: v[sample] for p, v in values.items() if sample in v}
            return found if len(found) == len(values) else None

        for signal in ("queue_depth", "in_flight"):
            if signal in m and (found := per_pod(m[signal])) is not None:
                result.samples[signal] = Sample(sum(found.values()), now)
        if "kv_usage" in m and (found := per_pod(m["kv_usage"])) is not None:
            result.samples["gpu_memory_headroom_ratio"] = Sample(1.0 - sum(found.values()) / len(found), now)
        if "arrivals_total" in m and (found := per_pod(m["arrivals_total"] + "_total")) is not None:
            result.samples["arrivals_total"] = Sample(self._counter(found), now)
        if "service_sum" in m:
            sums, counts = per_pod(m["service_sum"] + "_sum"), per_pod(m["service_sum"] + "_count")
            if sums is not None and counts is not None:
                service = self._service(sums, counts)
                if service is not None:
                    result.samples["service_time_s"] = Sample(service, now)
        return result
