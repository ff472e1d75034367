"""The rule for reading logs from agents' log ports, on its own: the refusal of plain HTTP to another
machine is decided from the URL, so no test has to reach one. End to end: tests/agent/test_agent_logs_tls.py,
and `finesched up --tls-cert` in test_server_tls.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from finesched.server.logs import AgentTrust
from tls_files import make_tls


@pytest.mark.parametrize(
    ("url", "insecure", "refused"),
    [
        pytest.param("http://127.0.0.1:10250", False, False, id="loopback"),
        pytest.param("http://127.3.4.5:10250", False, False, id="loopback-net"),
        pytest.param("http://[::1]:10250", False, False, id="loopback-v6"),
        pytest.param("http://localhost:10250", False, False, id="localhost"),
        pytest.param("https://10.0.0.5:10250", False, False, id="https-far"),
        pytest.param("https://gpu-2.example.org:10250", False, False, id="https-name"),
        pytest.param("http://10.0.0.5:10250", False, True, id="http-far"),
        pytest.param("http://[fd00::5]:10250", False, True, id="http-far-v6"),
        pytest.param("http://gpu-2.example.org:10250", False, True, id="http-name"),
        pytest.param("http://localhost.example.org:10250", False, True, id="http-lookalike"),
        pytest.param("http://10.0.0.5:10250", True, False, id="http-far-insecure"),
    ],
)
def test_a_grant_goes_in_clear_only_to_this_machine(url: str, insecure: bool, refused: bool) -> None:
    why = AgentTrust.load(insecure=insecure).refusal(url)
    assert (why is not None) == refused
    if why is not None:
        assert url in why and "--insecure-agent-logs" in why and "--tls-cert" in why


def test_the_local_certificate_is_trusted_on_loopback_only(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    trust = AgentTrust.load(ca=tls.ca, local_cert=tls.cert)
    assert trust.local is not None and not trust.local.check_hostname
    assert trust.context("https://127.0.0.1:1") is trust.local and trust.context("https://localhost:1") is trust.local
    assert trust.context("https://10.0.0.5:1") is trust.verify and trust.verify.check_hostname
    assert AgentTrust.load(ca=tls.ca).context("https://127.0.0.1:1").check_hostname  # no pin: names checked
