"""Shared fixtures."""

import pytest

from policies import PolicySpec


@pytest.fixture
def spec() -> PolicySpec:
    return PolicySpec(min_replicas=1, max_replicas=100, replica_concurrency=8, slo_queue_wait_s=2.0)
