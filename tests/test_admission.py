"""The admission endpoint behind a real nginx `auth_request`, and its Envoy ext_authz contract."""

import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from policies import PRIORITY_CLASSES, Decision

from loadtest.gateway import gateway as nginx_gateway
from loopthread import LoopThread
from servers import fake_model_server, free_port

@pytest.fixture(scope="module")
def gateway():
    thread = LoopThread()
    board = DecisionBoard()
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7)
    port = free_port()

    async def serve():
        runner = web.AppRunner(admission.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = thread.run(serve())
    # the shipped deploy/gateway/nginx.conf, with its cluster addresses replaced by loopback ones
    with fake_model_server() as model, tempfile.TemporaryDirectory() as tmp:
        upstreams = Path(tmp) / "upstreams.conf"
        upstreams.write_text(f"server {model.removeprefix('http://')};\n")
        with nginx_gateway(admission=f"http://127.0.0.1:{port}", upstreams=upstreams) as (url, _):
            yield thread, board, url, f"http://127.0.0.1:{port}"
    thread.run(runner.cleanup())
    thread.close()


def publish(thread, board, *, shed=None, depths=None, queue=None, valid=True):
    decision = Decision(replicas=4, shed=shed or {}, saturation_queue_depth=depths or {}, valid=valid)
    thread.run(board.publish(Published(decision, 4, queue, 0.0)))


def get(url, priority=None):
    request = urllib.request.Request(url, headers={"x-request-priority": priority} if priority else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def test_nginx_sheds_exactly_the_fraction_of_the_lowest_class(gateway):
    thread, board, url, _ = gateway
    publish(thread, board, shed={"sheddable": 0.5})
    sheddable = [get(f"{url}/metrics", "sheddable") for _ in range(40)]
    assert sum(1 for s, _ in sheddable if s == 429) == 20
    denied = next(h for s, h in sheddable if s == 429)
    assert denied["Retry-After"] == "7"
    assert all(get(f"{url}/metrics", p)[0] == 200 for p in ("critical", "standard", "5", "0", None))
    # Gateway API integers: below 0 is sheddable
    assert sum(1 for _ in range(10) if get(f"{url}/metrics", "-3")[0] == 429) == 5


def test_saturation_guard_rejects_guarded_classes_never_the_highest(gateway):
    thread, board, url, _ = gateway
    publish(thread, board, depths={"sheddable": 10, "standard": 20}, queue=15)
    assert get(f"{url}/metrics", "sheddable")[0] == 429
    assert get(f"{url}/metrics", "standard")[0] == 200
    publish(thread, board, depths={"sheddable": 10, "standard": 20}, queue=25)
    assert get(f"{url}/metrics", "standard")[0] == 429
    assert get(f"{url}/metrics", "critical")[0] == 200


def test_no_valid_decision_admits_everything(gateway):
    thread, board, url, _ = gateway
    publish(thread, board, shed={"sheddable": 1.0}, valid=False)
    assert all(get(f"{url}/metrics", "sheddable")[0] == 200 for _ in range(5))


def test_envoy_ext_authz_contract(gateway):
    thread, board, _, admission = gateway
    publish(thread, board, shed={"sheddable": 1.0})
    status, headers = get(f"{admission}/ext_authz/v1/completions", "sheddable")
    assert status == 429 and headers["Retry-After"] == "7" and "shedding" in headers["X-Shed-Reason"]
    assert get(f"{admission}/ext_authz/v1/completions", "critical")[0] == 200
