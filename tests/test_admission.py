"""The admission endpoint behind a real nginx `auth_request`, and its Envoy ext_authz contract.

Two gateways run the shipped deploy/gateway/nginx.conf: one trusting `x-request-priority` as an
authenticating proxy's header (the load generator's place in the closed loop), one as shipped, which
ignores the client's header and takes the class from the API key or the route (entries added to its maps
as a user would)."""

import contextlib
import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.metrics import ControllerMetrics
from policies import PRIORITY_CLASSES, Decision

from loadtest.gateway import gateway as nginx_gateway
from loopthread import LoopThread
from servers import fake_model_server, free_port

# What a user adds to the shipped maps: API keys and a route naming classes.
MAP_ENTRIES = {"$request_priority": ['"key-of-checkout" critical;', '"key-of-batch" sheddable;'],
               "$priority_from_route": ["~^/v1/embeddings sheddable;"]}


@contextlib.contextmanager
def serving(thread: LoopThread, app: web.Application, port: int | None = None):
    """`app` on 127.0.0.1 (at `port`, else a free one) in `thread`'s event loop; yields its base URL."""
    port = port or free_port()

    async def serve():
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = thread.run(serve())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        thread.run(runner.cleanup())


@contextlib.contextmanager
def model_upstreams():
    """The fake model server, as the file of upstream servers the gateway includes."""
    with fake_model_server() as model, tempfile.TemporaryDirectory() as tmp:
        upstreams = Path(tmp) / "upstreams.conf"
        upstreams.write_text(f"server {model.removeprefix('http://')};\n")
        yield upstreams


@pytest.fixture(scope="module")
def gateway():
    thread = LoopThread()
    board = DecisionBoard()
    metrics = ControllerMetrics()
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", unknown_class="sheddable", retry_after_s=7,
                          on_unknown=metrics.unknown_priority.inc)
    # the shipped deploy/gateway/nginx.conf, with its cluster addresses replaced by loopback ones
    with serving(thread, admission.app()) as endpoint, model_upstreams() as upstreams, \
         nginx_gateway(admission=endpoint, upstreams=upstreams,
                       trusted_priority_header="x-request-priority") as (url, _), \
         nginx_gateway(admission=endpoint, upstreams=upstreams, map_entries=MAP_ENTRIES) as (shipped, _):
        yield thread, board, url, endpoint, shipped, metrics
    thread.close()


def publish(thread, board, *, shed=None, depths=None, queue=None, valid=True, drain=0.0):
    decision = Decision(replicas=4, shed=shed or {}, saturation_queue_depth=depths or {}, valid=valid,
                        saturation_drain_per_s=drain)
    thread.run(board.publish(Published(decision, 4, queue, 0.0)))


def get(url, priority=None, body=None, **headers):
    if priority is not None:
        headers["x-request-priority"] = priority
    request = urllib.request.Request(url, headers={k.replace("_", "-"): v for k, v in headers.items()}, data=body)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def test_nginx_sheds_exactly_the_fraction_of_the_lowest_class(gateway):
    thread, board, url, *_ = gateway
    publish(thread, board, shed={"sheddable": 0.5})
    sheddable = [get(f"{url}/metrics", "sheddable") for _ in range(40)]
    assert sum(1 for s, _ in sheddable if s == 429) == 20
    denied = next(h for s, h in sheddable if s == 429)
    assert denied["Retry-After"] == "7" and denied["X-Shed-Reason"] == "shedding 50% of sheddable"
    assert all(get(f"{url}/metrics", p)[0] == 200 for p in ("critical", "standard", "5", "0", None))
    # Gateway API integers: below 0 is sheddable
    assert sum(1 for _ in range(10) if get(f"{url}/metrics", "-3")[0] == 429) == 5


def test_saturation_guard_rejects_guarded_classes_never_the_highest(gateway):
    thread, board, url, *_ = gateway
    publish(thread, board, depths={"sheddable": 10, "standard": 20}, queue=15)
    assert get(f"{url}/metrics", "sheddable")[0] == 429
    assert get(f"{url}/metrics", "standard")[0] == 200
    publish(thread, board, depths={"sheddable": 10, "standard": 20}, queue=25)
    status, headers = get(f"{url}/metrics", "standard")
    assert status == 429 and headers["X-Shed-Reason"] == "saturated: queue 25 >= 20 for standard"
    assert get(f"{url}/metrics", "critical")[0] == 200


def test_critical_outrunning_the_drain_gets_the_whole_queue(gateway):
    """5 queued, below both depths, and 3 req/s completed: once more than 3 critical requests came within a
    second, standard and sheddable are answered 429; with no queue they are admitted."""
    thread, board, url, *_ = gateway
    publish(thread, board, depths={"sheddable": 10, "standard": 20}, queue=0, drain=3.0)
    assert all(get(f"{url}/metrics", "critical")[0] == 200 for _ in range(4))
    assert get(f"{url}/metrics", "standard")[0] == 200  # no request waits: it takes a slot
    publish(thread, board, depths={"sheddable": 10, "standard": 20}, queue=5, drain=3.0)
    assert all(get(f"{url}/metrics", "critical")[0] == 200 for _ in range(4))
    assert get(f"{url}/metrics", "standard")[0] == 429  # 5 queued is below its depth: the overrun rejects it
    assert get(f"{url}/metrics", "sheddable")[0] == 429


def test_no_valid_decision_admits_everything(gateway):
    thread, board, url, *_ = gateway
    publish(thread, board, shed={"sheddable": 1.0}, valid=False)
    assert all(get(f"{url}/metrics", "sheddable")[0] == 200 for _ in range(5))


def test_envoy_ext_authz_contract(gateway):
    thread, board, _, admission, *_ = gateway
    publish(thread, board, shed={"sheddable": 1.0})
    status, headers = get(f"{admission}/ext_authz/v1/completions", "sheddable")
    assert status == 429 and headers["Retry-After"] == "7" and "shedding" in headers["X-Shed-Reason"]
    assert get(f"{admission}/ext_authz/v1/completions", "critical")[0] == 200


COMPLETION = json.dumps({"model": "fake-model", "prompt": [0] * 4, "max_tokens": 2}).encode()


def test_the_shipped_gateway_ignores_the_clients_own_priority(gateway):
    thread, board, _, _, shipped, _ = gateway
    publish(thread, board, shed={"standard": 1.0, "sheddable": 1.0})
    # the client's claim is overwritten: no key, no route: the default class (standard), shed
    for claim in ("critical", "CRITICAL", "999999999999999999999", "2147483647"):
        assert get(f"{shipped}/v1/completions", claim)[0] == 429, claim
    assert get(f"{shipped}/v1/completions", "critical", COMPLETION, x_api_key="key-of-checkout")[0] == 200
    assert get(f"{shipped}/v1/completions", "critical", x_api_key="key-of-batch")[0] == 429
    publish(thread, board, shed={"sheddable": 1.0})
    assert get(f"{shipped}/v1/completions", "sheddable", COMPLETION)[0] == 200  # nor demote anyone
    for route in ("/v1/embeddings", "//v1//embeddings", "/v1/./embeddings"):  # nginx normalizes the path
        assert get(f"{shipped}{route}", "critical")[0] == 429, route
    assert get(f"{shipped}/v1/embeddings", x_api_key="key-of-checkout")[0] == 404  # the key first: the model's 404


def test_class_names_match_in_any_case_and_unknown_values_go_to_the_configured_class(gateway):
    thread, board, _, admission, _, metrics = gateway
    publish(thread, board, shed={"sheddable": 1.0})
    before = metrics.registry.get_sample_value("autoscaler_admission_unknown_priority_total")
    assert get(f"{admission}/ext_authz/", "Sheddable")[0] == 429
    assert get(f"{admission}/ext_authz/", "STANDARD")[0] == 200
    assert metrics.registry.get_sample_value("autoscaler_admission_unknown_priority_total") == before
    # unknown: a misspelt name, integers beyond 32 bits, a float, a 4,000-digit number: the configured
    # unknown class (sheddable here), counted
    unknown = ("critcal", "999999999999999999999", "-999999999999999999999", "1e3", "9" * 4000)
    assert all(get(f"{admission}/ext_authz/", value)[0] == 429 for value in unknown)
    after = metrics.registry.get_sample_value("autoscaler_admission_unknown_priority_total")
    assert after - before == len(unknown)
    assert get(f"{admission}/ext_authz/", "-2147483648")[0] == 429  # int32: a priority, the lowest class
    assert get(f"{admission}/ext_authz/", "2147483647")[0] == 200
    assert metrics.registry.get_sample_value("autoscaler_admission_unknown_priority_total") == after
