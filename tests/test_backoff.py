"""API errors become the edge error kinds; only transient ones are retried, with growing delays."""

import asyncio

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from autoscaler.clock import ManualClock
from autoscaler.errors import PermanentError, TransientError
from autoscaler.kube.client import translate, with_backoff


@pytest.mark.parametrize("status,cls,kind", [
    (409, TransientError, "conflict"),
    (429, TransientError, "apiserver_unavailable"),
    (503, TransientError, "apiserver_unavailable"),
    (403, PermanentError, "forbidden"),
    (404, PermanentError, "not_found"),
    (422, PermanentError, "apiserver_rejected"),
])
def test_api_errors_map_to_kinds(status, cls, kind):
    error = translate(ApiException(status=status, reason="x"), "scale model")
    assert isinstance(error, cls) and error.kind == kind and str(status) in str(error)


class RecordingClock(ManualClock):
    """A manual clock whose sleeps pass at once, remembering how long each was."""

    def __init__(self):
        super().__init__()
        self.sleeps = []

    async def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.t += seconds


def test_transient_errors_are_retried_with_growing_delays():
    clock, calls = RecordingClock(), []

    async def flaky():
        calls.append(clock.now())
        if len(calls) < 3:
            raise TransientError("503", kind="apiserver_unavailable")
        return "done"

    assert asyncio.run(with_backoff(flaky, clock=clock, first_delay_s=0.2)) == "done"
    assert clock.sleeps == [0.2, 0.4] and calls == pytest.approx([0.0, 0.2, 0.6])


def test_permanent_errors_are_not_retried_and_attempts_are_bounded():
    clock, calls = RecordingClock(), []

    async def forbidden():
        calls.append(1)
        raise PermanentError("403", kind="forbidden")

    with pytest.raises(PermanentError):
        asyncio.run(with_backoff(forbidden, clock=clock))
    assert len(calls) == 1 and clock.sleeps == []

    async def always_down():
        calls.append(1)
        raise TransientError("503", kind="apiserver_unavailable")

    calls.clear()
    with pytest.raises(TransientError):
        asyncio.run(with_backoff(always_down, clock=clock, attempts=4, max_delay_s=0.5))
    assert len(calls) == 4 and clock.sleeps == [0.2, 0.4, 0.5]
