"""Server credentials of the KEDA gRPC scaler: TLS, and mutual TLS when a client CA is configured.

The files come from a Secret mounted in the pod (`config.ScalerTLS`, checked at start). A Secret volume is
updated in place when the certificate is renewed (cert-manager, or a rotated Secret), so the credentials
are dynamic: before each new connection's handshake gRPC asks `Reloader` for the current files, which
re-reads them when their modification time changed. A renewal that cannot be used (a file half written,
the key not the certificate's) keeps the last good certificate and is logged; connections never fail
because of it.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import structlog

from autoscaler.config import ScalerTLS, tls_files_problem


def _stamp(paths: tuple[str, ...]) -> tuple[float, ...] | None:
    try:
        return tuple(os.stat(path).st_mtime_ns for path in paths)
    except OSError:
        return None


class Reloader:
    """The certificate configuration gRPC fetches on each handshake: None (keep) unless the files changed."""

    def __init__(self, tls: ScalerTLS) -> None:
        self.tls = tls
        self.paths = tuple(p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p is not None)
        self.stamp = _stamp(self.paths)
        self.initial = self._configuration()

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        cert = Path(self.tls.cert_file).read_bytes()
        key = Path(self.tls.key_file).read_bytes()
        ca = Path(self.tls.client_ca_file).read_bytes() if self.tls.client_ca_file else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = _stamp(self.paths)
        if stamp is None or stamp == self.stamp:
            return None
        problem = tls_files_problem(self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file)
        if problem is not None:
            structlog.get_logger("autoscaler").warning("keda_tls_reload_skipped", reason=problem)
            return None
        try:
            configuration = self._configuration()
        except OSError as exc:  # the volume changed again between the check and the read
            structlog.get_logger("autoscaler").warning("keda_tls_reload_skipped", reason=str(exc))
            return None
        self.stamp = stamp
        structlog.get_logger("autoscaler").info("keda_tls_reloaded", cert_file=self.tls.cert_file)
        return configuration


def server_credentials(tls: ScalerTLS) -> grpc.ServerCredentials:
    """TLS credentials from the configured files; client certificates required when a client CA is set."""
    reloader = Reloader(tls)
    return grpc.dynamic_ssl_server_credentials(
        reloader.initial, reloader, require_client_authentication=tls.client_ca_file is not None
    )
