"""Throw-away certificates for tests and the test control plane, made with the openssl command line.

`authority` makes a self-signed CA, `issue` a certificate it signs, usable for both ends of a TLS
connection (serverAuth and clientAuth) and valid for the names given (`DNS:host`, `IP:127.0.0.1`).
P-256 keys: quick to make on a loaded machine, and accepted by Go, OpenSSL and BoringSSL alike.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def authority(directory: Path, *, subject: str, stem: str = "ca", days: int = 2) -> Pair:
    """A self-signed CA: `<stem>.crt` and `<stem>.key` in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    _openssl("req", "-x509", *KEY, "-days", str(days), "-subj", subject, "-keyout", str(pair.key),
             "-out", str(pair.cert))
    return pair


def issue(ca: Pair, directory: Path, *, subject: str, names: list[str], stem: str = "tls", days: int = 2) -> Pair:
    """A certificate signed by `ca` for `names` (subjectAltName entries): `<stem>.crt` and `<stem>.key`."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    csr, ext = directory / f"{stem}.csr", directory / f"{stem}.cnf"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=" + ",".join(names) + "\n")
    _openssl("req", *KEY, "-subj", subject, "-keyout", str(pair.key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
             "-days", str(days), "-extfile", str(ext), "-out", str(pair.cert))
    return pair
