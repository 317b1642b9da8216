"""nginx in front of the model servers, as shipped in `deploy/gateway/nginx.conf`, run on loopback.

The shipped file is the server-level configuration a user includes in nginx's `http` block. Three of its
lines name cluster addresses; here they are replaced (and each replacement is checked, so a change to the
shipped file cannot silently bypass this harness): the model upstream becomes an included list of live
servers (kept current by `loadtest.fleet`, with `least_conn`, a least-loaded balancer like vLLM's
production routers), the admission endpoint is the controller's on 127.0.0.1, and nginx listens on
127.0.0.1. Everything else (auth_request, the 403 -> 429 mapping with Retry-After, failing open, the
priority from a trusted source) runs as shipped.

The shipped file's documented settings can be set as a user would: `on_admission_error` (admit or reject),
entries added to its priority maps (`map_entries`, keyed by the map's variable), and `trusted_priority_header`,
the header an authenticating proxy in front sets (the load generator stands in for that proxy: it names
each request's class in `x-request-priority`, which the shipped file on its own does not trust).

A fleet (`models`: NAMESPACE/NAME -> its upstreams file): one gateway for several models. Each request names its
model in `x-model-autoscaler` (what a route per model sets; the load generator stands in for the route, as
for the priority), which goes with the admission subrequest to the fleet controller's one endpoint, and picks
the model's own upstream list (`map` to an upstream per model); a request naming no known model goes to the
shipped `model` upstream.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from loadtest.realservers import free_port, stop, wait_tcp

SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "gateway" / "nginx.conf"
UPSTREAM_LINE = "upstream model { server llama-3-8b.llm.svc:8000; }"
LISTEN_LINE = "listen 8080;"
ADMISSION_URL = "http://inference-autoscaler.llm.svc:8081/auth_request"
ON_ADMISSION_ERROR_LINE = "map $uri $admission_on_error {\n  default admit;"
AUTH_PROXY_MAP = "map $http_x_auth_request_groups $priority_from_auth_proxy {"


def _substitute(text: str, old: str, new: str) -> str:
    if old not in text:
        raise ValueError(f"{SHIPPED}: expected {old!r}; update loadtest/gateway.py with the shipped file")
    return text.replace(old, new)


def configure(server: str, *, on_admission_error: str = "admit", trusted_priority_header: str | None = None,
              map_entries: dict[str, list[str]] | None = None) -> str:
    """The shipped server configuration with its documented settings changed as a user would change them."""
    if on_admission_error != "admit":
        server = _substitute(server, ON_ADMISSION_ERROR_LINE,
                             ON_ADMISSION_ERROR_LINE.replace("admit;", f"{on_admission_error};"))
    if trusted_priority_header is not None:
        header = "$http_" + trusted_priority_header.lower().replace("-", "_")
        server = _substitute(server, AUTH_PROXY_MAP, AUTH_PROXY_MAP.replace("$http_x_auth_request_groups", header)
                             + "\n  ~^(?<trusted_priority>.+)$ $trusted_priority;")
    for variable, entries in (map_entries or {}).items():
        opening = next((line for line in server.splitlines() if line.startswith("map ")
                        and line.endswith(f" {variable} {{")), None)
        if opening is None:
            raise ValueError(f"{SHIPPED}: no map sets {variable}; update loadtest/gateway.py with the shipped file")
        server = server.replace(opening, "\n  ".join([opening, *entries]))
    return server


def _fleet(server: str, models: Mapping[str, Path]) -> str:
    """Each model's own upstream, chosen by the request's x-model-autoscaler (see the module's docstring)."""
    blocks = "".join(f"upstream fleet_{i} {{ least_conn; include {path}; }}\n"
                     for i, path in enumerate(models.values()))
    entries = "".join(f'  "{key}" fleet_{i};\n' for i, key in enumerate(models))
    chooser = f"map $http_x_model_autoscaler $fleet_upstream {{\n  default model;\n{entries}}}\n"
    return blocks + chooser + _substitute(server, "proxy_pass http://model;", "proxy_pass http://$fleet_upstream;")


def render(*, tmp: Path, port: int, admission: str | list[str], upstreams: Path, worker_processes: int = 1,
           models: Mapping[str, Path] | None = None, **settings) -> str:
    """A complete nginx.conf around the shipped server configuration (`settings`: see `configure`). Several
    admission endpoints (several controller replicas, as behind their Service) are balanced, a refused
    connection tried on the next. `models`: a fleet (see the module's docstring)."""
    server = configure(SHIPPED.read_text(), **settings)
    server = _substitute(server, UPSTREAM_LINE, f"upstream model {{ least_conn; include {upstreams}; }}")
    server = _substitute(server, LISTEN_LINE, f"listen 127.0.0.1:{port};")
    endpoints = [admission] if isinstance(admission, str) else list(admission)
    hosts = " ".join(f"server {e.removeprefix('http://')} max_fails=0;" for e in endpoints)
    server = f"upstream admission {{ {hosts} }}\n" + _substitute(server, ADMISSION_URL, "http://admission/auth_request")
    if models:
        server = _fleet(server, models)
    return f"""
worker_processes {worker_processes};
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
{server}
}}
"""


def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if path is None:
        raise RuntimeError("nginx is not installed; `make test` installs Debian's nginx package")
    return path


@contextlib.contextmanager
def gateway(*, admission: str | list[str], upstreams: Path | None = None, port: int | None = None, **settings):
    """nginx on 127.0.0.1:`port` asking `admission` (base URL) per request and balancing over the servers
    listed in `upstreams` (a file of `server host:port;` lines), with the shipped file's `settings` (see
    `configure`). Yields (url, pid file)."""
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="gateway-") as tmp:
        tmp_path = Path(tmp)
        if upstreams is None:
            upstreams = tmp_path / "upstreams.conf"
        if not upstreams.exists():
            upstreams.write_text("server 127.0.0.1:9 max_fails=0;\n")
        conf = tmp_path / "nginx.conf"
        conf.write_text(render(tmp=tmp_path, port=port, admission=admission, upstreams=upstreams, **settings))
        proc = subprocess.Popen([nginx_binary(), "-c", str(conf), "-p", tmp], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_tcp("127.0.0.1", port, proc=proc)
            yield f"http://127.0.0.1:{port}", tmp_path / "nginx.pid"
        finally:
            stop(proc)
