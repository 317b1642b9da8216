"""The shipped Envoy example (deploy/gateway/envoy.yaml), checked by reading it: Envoy is not installed
here, so this proves the settings are there and agree with the endpoint and the Service, not that Envoy
accepts the file. It must fail open with a short timeout and take the class from the route, not the client.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from policies import PRIORITY_CLASSES

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
EXT_AUTHZ = "envoy.filters.http.ext_authz"
MUTATION = "envoy.filters.http.header_mutation"


@pytest.fixture(scope="module")
def envoy() -> dict:
    return yaml.safe_load((DEPLOY / "gateway" / "envoy.yaml").read_text())


def manager(envoy: dict) -> dict:
    [listener] = envoy["static_resources"]["listeners"]
    [chain] = listener["filter_chains"]
    [hcm] = chain["filters"]
    return hcm["typed_config"]


def filters(envoy: dict) -> dict[str, dict]:
    return {f["name"]: f["typed_config"] for f in manager(envoy)["http_filters"]}


def seconds(duration: str) -> float:
    assert re.fullmatch(r"\d+(\.\d+)?s", duration), duration
    return float(duration[:-1])


def test_ext_authz_fails_open_within_a_short_timeout(envoy):
    authz = filters(envoy)[EXT_AUTHZ]
    assert authz["failure_mode_allow"] is True
    assert authz["status_on_error"] == {"code": "ServiceUnavailable"}  # what fail closed would answer
    service = authz["http_service"]
    assert seconds(service["server_uri"]["timeout"]) <= 0.25
    assert service["path_prefix"] == "/ext_authz"  # the endpoint's Envoy route: /ext_authz/{path}
    assert {"exact": "x-request-priority"} in authz["allowed_headers"]["patterns"]
    allowed = authz["http_service"]["authorization_response"]["allowed_client_headers"]["patterns"]
    assert {"exact": "retry-after"} in allowed
    [admission] = [c for c in envoy["static_resources"]["clusters"] if c["name"] == service["server_uri"]["cluster"]]
    assert seconds(admission["connect_timeout"]) <= 0.1
    address = admission["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    service_ports = yaml.safe_load((DEPLOY / "base" / "service.yaml").read_text())["spec"]["ports"]
    assert address["port_value"] == next(p["port"] for p in service_ports if p["name"] == "admission")
    assert service["server_uri"]["uri"] == f"http://{address['address']}:{address['port_value']}"


def test_the_client_priority_is_removed_before_ext_authz_and_routes_set_known_classes(envoy):
    order = [f["name"] for f in manager(envoy)["http_filters"]]
    assert order.index(MUTATION) < order.index(EXT_AUTHZ) < order.index("envoy.filters.http.router")
    assert filters(envoy)[MUTATION]["mutations"]["request_mutations"] == [{"remove": "x-request-priority"}]
    [host] = manager(envoy)["route_config"]["virtual_hosts"]
    classes = {}
    for route in host["routes"]:
        per_route = route.get("typed_per_filter_config", {}).get(MUTATION)
        if per_route is None:
            continue
        [mutation] = per_route["mutations"]["request_mutations"]
        assert mutation["append"]["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD"
        assert mutation["append"]["header"]["key"] == "x-request-priority"
        classes[route["name"]] = mutation["append"]["header"]["value"]
    assert classes == {"checkout-team-key": "critical", "embeddings": "sheddable"}
    assert set(classes.values()) <= set(PRIORITY_CLASSES)
    assert host["routes"][-1]["match"] == {"prefix": "/"}  # the catch-all, last
