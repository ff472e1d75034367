"""TLS at every network door: HTTPS servers, and clients that never send a token in clear.

Servers (`finesched serve`, `finesched k8s-extender`) speak HTTPS when given a PEM certificate
and its key; the extender can also require a client certificate signed by a given CA (what
kube-scheduler presents with `tlsConfig.certFile`/`keyFile`). `server_tls` checks the files before
anything listens, so a wrong path or a key that does not match is one clear error, not a
traceback from the first handshake.

Clients (the node agent, the CLI) verify the server's certificate against a CA file (`--ca`), or
the system's trust store when none is given, and refuse to send a bearer token over plain HTTP to
an address that is not loopback unless told `--insecure`: on 127.0.0.0/8, ::1 or `localhost`
the bytes never leave the machine; anywhere else anybody on the path could read the token and
act as that tenant, agent or admin. Host names are not resolved for this check (a name that
happens to resolve to 127.0.1.1 today is still a name a resolver could answer otherwise).

The same rule holds the other way round, for the log grants the server sends to node agents'
log ports (server/logs.py): HTTPS verified with `--agent-ca`, plain HTTP only on loopback unless
the server is told `--insecure-agent-logs`.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class TransportError(ValueError):
    """A URL, certificate or key that cannot be used as asked (the message says why and what to do)."""


def is_loopback(host: str) -> bool:
    """True for a loopback IP address literal or `localhost` (never resolved)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def in_clear_to_another_host(url: str) -> bool:
    """True when a secret sent to `url` would cross a network unencrypted: plain HTTP, not loopback."""
    parts = urlsplit(url)
    return parts.scheme == "http" and not is_loopback(parts.hostname or "")


def check_url(url: str, *, insecure: bool = False, option: str = "--server") -> None:
    """Refuse a URL a token must not be sent to: not http(s), or plain HTTP to a non-loopback host
    (unless `insecure`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"{option} {url!r}: use http(s)://HOST:PORT")
    if not insecure and in_clear_to_another_host(url):
        raise TransportError(
            f"{option} {url}: refusing to send a token over plain HTTP to {parts.hostname}, which is not this "
            "machine; serve HTTPS (finesched serve --tls-cert/--tls-key) and use https:// with --ca, "
            "or pass --insecure to send it in clear anyway"
        )


def client_verify(ca: Path | None) -> ssl.SSLContext | bool:
    """What httpx verifies the server with: the CA file `ca`, else the system's trust store."""
    return True if ca is None else ca_context(ca)


def ca_context(ca: Path | None, option: str = "--ca") -> ssl.SSLContext:
    """A client context that verifies a peer's certificate and name against the CA file `ca`, else
    against the system's trust store (the operating system's, e.g. /etc/ssl/certs)."""
    try:
        return ssl.create_default_context(cafile=str(ca)) if ca is not None else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(f"{option} {ca}: not a readable PEM certificate file ({exc})") from None


def pinned_context(cert: Path, option: str = "--tls-cert") -> ssl.SSLContext:
    """A client context that trusts exactly `cert`, the server's own certificate (what `finesched up`
    gives the agent it starts on the server's machine). It holds whether the certificate is
    self-signed or issued by a CA, and whatever names it carries: a server can present this
    certificate only with its private key, so the host name adds nothing here (it is not checked;
    the agent connects to 127.0.0.1, which a certificate for the machine's DNS name may not list)."""
    context = ca_context(cert, option)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.check_hostname = False
    return context


def client_options(url: str, ca: Path | None, insecure: bool) -> dict[str, Any]:
    """httpx.Client keyword arguments for talking to `url` with a token (raises TransportError)."""
    check_url(url, insecure=insecure)
    return {"verify": client_verify(ca)}


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None = None) -> dict[str, Any]:
    """uvicorn's TLS keyword arguments (empty: plain HTTP), after checking the files load together."""
    if cert is None and key is None:
        if client_ca is not None:
            raise TransportError("--tls-client-ca needs --tls-cert and --tls-key (client certificates need HTTPS)")
        return {}
    if cert is None or key is None:
        raise TransportError("give both --tls-cert and --tls-key (PEM files), or neither")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(key))
    except FileNotFoundError as exc:
        raise TransportError(f"{exc.filename}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(f"--tls-cert {cert} / --tls-key {key}: cannot be used together ({exc})") from None
    options: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"--tls-client-ca {client_ca}: not a readable PEM CA file ({exc})") from None
        options |= {"ssl_ca_certs": str(client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options
