"""`autoscaler serve --replay`: the controller's KEDA scaler and admission endpoint, run as the command a
user runs, answer a real gRPC client and HTTP requests with the decisions replayed from a recording."""

import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc

from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.replay.openloop import open_loop
from autoscaler.replay.recording import read_recording
from policies import PolicySpec

from loadtest.realservers import free_port, stop, wait_tcp
from test_replay_table import step_recording


def _status(url, priority):
    request = urllib.request.Request(url, headers={"x-request-priority": priority})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_keda_and_admission_answer_from_the_replayed_decisions(tmp_path):
    rec = tmp_path / "rec.csv"
    step_recording(rec, last_queue=2000)  # a deep queue at the end: the saturation guard rejects sheddable
    expected = open_loop(read_recording(rec), PolicySpec())[-1]["replicas"]
    grpc_port, http_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autoscaler", "serve", "--replay", str(rec), "--speed", "1000",
                             "--grpc-port", str(grpc_port), "--admission-port", str(http_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_tcp("127.0.0.1", http_port, proc=proc)
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "ticks published" in line:
                break
        assert "241 ticks published" in lines[-1], "".join(lines)
        assert any("scale up" in line for line in lines), "".join(lines)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            ref = pb.ScaledObjectRef(name="model", namespace="llm")
            metrics = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName="desired-replicas"))
            assert metrics.metricValues[0].metricValueFloat == expected
            assert stub.IsActive(ref).result
        base = f"http://127.0.0.1:{http_port}/auth_request"
        assert _status(base, "critical") == 200
        assert _status(base, "sheddable") == 403
    finally:
        stop(proc)
    assert proc.returncode in (0, -15)


def test_a_port_in_use_is_a_clear_error(tmp_path, capsys):
    import socket

    from autoscaler.cli import main

    rec = tmp_path / "rec.csv"
    step_recording(rec)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--replay", str(rec), "--grpc-port", str(free_port()), "--admission-port", str(port),
                     "--exit-at-end"]) == 2
        assert f"--admission-port {port}: cannot listen on 127.0.0.1" in capsys.readouterr().err
        assert main(["serve", "--replay", str(rec), "--grpc-port", str(port), "--exit-at-end"]) == 2
        assert f"--grpc-port {port}: cannot listen on 127.0.0.1" in capsys.readouterr().err
