"""The extender over HTTPS, called the way kube-scheduler calls it with `enableHTTPS: true` and a
`tlsConfig` (its HTTPExtender's transport: the CA verifies the extender, the client certificate is
presented, `serverName` is the name checked; with enableHTTPS and no CA it does not verify).
Certificates come from a throwaway test CA (trustme)."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_k8s_cli import free_port

from tls_files import TlsFiles, make_tls

ROOT = Path(__file__).parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


@dataclass
class SchedulerCaller:
    """What kube-scheduler's HTTPExtender sends requests with: its client and the server name it checks."""

    client: httpx.Client
    extensions: dict[str, Any]

    def post(self, verb: str, body: Any) -> httpx.Response:
        return self.client.post(f"/{verb}", json=body, extensions=self.extensions)

    def __enter__(self) -> SchedulerCaller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()


def kube_scheduler_client(extender: dict[str, Any], tmp: Path) -> SchedulerCaller:
    """The caller built from one `extenders` entry of a KubeSchedulerConfiguration as kube-scheduler
    builds its transport: tlsConfig.caData / caFile verify the server (none + enableHTTPS: not verified),
    certData+keyData / certFile+keyFile are the client certificate, serverName the name checked."""
    tls = extender.get("tlsConfig") or {}

    def pem(field: str) -> bytes | None:
        if tls.get(f"{field}Data"):
            return base64.b64decode(tls[f"{field}Data"])  # []byte fields are base64 in YAML/JSON
        return Path(tls[f"{field}File"]).read_bytes() if tls.get(f"{field}File") else None

    ca = pem("ca")
    context = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if tls.get("insecure") or (extender.get("enableHTTPS") and ca is None):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert, key = pem("cert"), pem("key")
    if cert and key:
        (tmp / "ks-cert.pem").write_bytes(cert)
        (tmp / "ks-key.pem").write_bytes(key)
        context.load_cert_chain(tmp / "ks-cert.pem", tmp / "ks-key.pem")
    extensions = {"sni_hostname": tls["serverName"]} if tls.get("serverName") else {}
    return SchedulerCaller(httpx.Client(base_url=extender["urlPrefix"], verify=context, timeout=10), extensions)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture
def https_extender(tmp_path: Path) -> Iterator[tuple[str, TlsFiles]]:
    tls = make_tls(tmp_path / "tls")
    port = free_port()
    command = [sys.executable, "-m", "finesched.cli", "k8s-extender", "--port", str(port), "--log-level", "warning",
               "--cluster", str(ROOT / "deploy" / "try-nodes.yaml"), "--tls-cert", str(tls.cert), "--tls-key",
               str(tls.key), "--tls-client-ca", str(tls.ca)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    probe = ssl.create_default_context(cafile=str(tls.ca))
    probe.load_cert_chain(tls.client_cert, tls.client_key)
    try:
        for _ in range(200):  # bounded: 20 s at most
            if process.poll() is not None:
                raise AssertionError(process.stderr.read().decode() if process.stderr else "exited")
            try:
                if httpx.get(f"https://127.0.0.1:{port}/healthz", verify=probe, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("the extender did not start")
        yield f"https://127.0.0.1:{port}", tls
    finally:
        process.terminate()
        process.wait(timeout=10)


def scheduler_entry(url: str, **tls_config: Any) -> dict[str, Any]:
    """deploy/kube-scheduler-config.yaml's extender, pointed at `url` over HTTPS with `tls_config`."""
    (entry,) = yaml.safe_load((ROOT / "deploy" / "kube-scheduler-config.yaml").read_text())["extenders"]
    return {**entry, "urlPrefix": url, "enableHTTPS": True, "tlsConfig": tls_config}


def test_kube_scheduler_with_enable_https_and_tls_config_filters_and_binds(
    https_extender: tuple[str, TlsFiles], tmp_path: Path
) -> None:
    url, tls = https_extender
    entry = scheduler_entry(url, caData=b64(tls.ca), certData=b64(tls.client_cert), keyData=b64(tls.client_key),
                            serverName="localhost")  # fmt: skip
    with kube_scheduler_client(entry, tmp_path) as client:
        request = json.loads((FIXTURES / "extender-filter-request-nodecache.json").read_text())
        answer = client.post(entry["filterVerb"], request)
        assert answer.status_code == 200 and answer.json()["NodeNames"] == ["gpu-node-a"]
        bind = json.loads((FIXTURES / "extender-bind-request.json").read_text())
        assert client.post(entry["bindVerb"], bind).json() == {"Error": ""}
    files = scheduler_entry(url, caFile=str(tls.ca), certFile=str(tls.client_cert), keyFile=str(tls.client_key))
    with kube_scheduler_client(files, tmp_path) as client:
        assert client.post(entry["filterVerb"], request).json()["NodeNames"] == ["gpu-node-a"]


def test_the_extender_refuses_callers_without_its_client_certificate(
    https_extender: tuple[str, TlsFiles], tmp_path: Path
) -> None:
    url, tls = https_extender
    no_client_cert = scheduler_entry(url, caData=b64(tls.ca))
    with kube_scheduler_client(no_client_cert, tmp_path) as client, pytest.raises(httpx.TransportError):
        client.post("filter", {})
    wrong_ca = scheduler_entry(url, caData=b64(tls.other_ca), certData=b64(tls.client_cert),
                               keyData=b64(tls.client_key))  # fmt: skip
    with kube_scheduler_client(wrong_ca, tmp_path) as client, pytest.raises(httpx.ConnectError, match="CERTIFICATE"):
        client.post("filter", {})
