"""``finesched k8s-extender`` as a process: --cluster manifests, or --kubeconfig pointing at the in-process API."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fakeapi import FakeAPI
from test_api import device_cr, k8s_node, nrt, pending_pod

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(*args: str) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "finesched.cli", "k8s-extender", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen([*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # bounded: 20 s at most
            if process.poll() is not None:
                raise AssertionError(process.stderr.read().decode() if process.stderr else "exited")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("the extender did not start")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def cluster_url() -> Iterator[str]:
    yield from serve("--cluster", str(HERE / "fixture-cluster.yaml"))


def test_cluster_mode_serves_the_verbs(cluster_url: str) -> None:
    request = json.loads((FIXTURES / "extender-filter-request-nodecache.json").read_text())
    body = httpx.post(f"{cluster_url}/filter", json=request).json()
    assert body["NodeNames"] == ["gpu-node-a"] and body["Error"] == ""
    bind = json.loads((FIXTURES / "extender-bind-request.json").read_text())
    assert httpx.post(f"{cluster_url}/bind", json=bind).json() == {"Error": ""}


def test_kubeconfig_mode_lists_the_cluster_and_binds_through_the_api(tmp_path: Path) -> None:
    with FakeAPI() as fake:
        for name in ("gpu-node-a", "gpu-node-b"):
            fake.put("nodes", k8s_node(name))
            fake.put("devices", device_cr(name))
            fake.put("noderesourcetopologies", nrt(name))
        fake.put("pods", pending_pod("train-resnet-0", "uid-0"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
                    "users": [{"name": "fake", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        for url in serve("--kubeconfig", str(kubeconfig)):
            request = {"Pod": fake.objects["pods"]["ml/train-resnet-0"], "NodeNames": ["gpu-node-a", "gpu-node-b"]}
            assert httpx.post(f"{url}/filter", json=request).json()["NodeNames"] == ["gpu-node-a", "gpu-node-b"]
            bind = {"PodName": "train-resnet-0", "PodNamespace": "ml", "PodUID": "uid-0", "Node": "gpu-node-b"}
            assert httpx.post(f"{url}/bind", json=bind, timeout=10).json() == {"Error": ""}
        pod = fake.objects["pods"]["ml/train-resnet-0"]
        assert pod["spec"]["nodeName"] == "gpu-node-b"
        assert "scheduling.koordinator.sh/device-allocated" in pod["metadata"]["annotations"]


def test_a_missing_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = subprocess.run(
        [sys.executable, "-m", "finesched.cli", "k8s-extender", "--kubeconfig", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and f"--kubeconfig {missing}: no such file" in result.stderr


def test_sources_are_exclusive(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "finesched.cli", "k8s-extender", "--in-cluster", "--cluster", "x.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "at most one of" in result.stderr
