"""Real servers for integration tests and benchmarks, each on 127.0.0.1 with a free port, stopped afterwards:
the fake model server (a subprocess) and Debian's Prometheus scraping it."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status < 500:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def wait_tcp(host: str, port: int, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts connections on host:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {host}:{port} accepted connections")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not accept connections within {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fake_model_server(*, concurrency: int = 16, time_scale: float = 1.0):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest.fakeserver", "--port", str(port), "--concurrency", str(concurrency),
         "--time-scale", str(time_scale)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise RuntimeError("prometheus is not installed; `make test` installs Debian's prometheus package")
    return path


@contextlib.contextmanager
def prometheus(targets: list[str], *, scrape_interval_s: float = 1.0, port: int | None = None,
               file_sd: Path | None = None, honor_labels: bool = False):
    """Debian's Prometheus scraping `targets` (host:port), and those listed in the file_sd JSON `file_sd` (kept
    current by whoever writes it), every `scrape_interval_s` (on `port`, or a free one). With `honor_labels`
    the targets' own labels win (an exporter of many models labels each series with its namespace)."""
    port = port or free_port()
    interval = f"{round(scrape_interval_s * 1000)}ms"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "prometheus.yml"
        text = (
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  evaluation_interval: {interval}\n"
            f"  scrape_timeout: {interval}\n"
            "scrape_configs:\n"
            "  - job_name: model\n"
            f"    honor_labels: {'true' if honor_labels else 'false'}\n"
            "    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
            "        labels: {namespace: llm}\n"
        )
        if file_sd is not None:
            text += ("  - job_name: fleet\n"
                     "    file_sd_configs:\n"
                     f"      - files: [{json.dumps(str(file_sd))}]\n"
                     "        refresh_interval: 1s\n")
        config.write_text(text)
        proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready", proc=proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(proc)


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def wait_for_series(url: str, promql: str, predicate=lambda v: True, timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = query(url, promql)
        if result:
            value = float(result[0]["value"][1])
            if predicate(value):
                return value
        time.sleep(0.25)
    raise TimeoutError(f"{promql} did not satisfy the condition within {timeout_s} s")



def instant_queries_answered(url: str) -> float:
    """Instant queries a Prometheus has answered so far (its own prometheus_http_requests_total, at the HTTP
    level)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def exposition_handler(render):
    """An HTTP handler answering every GET with the text exposition `render()` returns (a fake exporter)."""
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler
