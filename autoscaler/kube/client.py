"""The one place that talks to the Kubernetes API.

API errors become the edge error kinds: 409 (conflict), 429 and 5xx are transient, the rest permanent;
network errors and timeouts are transient. `asyncio.CancelledError` passes through untouched."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.clock import Clock, SystemClock
from autoscaler.errors import ConfigError, EdgeError, PermanentError, TransientError
from autoscaler.times import parse_time

T = TypeVar("T")

# Retries of transient API errors: 5 attempts, 0.2 s doubling to at most 3 s (about 2.2 s in all), which
# fits inside one tick's deadline at the default 15-s tick.
BACKOFF_ATTEMPTS = 5
BACKOFF_FIRST_DELAY_S = 0.2
BACKOFF_MAX_DELAY_S = 3.0


def object_time(value: Any) -> float | None:
    """Unix seconds of a timestamp field of an API object (None stays None)."""
    return None if value is None else parse_time(value)


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
    """Typed API groups over one ApiClient, and the clock retries wait on."""

    def __init__(self, api: client.ApiClient, clock: Clock | None = None) -> None:
        self.api = api
        self.clock = clock or SystemClock()
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, clock: Clock | None = None) -> "Kube":
        configuration = client.Configuration()
        if kubeconfig and not os.path.isfile(kubeconfig):
            raise ConfigError(f"kubeconfig {kubeconfig}: no such file")
        try:
            if kubeconfig:
                await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except (config.ConfigException, OSError, TypeError, ValueError) as exc:  # a file that is no kubeconfig
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration (no --kubeconfig)"
            raise ConfigError(f"{where}: {exc}") from exc
        return cls(client.ApiClient(configuration=configuration), clock)

    async def call(self, what: str, fn: Callable[..., Awaitable[T]], *args, **kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - translated into the edge error kinds
            raise translate(exc, what) from exc

    async def close(self) -> None:
        await self.api.close()


async def with_backoff(fn: Callable[[], Awaitable[T]], *, clock: Clock, attempts: int = BACKOFF_ATTEMPTS,
                       first_delay_s: float = BACKOFF_FIRST_DELAY_S, max_delay_s: float = BACKOFF_MAX_DELAY_S) -> T:
    """Retry only transient errors, doubling the delay (waited on `clock`); the last error is raised."""
    delay = first_delay_s
    for attempt in range(attempts):
        try:
            return await fn()
        except TransientError:
            if attempt == attempts - 1:
                raise
            await clock.sleep(delay)
            delay = min(max_delay_s, delay * 2)
    raise AssertionError("unreachable")
