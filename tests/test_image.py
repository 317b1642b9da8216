"""The container image, built from the Dockerfile with podman (loadtest/image/build.sh) and run as a user
runs it: read-only, as uid 10001, host network, a config file and a kubeconfig mounted read-only, against
the test control plane and a real Prometheus scraping a fake vLLM server."""

import base64
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml

from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from loadtest.kube.controlplane import model_deployment

from helpers import ROOT
from servers import fake_model_server, free_port, post_json, prometheus, wait_http

BUILD = ROOT / "loadtest" / "image" / "build.sh"


@pytest.fixture(scope="module")
def image():
    out = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def podman(*args, **kw) -> subprocess.CompletedProcess:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")  # as build.sh writes it
    env = {**os.environ, "CONTAINERS_CONF": str(cache / "inference-autoscaler" / "podman" / "containers.conf")}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, **kw)


def test_the_image_is_small_non_root_and_has_no_installer_or_plotting(image):
    size = podman("image", "inspect", image, "--format", "{{.Size}}").stdout.strip()
    assert int(size) < 700 * 2**20, size
    assert podman("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip() == "10001"
    probe = ("import importlib.util as u; print([m for m in ('pip', 'setuptools', 'matplotlib', 'loadtest') "
             "if u.find_spec(m)])")
    assert podman("run", "--rm", "--entrypoint", "python", image, "-c", probe).stdout.strip() == "[]"


def test_replay_runs_in_a_read_only_container(image, tmp_path):
    rec = tmp_path / "rec.csv"
    rec.write_text("t_s,arrival_rate_per_s,in_flight,spec_replicas\n"
                   + "".join(f"{15 * i},10,10,2\n" for i in range(120)))
    done = podman("run", "--rm", "--read-only", "-v", f"{rec}:/data/rec.csv:ro", image, "replay", "/data/rec.csv",
                  timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrote /tmp/replay-out-" in done.stdout and "no plot" in done.stdout


@pytest.fixture()
def target(cluster):
    ns = f"image-{int(time.time() * 1000) % 1000000}"
    assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
    assert cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                           model_deployment(ns, "model", 2))[0] == 201
    yield ns
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def container_kubeconfig(cluster, tmp_path: Path) -> Path:
    """The admin kubeconfig with its CA inline: a read-only container has its own /tmp (a tmpfs), so files
    are mounted under /etc instead."""
    path = tmp_path / "kubeconfig"
    ca = base64.b64encode(Path(cluster.ca_file).read_bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": cluster.url, "certificate-authority-data": ca}}],
        "users": [{"name": "test", "user": {"token": cluster.token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
    return path


def run_controller(image, cluster, config: dict, tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    started = podman("run", "-d", "--read-only", "--network", "host", "--name", name,
                     "-v", f"{path}:/etc/inference-autoscaler/config.yaml:ro",
                     "-v", f"{container_kubeconfig(cluster, tmp_path)}:/etc/inference-autoscaler/kubeconfig:ro",
                     "-e", f"POD_NAME={name}", image, "run", "--config", "/etc/inference-autoscaler/config.yaml",
                     "--kubeconfig", "/etc/inference-autoscaler/kubeconfig")
    assert started.returncode == 0, started.stderr
    return name


def wait_ready(name: str, port: int) -> None:
    try:
        wait_http(f"http://127.0.0.1:{port}/decided", timeout_s=60)  # ready and decided
    except TimeoutError as err:
        state = podman("inspect", name, "--format", "{{.State.Status}} {{.State.ExitCode}}").stdout
        raise AssertionError(f"{err}; container {state}: {podman('logs', name).stderr[-3000:]}") from None


def test_the_controller_runs_in_the_image(image, cluster, target, tmp_path):
    with fake_model_server() as model, prometheus([model.removeprefix("http://")]) as prom:
        post_json(f"{model}/admin/state", {"waiting": 2, "running": 12})
        http, admission, grpc_port = free_port(), free_port(), free_port()
        base = {"target": {"namespace": target, "name": "model"}, "http_port": http,
                "prometheus": {"url": prom, "selector": 'namespace="llm"'},
                "policy": {"tick_s": 1.0, "forecast_bucket_s": 60.0, "replica_concurrency": 4},
                "admission": {"port": admission}, "keda": {"port": grpc_port}}
        names = []
        try:
            names.append(run_controller(image, cluster, {**base, "mode": "shadow"}, tmp_path, "shadow"))
            wait_ready("shadow", http)
            deadline = time.monotonic() + 60  # the first ticks hold until Prometheus has scraped the server
            while True:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
                    exposition = r.read().decode()
                if "autoscaler_decision_valid 1.0" in exposition or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert "autoscaler_decided_replicas" in exposition and "autoscaler_decision_valid 1.0" in exposition, \
                podman("logs", "shadow").stderr[-3000:]
            with urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{admission}/auth_request", headers={"x-request-priority": "critical"}),
                    timeout=5) as r:
                assert r.status == 200
            podman("rm", "-f", "-t", "5", "shadow")
            names.pop()
            http2 = free_port()
            names.append(run_controller(image, cluster, {**base, "mode": "keda", "http_port": http2,
                                                         "admission": {"port": free_port()}}, tmp_path, "keda"))
            wait_ready("keda", http2)
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                ref = pb.ScaledObjectRef(name="model", namespace=target)
                spec = pb_grpc.ExternalScalerStub(channel).GetMetricSpec(ref, timeout=5)
                value = pb_grpc.ExternalScalerStub(channel).GetMetrics(
                    pb.GetMetricsRequest(scaledObjectRef=ref, metricName=spec.metricSpecs[0].metricName), timeout=5)
            assert value.metricValues[0].metricValueFloat >= 1
        finally:
            for name in names:
                logs = podman("logs", name).stdout + podman("logs", name).stderr
                podman("rm", "-f", name)
        assert '"event": "decision"' in logs
    model_replicas = cluster.request("GET", f"/apis/apps/v1/namespaces/{target}/deployments/model")[1]
    assert model_replicas["spec"]["replicas"] == 2  # shadow and keda modes write nothing
