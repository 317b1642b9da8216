"""`autoscaler record`: export a time range of the configured signals from Prometheus to a file that
`autoscaler replay` reads (one JSON object keyed by signal, each value a query_range response).

Uses prometheus-api-client's range queries. The target's replica counts come from kube-state-metrics when
Prometheus has them (`kube_deployment_spec_replicas`, `kube_deployment_status_replicas_ready`), so a
simulated replay can compare the policy with what actually ran.

Every answer is checked with the reader `autoscaler replay` uses before anything is written, and the file
is written whole or not at all (a temporary file renamed into place). A server that does not answer as
Prometheus does (a JSON array, an object without `data`, HTML) is a wrong URL: a ConfigError naming the URL
and the signal, exit status 2; an unreachable or failing server is a TransientError, exit status 1."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from autoscaler.clock import SystemClock
from autoscaler.config import http_url, load_config
from autoscaler.errors import ConfigError, RecordingError, TransientError
from autoscaler.promrange import query_range
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
    _check_out(out)
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
        except (KeyError, TypeError, ValueError):  # the client indexes answer["data"]["result"] unchecked
            raise ConfigError(f"{url}: not a Prometheus API: its query_range answer for {name!r} is not "
                              "{\"status\": \"success\", \"data\": {\"result\": [...]}}") from None
        document[name] = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        try:
            times, _ = query_range(name, document[name], f"{url}: signal {name!r}")
        except RecordingError as exc:
            raise ConfigError(f"not a Prometheus query_range answer: {exc}") from None
        counts[name] = len(times)
    _write_whole(out, json.dumps(document))
    return counts


def _check_out(out: Path) -> None:
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"--out {out}: the folder {folder} does not exist or is not writable")


def _write_whole(out: Path, text: str) -> None:
    """The file appears whole or not at all: an interrupted write leaves no half recording behind."""
    fd, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(temporary, out)
    except BaseException:
        os.unlink(temporary)
        raise


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
    try:
        url = http_url(url)
    except ValueError as exc:
        raise ConfigError(f"--prometheus-url {url!r}: {exc}") from None
    queries = dict(settings.queries)
    queries.update(replica_queries(settings.target.namespace, settings.target.kind, settings.target.name))
    now = SystemClock().now()  # one reading for both ends: now-1h and now are exactly an hour apart
    start, end = _when(args.start, "--start", now), _when(args.end, "--end", now)
    counts = record(url, queries, start=start, end=end, step_s=args.step_s, out=Path(args.out))
    for name, count in counts.items():
        print(f"{name:<28} {count} points")
    print(f"wrote {args.out}")
    return 0
