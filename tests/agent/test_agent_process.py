"""The agent and `finesched up` as real processes: SIGKILL and restart, start and clean stop, logs."""

from __future__ import annotations

import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from agent_cluster import NODE, Cluster, wait
from pool_probe import CPUS, all_on, command, pids
from typer.testing import CliRunner

from finesched.agent.executor import rundir_of
from finesched.cli import app
from finesched.codec import decode
from finesched.cpuset import CPUSet
from reachable import SYSTEM_PYTHON, skip_without_bwrap

FINESCHED = [sys.executable, "-m", "finesched.cli"]


def start_agent(cluster: Cluster, data: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = ["agent", "--server", cluster.url, "--token", cluster.agent_token, "--node-name", NODE,
            "--data", str(data), "--work-root", str(cluster.work_root), "--interval", "0.5", "--watch", "0.1",
            "--quiet", *extra]  # fmt: skip
    return subprocess.Popen([*FINESCHED, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_sigkilled_agent_restarts_and_adopts_its_child(tmp_path: Path, sandbox: str) -> None:
    """The sandbox ends with the root wrapper that started it (--die-with-parent), not with the agent:
    a killed agent's workload runs on, and the next agent adopts it and reads its exit code."""
    if sandbox == "bwrap":
        skip_without_bwrap()
    cluster = Cluster(tmp_path)
    data = tmp_path / "agent"
    first = start_agent(cluster, data, "--sandbox", sandbox)
    try:
        wait(lambda: cluster.admin.get(f"/v1/nodes/{NODE}").status_code == 200, "the agent to register")
        # waits for `go` in its working directory: the one place the test and a sandboxed workload share
        body = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.05)\nraise SystemExit(4)"
        cluster.submit("long", [SYSTEM_PYTHON, "-c", body], {"cpu": "1"}, limits={"cpu": "1"})
        wait(lambda: cluster.workload("long")["status"]["phase"] == "Running", "the workload to run")
        pid = cluster.workload("long")["status"]["info"]["pid"]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert alive(pid)  # the child outlives its agent
        second = start_agent(cluster, data, "--sandbox", sandbox)
        try:
            (Path(cluster.workload("long")["status"]["info"]["workdir"]) / "go").touch()
            wait(lambda: cluster.workload("long")["status"]["phase"] in ("Succeeded", "Failed"), "the end report")
            w = cluster.workload("long")
            assert (w["status"]["phase"], w["status"]["info"]["exitCode"], w["status"]["info"]["pid"]) == (
                "Failed", 4, pid
            )  # fmt: skip
            events = cluster.admin.get("/v1/events", params={"since": 0}).json()["items"]
            assert not [e for e in events if e["object"] == "t/long" and "rejected" in e["message"]]
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0, second.stderr.read() if second.stderr else ""
    finally:
        if first.poll() is None:
            first.kill()
        cluster.close()


def test_sigkilled_agent_restarts_and_puts_adopted_workloads_back_in_their_pools(tmp_path: Path) -> None:
    """LS moved out for an LSE; the agent is killed; the LSE is deleted while it is down; the new
    agent stops the LSE's process and gives its CPU back to the LS workload it adopted."""
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    cluster = Cluster(tmp_path)
    data = tmp_path / "agent"
    agents = [start_agent(cluster, data)]
    whole = {"cpu": "1", "memory": "64Mi"}
    try:
        cluster.submit("web", command(cluster.exchange / "web"), {"cpu": "100m"})
        web = pids(cluster.exchange / "web")
        cluster.submit("db", ["sleep", "600"], whole, limits=whole, qos="LSE")
        wait(lambda: cluster.workload("db")["status"]["phase"] == "Running", "the LSE to run")
        held = CPUSet(cluster.workload("db")["status"]["binding"]["cpuset"])
        db_pid = cluster.workload("db")["status"]["info"]["pid"]
        wait(lambda: all_on(web) == {(CPUSet(CPUS) - held).format()}, "the LS threads to leave the LSE's CPU")
        agents[0].send_signal(signal.SIGKILL)
        agents[0].wait(timeout=10)
        assert cluster.admin.delete("/v1/workloads/t/db").status_code == 200  # while the agent is down
        agents.append(start_agent(cluster, data))
        wait(lambda: all_on(web) == {CPUSet(CPUS).format()}, "the adopted LS workload to grow back")
        wait(lambda: not alive(db_pid), "the deleted LSE's process to be stopped")
        assert cluster.workload("web")["status"]["info"]["pid"] == web[0] or alive(web[0])  # adopted, not restarted
        assert cluster.admin.delete("/v1/workloads/t/web").status_code == 200
        wait(lambda: not alive(web[0]), "the LS workload to be stopped")
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=30)
        cluster.close()


GPU_ENV = 'echo "$NVIDIA_VISIBLE_DEVICES sm=$CUDA_DEVICE_SM_LIMIT mem=$CUDA_DEVICE_MEMORY_LIMIT_0"; sleep 2'


def test_up_with_fake_gpus_runs_a_gpu_share_and_shows_its_logs(tmp_path: Path, work_root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data, url = tmp_path / "up", f"http://127.0.0.1:{port}"
    up = subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "0.5", "--fake-gpus", "2:8Gi",
         "--work-root", str(work_root)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        token_file = data / "admin.token"
        wait(lambda: token_file.is_file() and token_file.read_text().strip() != "", "admin.token", timeout=60)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(data.stat().st_mode) == 0o700
        token = token_file.read_text().strip()
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
        wait(lambda: len(client.get("/v1/nodes").json()["items"]) == 1, "this machine's node", timeout=60)
        node = client.get("/v1/nodes").json()["items"][0]
        assert node["spec"]["cpuTopology"]["cpus"] and node["status"]["ready"]
        gpus = node["spec"]["devices"]
        assert [(g["uuid"], g["labels"]) for g in gpus] == [
            (f"GPU-SIMULATED-000{i}", {"finesched.io/simulated": "true"}) for i in range(2)
        ]  # fmt: skip
        tenant = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t"}}
        assert client.post("/v1/tenants", json=tenant).status_code == 201  # owns namespace t
        share = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
                 "metadata": {"name": "gpu", "namespace": "t"},
                 "spec": {"requests": {"cpu": "100m", "gpu-core": 50, "gpu-memory-ratio": 50},
                          "command": ["sh", "-c", GPU_ENV]}}  # fmt: skip
        assert client.post("/v1/workloads", json=share).status_code == 201
        wait(lambda: client.get("/v1/workloads/t/gpu").json()["status"]["phase"] == "Running", "the share to run")

        def accounted() -> bool:  # the agent's report holds the share: 50 of one GPU's core left
            report = client.get(f"/v1/nodes/{node['metadata']['name']}").json()["status"]["report"]
            return sorted(decode(**report["devices"]["gpu"]["gpu-core"])) == [50, 100]

        wait(accounted, "the share in the node's report")
        described = CliRunner().invoke(app, ["describe", "node", node["metadata"]["name"], "--server", url,
                                             "--token", token])  # fmt: skip
        assert described.exit_code == 0 and "SIMULATED" in described.stdout
        wait(lambda: client.get("/v1/workloads/t/gpu").json()["status"]["phase"] == "Succeeded", "the share to end")
        shown = CliRunner().invoke(app, ["logs", "t/gpu", "--server", url, "--token", token])
        assert shown.exit_code == 0 and shown.stdout.startswith("GPU-SIMULATED-000")
        assert shown.stdout.split()[1:] == ["sm=50", f"mem={4 * 2**30}"]
        client.close()
    finally:
        up.send_signal(signal.SIGINT)
        output = up.communicate(timeout=60)[0]
    assert up.returncode == 0, output
    assert f"finesched is up: {url}" in output and token in output
    assert "2 SIMULATED GPU(s)" in output and "SIMULATED GPUs: 2 simulated GPU(s) of 8Gi" in output
    assert output.rstrip().endswith("finesched stopped")


@pytest.mark.parametrize("value", ["0", "two", "2:lots", "100", "2:0"])
def test_up_refuses_bad_fake_gpus(value: str) -> None:
    result = CliRunner().invoke(app, ["up", "--fake-gpus", value])
    assert result.exit_code == 2 and "--fake-gpus" in result.output


def test_logs_prints_the_workload_output(tmp_path: Path) -> None:
    log = rundir_of(tmp_path / "agent", "team/w1") / "output.log"
    log.parent.mkdir(parents=True)
    log.write_text("line one\nline two\n")
    runner = CliRunner()
    shown = runner.invoke(app, ["logs", "w1", "-n", "team", "--data", str(tmp_path)])
    assert shown.exit_code == 0 and shown.stdout == "line one\nline two\n"
    assert runner.invoke(app, ["logs", "team/w1", "--data", str(tmp_path)]).stdout == "line one\nline two\n"
    missing = runner.invoke(app, ["logs", "nope", "--data", str(tmp_path)])
    assert missing.exit_code == 1 and "no log for default/nope" in missing.output


def test_agent_rejects_a_bad_label() -> None:
    result = CliRunner().invoke(app, ["agent", "--server", "http://x", "--token", "t", "--label", "novalue"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_agent_with_a_bad_token_exits_with_one_line(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        args = ["agent", "--server", cluster.url, "--token", "fs_wrong", "--node-name", NODE, "--data", str(tmp_path),
                "--work-root", str(cluster.work_root)]  # fmt: skip
        done = subprocess.run([*FINESCHED, *args, "-q"], capture_output=True, text=True, timeout=60)
    finally:
        cluster.close()
    assert done.returncode == 1
    assert "the server refused this agent: 401" in done.stderr and "Traceback" not in done.stderr
