"""Throwaway TLS material for tests (trustme): a CA, a server certificate for 127.0.0.1/localhost,
a client certificate, and a second CA that trusts none of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA that issued `cert` and `client_cert`
    cert: Path  # server certificate (PEM chain) for 127.0.0.1 and localhost
    key: Path
    client_cert: Path  # a client certificate (what kube-scheduler presents with tlsConfig.certFile)
    client_key: Path
    other_ca: Path  # a CA that issued none of them


def make_tls(directory: Path, *names: str) -> TlsFiles:
    """Write the files under `directory`; the server certificate names `names` (default 127.0.0.1, localhost)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert(*(names or ("127.0.0.1", "localhost")))
    client = ca.issue_cert("kube-scheduler.kube-system.svc", common_name="kube-scheduler")
    files = TlsFiles(*(directory / n for n in ("ca.pem", "cert.pem", "key.pem", "client.pem", "client-key.pem",
                                               "other-ca.pem")))  # fmt: skip
    ca.cert_pem.write_to_path(str(files.ca))
    other.cert_pem.write_to_path(str(files.other_ca))
    files.cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(files.key))
    files.client_cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(files.client_key))
    return files
