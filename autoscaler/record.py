"""`autoscaler record`: export a time range of the configured signals from Prometheus to a file that
`autoscaler replay` reads (one JSON object keyed by signal, each value a query_range response).

Uses prometheus-api-client's range queries. The target's replica counts come from kube-state-metrics when
Prometheus has them (`kube_deployment_spec_replicas`, `kube_deployment_status_replicas_ready`), so a
simulated replay can compare the policy with what actually ran."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from autoscaler.clock import SystemClock
from autoscaler.config import load_config
from autoscaler.errors import ConfigError, TransientError
from autoscaler.times import parse_time


def replica_queries(namespace: str, kind: str, name: str) -> dict[str, str]:
    resource = "deployment" if kind == "Deployment" else "statefulset"
    selector = f'namespace="{namespace}",{resource}="{name}"'
    return {
        "spec_replicas": f"sum(kube_{resource}_spec_replicas{{{selector}}})",
        "ready_replicas": f"sum(kube_{resource}_status_replicas_ready{{{selector}}})",
    }


def record(url: str, queries: dict[str, str], *, start: float, end: float, step_s: float, out: Path) -> dict[str, int]:
    """Write the recording; returns the number of points per signal."""
    if end <= start:
        raise ConfigError(f"--end ({end:.0f}) must be after --start ({start:.0f})")
    if step_s <= 0:
        raise ConfigError(f"--step-s must be positive, got {step_s}")
    client = PrometheusConnect(url=url, disable_ssl=True)
    start_dt = datetime.fromtimestamp(start, tz=timezone.utc)
    end_dt = datetime.fromtimestamp(end, tz=timezone.utc)
    document, counts = {}, {}
    for name, promql in queries.items():
        try:
            # a bare number of seconds: Prometheus rejects a fractional duration such as "1.5s"
            result = client.custom_query_range(query=promql, start_time=start_dt, end_time=end_dt, step=f"{step_s:g}")
        except (PrometheusApiClientException, OSError) as exc:
            raise TransientError(f"recording {name!r} ({promql}): {exc}", kind="prometheus_unavailable") from None
        document[name] = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        counts[name] = sum(len(series.get("values", [])) for series in result)
    out.write_text(json.dumps(document))
    return counts


def _when(text: str, flag: str, now: float) -> float:
    try:
        return parse_time(text, now=now)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def record_command(args: argparse.Namespace) -> int:
    settings = load_config(args.config)
    url = args.prometheus_url or settings.prometheus.url
    if not url:
        raise ConfigError("record needs prometheus.url in the config or --prometheus-url")
    queries = dict(settings.queries)
    queries.update(replica_queries(settings.target.namespace, settings.target.kind, settings.target.name))
    now = SystemClock().now()  # one reading for both ends: now-1h and now are exactly an hour apart
    start, end = _when(args.start, "--start", now), _when(args.end, "--end", now)
    counts = record(url, queries, start=start, end=end, step_s=args.step_s, out=Path(args.out))
    for name, count in counts.items():
        print(f"{name:<28} {count} points")
    print(f"wrote {args.out}")
    return 0
