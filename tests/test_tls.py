"""The KEDA gRPC scaler over TLS and mutual TLS, with real gRPC clients and certificates made here (openssl).

A client that trusts the server's CA gets answers; a plaintext client does not; with a client CA
configured, a client without a certificate, or with one from another CA, is refused. The files are
checked at start (ConfigError naming the field and the path), and a renewed certificate is picked up
for new connections without a restart.
"""

from __future__ import annotations

import os
import shutil
import types
from pathlib import Path

import grpc
import pytest

from autoscaler.board import DecisionBoard, Published
from autoscaler.config import ScalerTLS, load_config
from autoscaler.errors import ConfigError
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.external_scaler.server import start
from autoscaler.external_scaler.tls import server_credentials
from loadtest.certs import Pair, authority, issue
from policies import Decision

from loopthread import LoopThread
from servers import free_port

REF = pb.ScaledObjectRef(name="llama", namespace="llm")
LOOPBACK = ["IP:127.0.0.1", "DNS:localhost"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> types.SimpleNamespace:
    """A CA with a server and a client certificate, and a second CA (not trusted) with its own client."""
    root = tmp_path_factory.mktemp("pki")
    ca = authority(root / "ca", subject="/CN=scaler-ca")
    other = authority(root / "other", subject="/CN=someone-else")
    return types.SimpleNamespace(
        ca=ca, other=other,
        server=issue(ca, root / "server", subject="/CN=inference-autoscaler", names=LOOPBACK),
        client=issue(ca, root / "client", subject="/CN=keda-operator", names=["DNS:keda-operator.keda.svc"]),
        rogue=issue(other, root / "rogue", subject="/CN=keda-operator", names=["DNS:keda-operator.keda.svc"]),
        other_server=issue(other, root / "other-server", subject="/CN=inference-autoscaler", names=LOOPBACK),
    )


@pytest.fixture()
def loop():
    thread = LoopThread()
    yield thread
    thread.close()


def serve(loop: LoopThread, tls: ScalerTLS | None, replicas: int = 7) -> tuple[str, object]:
    board = DecisionBoard()
    loop.run(board.publish(Published(Decision(replicas=replicas), replicas, None, 0.0)))
    port = free_port()
    server = loop.run(start(board, host="127.0.0.1", port=port, namespace="llm", scaled_object="llama",
                            metric_name="desired-replicas",
                            credentials=server_credentials(tls) if tls is not None else None))
    return f"127.0.0.1:{port}", server


def ask(address: str, *, trust: Pair | None, client: Pair | None = None) -> float:
    """GetMetrics the way KEDA calls it; trust None: a plaintext channel."""
    if trust is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(
            root_certificates=trust.cert.read_bytes(),
            private_key=client.key.read_bytes() if client else None,
            certificate_chain=client.cert.read_bytes() if client else None))
    with channel:
        response = pb_grpc.ExternalScalerStub(channel).GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=REF, metricName="desired-replicas"), timeout=5)
    return response.metricValues[0].metricValueFloat


def refused(address: str, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        ask(address, **kwargs)
    return err.value.code()


def test_tls_serves_a_client_that_trusts_its_ca_and_refuses_plaintext(pki, loop):
    address, server = serve(loop, ScalerTLS(cert_file=str(pki.server.cert), key_file=str(pki.server.key)))
    try:
        assert ask(address, trust=pki.ca) == 7.0  # no client certificate needed without a client CA
        assert refused(address, trust=None) == grpc.StatusCode.UNAVAILABLE
        assert refused(address, trust=pki.other) == grpc.StatusCode.UNAVAILABLE  # the client checks the server
    finally:
        loop.run(server.stop(None))


def test_mutual_tls_requires_a_client_certificate_from_the_configured_ca(pki, loop):
    tls = ScalerTLS(cert_file=str(pki.server.cert), key_file=str(pki.server.key), client_ca_file=str(pki.ca.cert))
    address, server = serve(loop, tls)
    try:
        assert ask(address, trust=pki.ca, client=pki.client) == 7.0
        assert refused(address, trust=pki.ca) == grpc.StatusCode.UNAVAILABLE  # no client certificate
        assert refused(address, trust=pki.ca, client=pki.rogue) == grpc.StatusCode.UNAVAILABLE  # another CA's
        assert refused(address, trust=None) == grpc.StatusCode.UNAVAILABLE
    finally:
        loop.run(server.stop(None))


def test_a_renewed_certificate_serves_new_connections_and_a_broken_renewal_keeps_the_last_good_one(pki, loop,
                                                                                                   tmp_path):
    mounted = Pair(tmp_path / "tls.crt", tmp_path / "tls.key")
    shutil.copy(pki.server.cert, mounted.cert)
    shutil.copy(pki.server.key, mounted.key)
    address, server = serve(loop, ScalerTLS(cert_file=str(mounted.cert), key_file=str(mounted.key)))
    try:
        assert ask(address, trust=pki.ca) == 7.0

        def renew(cert: Path, key: Path, *, at_s: float) -> None:
            shutil.copy(cert, mounted.cert)
            shutil.copy(key, mounted.key)
            for path in mounted.cert, mounted.key:  # a new modification time, even within the clock's grain
                os.utime(path, (at_s, at_s))

        renew(pki.other_server.cert, pki.other_server.key, at_s=1e9)  # renewed by another CA
        assert ask(address, trust=pki.other) == 7.0
        assert refused(address, trust=pki.ca) == grpc.StatusCode.UNAVAILABLE
        renew(pki.server.cert, pki.other_server.key, at_s=2e9)  # half renewed: the key is not the certificate's
        assert ask(address, trust=pki.other) == 7.0  # still the last good one
    finally:
        loop.run(server.stop(None))


def test_the_controller_serves_keda_over_tls_when_configured(pki, loop, tmp_path, monkeypatch):
    """The wiring in runtime.start_servers: keda mode with keda.tls set serves TLS only."""
    from autoscaler.clock import SystemClock
    from autoscaler.metrics import ControllerMetrics
    from autoscaler.runtime import Parts, start_servers, stop_servers

    grpc_port, http_port = free_port(), free_port()
    config = tmp_path / "config.yaml"
    config.write_text(f"""
mode: keda
target: {{namespace: llm, name: llama}}
prometheus: {{url: http://prometheus:9090}}
http_port: {http_port}
keda:
  port: {grpc_port}
  tls: {{cert_file: {pki.server.cert}, key_file: {pki.server.key}, client_ca_file: {pki.ca.cert}}}
""")
    settings = load_config(config)
    board, parts = DecisionBoard(), Parts()
    controller = types.SimpleNamespace(settings=settings, last_tick_s=None)
    loop.run(board.publish(Published(Decision(replicas=3), 3, None, 0.0)))
    loop.run(start_servers(settings, host="127.0.0.1", controller=controller, admission=None, board=board,
                           metrics=ControllerMetrics(), clock=SystemClock(), parts=parts))
    try:
        address = f"127.0.0.1:{grpc_port}"
        assert ask(address, trust=pki.ca, client=pki.client) == 3.0
        assert refused(address, trust=None) == grpc.StatusCode.UNAVAILABLE
        assert refused(address, trust=pki.ca) == grpc.StatusCode.UNAVAILABLE
    finally:
        loop.run(stop_servers(parts))


def config_error(tmp_path, tls: str) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(f"target: {{namespace: llm, name: llama}}\nprometheus: {{url: http://p:9090}}\n"
                      f"keda: {{tls: {tls}}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    return str(err.value)


def test_missing_unreadable_or_mismatched_files_are_config_errors_naming_field_and_path(pki, tmp_path):
    cert, key, ca = pki.server.cert, pki.server.key, pki.ca.cert
    missing = tmp_path / "absent.crt"
    message = config_error(tmp_path, f"{{cert_file: {missing}, key_file: {key}}}")
    assert "keda.tls.cert_file" in message and str(missing) in message and "No such file" in message
    message = config_error(tmp_path, f"{{cert_file: {cert}, key_file: {tmp_path}}}")  # a folder, not a file
    assert "keda.tls.key_file" in message and str(tmp_path) in message
    message = config_error(tmp_path, f"{{cert_file: {cert}, key_file: {pki.client.key}}}")
    assert "keda.tls" in message and str(cert) in message and str(pki.client.key) in message
    assert "KEY_VALUES_MISMATCH" in message
    message = config_error(tmp_path, f"{{cert_file: {key}, key_file: {key}}}")  # a key where the certificate goes
    assert "keda.tls" in message and "not a PEM certificate" in message
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("not a certificate\n")
    message = config_error(tmp_path, f"{{cert_file: {cert}, key_file: {key}, client_ca_file: {not_pem}}}")
    assert "keda.tls" in message and f"client_ca_file {not_pem}" in message
    message = config_error(tmp_path, f"{{cert_file: {cert}, key_file: {key}, ca_file: {ca}}}")  # a misspelt key
    assert "keda.tls.ca_file" in message


def test_tls_files_come_from_the_environment_too(pki, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSCALER_KEDA__TLS__CERT_FILE", str(pki.server.cert))
    monkeypatch.setenv("AUTOSCALER_KEDA__TLS__KEY_FILE", str(pki.server.key))
    monkeypatch.setenv("AUTOSCALER_KEDA__TLS__CLIENT_CA_FILE", str(pki.ca.cert))
    config = tmp_path / "config.yaml"
    config.write_text("target: {namespace: llm, name: llama}\nprometheus: {url: http://p:9090}\n")
    tls = load_config(config).keda.tls
    assert tls == ScalerTLS(cert_file=str(pki.server.cert), key_file=str(pki.server.key),
                            client_ca_file=str(pki.ca.cert))
