"""Quantities and a pod's effective requests, as the scheduler counts them."""

from decimal import Decimal

import pytest

from autoscaler.kube.quantity import effective_resources, format_quantity, parse_quantity


@pytest.mark.parametrize("text,value", [("1", 1), ("500m", Decimal("0.5")), ("64Gi", 64 * 2**30), ("2k", 2000),
                                        ("1e3", 1000), ("1.5", Decimal("1.5")), ("100Mi", 100 * 2**20)])
def test_parse(text, value):
    assert parse_quantity(text) == value


def test_format_is_exact_and_short():
    assert [format_quantity(parse_quantity(t)) for t in ("1", "1500m", "32Gi", "1024", "3")] == \
        ["1", "1500m", "32Gi", "1Ki", "3"]
    with pytest.raises(ValueError):
        parse_quantity("lots")


def test_effective_requests_count_sidecars_init_containers_and_overhead():
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "4"}}},
                       {"resources": {"requests": {"cpu": "500m"}}}],
        "init_containers": [
            {"restart_policy": "Always", "resources": {"requests": {"cpu": "1"}}},  # a sidecar: runs alongside
            {"resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},  # runs alone, after the sidecar started
        ],
        "overhead": {"cpu": "250m"},
    }
    requests, limits = effective_resources(spec)
    assert requests == {"cpu": Decimal("4.25"), "memory": 2**30, "nvidia.com/gpu": 4}
    assert limits == {}
