"""The fleet's gateway (`loadtest.gateway.render` with `models`): the real nginx, with the shipped file, routes
each request to its model's own upstream by `x-model-autoscaler` and names the model to the admission
endpoint, whose answer for that model holds (a model shed at the endpoint is shed at the gateway); a request
naming no known model goes to the shipped default upstream."""

from __future__ import annotations

import http.client
import threading
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from loadtest.gateway import gateway
from loadtest.loadgen import PRIORITY_HEADER

MODEL_HEADER = "x-model-autoscaler"


@contextmanager
def _server(answer):
    """An HTTP server on a free loopback port; `answer(path, headers) -> (status, body)` for every request."""
    class Handler(BaseHTTPRequestHandler):
        def _reply(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = answer(self.path, self.headers)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def _post(url: str, headers: dict) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=b"{}", headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_each_request_reaches_its_models_servers_and_its_models_admission(tmp_path: Path):
    asked = []

    def admission(_, headers):
        asked.append((headers.get(MODEL_HEADER), headers.get(PRIORITY_HEADER)))
        # the endpoint sheds model b's sheddable class only
        shed = headers.get(MODEL_HEADER) == "ns-b/b" and headers.get(PRIORITY_HEADER) == "sheddable"
        return (403, b"") if shed else (200, b"")  # 403: shed (the gateway answers 429)

    with ExitStack() as stack:
        ports = {name: stack.enter_context(_server(lambda *_, n=name: (200, n.encode()))) for name in
                 ("a", "b", "default")}
        files = {}
        for name, port in ports.items():
            files[name] = tmp_path / f"upstreams-{name}.conf"
            files[name].write_text(f"server 127.0.0.1:{port};\n")
        endpoint = stack.enter_context(_server(admission))
        url, _ = stack.enter_context(gateway(
            admission=f"http://127.0.0.1:{endpoint}", upstreams=files["default"],
            models={"ns-a/a": files["a"], "ns-b/b": files["b"]}, trusted_priority_header=PRIORITY_HEADER))
        for _ in range(3):
            assert _post(url, {MODEL_HEADER: "ns-a/a", PRIORITY_HEADER: "critical"}) == (200, b"a")
            assert _post(url, {MODEL_HEADER: "ns-b/b", PRIORITY_HEADER: "critical"}) == (200, b"b")
        assert _post(url, {MODEL_HEADER: "ns-a/a", PRIORITY_HEADER: "sheddable"}) == (200, b"a")
        assert _post(url, {MODEL_HEADER: "ns-b/b", PRIORITY_HEADER: "sheddable"})[0] == 429
        assert _post(url, {MODEL_HEADER: "ns-c/unknown", PRIORITY_HEADER: "critical"}) == (200, b"default")
        assert _post(url, {PRIORITY_HEADER: "critical"}) == (200, b"default")
    assert asked[:2] == [("ns-a/a", "critical"), ("ns-b/b", "critical")]
    assert ("ns-b/b", "sheddable") in asked and ("ns-c/unknown", "critical") in asked
