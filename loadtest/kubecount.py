"""Requests a client makes to the apiserver, counted at our Kube seam (its ApiClient's REST client).

Each request is counted by (method, path); a watch (the `watch` query parameter) is counted apart, as it is
one long request, not a read per tick."""

from __future__ import annotations

from collections import Counter

from autoscaler.kube.client import Kube


class RequestCounter:
    def __init__(self, kube: Kube) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.watches: Counter[str] = Counter()
        rest = kube.api.rest_client
        real = rest.request

        async def counted(method, url, query_params=None, *args, **kwargs):
            path = url.split("?", 1)[0].split("://", 1)[-1].split("/", 1)[-1]
            if any(k == "watch" and v for k, v in query_params or []):
                self.watches[path] += 1
            else:
                self.requests[(method, "/" + path)] += 1
            return await real(method, url, query_params, *args, **kwargs)

        rest.request = counted

    def reads(self) -> int:
        """GET requests that are no watch: lists and gets."""
        return sum(n for (method, _), n in self.requests.items() if method == "GET")

    def writes(self) -> int:
        return sum(n for (method, _), n in self.requests.items() if method != "GET")

    def reset(self) -> None:
        self.requests.clear()
        self.watches.clear()
