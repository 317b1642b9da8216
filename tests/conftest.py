"""Shared fixtures."""

import itertools
import time

import pytest

from policies import PolicySpec


@pytest.fixture
def spec() -> PolicySpec:
    return PolicySpec(min_replicas=1, max_replicas=100, replica_concurrency=8, slo_queue_wait_s=2.0)


@pytest.fixture(scope="session")
def cluster():
    """A real control plane with scheduler, controller-manager and kwok, and three fake 8-GPU nodes."""
    from loadtest.kube.controlplane import control_plane, gpu_node

    with control_plane(with_pods=True) as cp:
        for i in range(3):
            status, body = cp.request("POST", "/api/v1/nodes", gpu_node(f"gpu-{i}"))
            assert status == 201, body
        yield cp


_names = itertools.count()


@pytest.fixture
def namespace(cluster):
    """A fresh namespace per test on the shared control plane, deleted afterwards so its pods free their GPUs."""
    name = f"t{next(_names)}-{int(time.time() * 1000) % 100000}"
    status, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    yield name
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")
