"""The one place that talks to the Kubernetes API.

API errors become the edge error kinds: 409 (conflict), 429 and 5xx are transient, the rest permanent;
network errors and timeouts are transient. `asyncio.CancelledError` passes through untouched."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.errors import EdgeError, PermanentError, TransientError

T = TypeVar("T")


def micro_time(at_s: float) -> str:
    """RFC 3339 with microseconds, as MicroTime fields require."""
    return datetime.fromtimestamp(at_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def translate(exc: Exception, what: str) -> EdgeError:
    if isinstance(exc, ApiException):
        status = exc.status or 0
        reason = f"{what}: HTTP {status} {exc.reason}"
        if status == 409:
            return TransientError(reason, kind="conflict")
        if status == 429 or status >= 500:
            return TransientError(reason, kind="apiserver_unavailable")
        if status == 403:
            return PermanentError(reason, kind="forbidden")
        if status == 404:
            return PermanentError(reason, kind="not_found")
        return PermanentError(reason, kind="apiserver_rejected")
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ClientError, OSError)):
        return TransientError(f"{what}: {exc!r}", kind="apiserver_unavailable")
    raise exc


class Kube:
    """Typed API groups over one ApiClient."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> "Kube":
        configuration = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
        return cls(client.ApiClient(configuration=configuration))

    async def call(self, what: str, fn: Callable[..., Awaitable[T]], *args, **kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - translated into the edge error kinds
            raise translate(exc, what) from exc

    async def close(self) -> None:
        await self.api.close()


async def with_backoff(fn: Callable[[], Awaitable[T]], *, attempts: int = 5, first_delay_s: float = 0.2,
                       max_delay_s: float = 3.0) -> T:
    """Retry only transient errors, doubling the delay; the last error is raised."""
    delay = first_delay_s
    for attempt in range(attempts):
        try:
            return await fn()
        except TransientError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(max_delay_s, delay * 2)
    raise AssertionError("unreachable")
