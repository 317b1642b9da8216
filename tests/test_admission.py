"""The admission endpoint behind a real nginx `auth_request`, and its Envoy ext_authz contract."""

import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
import shutil

import pytest
from aiohttp import web

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from policies import PRIORITY_CLASSES, Decision

from loopthread import LoopThread
from servers import fake_model_server, free_port, stop, wait_http

NGINX = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      auth_request /_admission;
      auth_request_set $retry_after $upstream_http_retry_after;
      error_page 403 = @shed;
      proxy_pass {model};
    }}
    location = /_admission {{
      internal;
      proxy_pass http://127.0.0.1:{admission}/auth_request;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
    }}
    location @shed {{
      add_header Retry-After $retry_after always;
      return 429 "shed\\n";
    }}
  }}
}}
"""


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
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    with fake_model_server() as model, tempfile.TemporaryDirectory() as tmp:
        gw_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX.format(tmp=tmp, port=gw_port, model=model, admission=port))
        proc = subprocess.Popen([nginx, "-c", str(conf), "-p", tmp], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_http(f"http://127.0.0.1:{gw_port}/metrics", proc=proc)
            yield thread, board, f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{port}"
        finally:
            stop(proc)
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
