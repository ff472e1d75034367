"""`finesched up`: the port is checked before anything is written, and a data directory keeps its
admin token across restarts unless a new one is asked for (or it was revoked)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
from server_harness import FINESCHED, free_port, wait_until

from finesched.commands.agent import check_port

__all__ = ["work_root"]  # the fixture: where the workloads' working directories go (--work-root)
from reachable import work_root


def up(data: Path, port: int, work_root: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "0.5", "--quiet",
         "--work-root", str(work_root), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run_until_up(data: Path, port: int, work_root: Path, *extra: str) -> str:
    """Start `up`, wait until its agent registered this machine, stop it with Ctrl-C; its output."""
    started = datetime.now(UTC)
    process = up(data, port, work_root, *extra)
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("admin token:"):
                break
        token = (data / "admin.token").read_text().strip()
        admin = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
        wait_until(lambda: _reported_since(admin, started), timeout=60, what="this run's agent to report")
        admin.close()
    finally:
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=60)[0]
    assert process.returncode == 0, "".join(lines) + rest
    return "".join(lines) + rest


def _reported_since(admin: httpx.Client, started: datetime) -> bool:
    beats = [n["status"]["heartbeat"] for n in admin.get("/v1/nodes").json()["items"]]
    return any(beat and datetime.fromisoformat(beat) > started for beat in beats)


def test_a_port_in_use_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        done = subprocess.run(
            [*FINESCHED, "up", "--data", str(data), "--port", str(port)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "finesched is up" not in done.stdout and "admin token" not in done.stdout
    assert not data.exists()  # nothing written: no database, no token, no log


def test_an_invalid_node_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run([*FINESCHED, "up", "--data", str(data), "--port", str(free_port()), "--node-name", "GPU_0"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "RFC 1123 subdomain" in done.stderr and not data.exists()


def test_the_admin_token_is_kept_unless_a_new_one_is_asked_for(tmp_path: Path, work_root: Path) -> None:
    data, port = tmp_path / "data", free_port()
    first = run_until_up(data, port, work_root)
    token = (data / "admin.token").read_text().strip()
    assert f"admin token: {token}  (new;" in first
    again = run_until_up(data, port, work_root)
    assert f"admin token: {token}  (kept from the last run" in again
    assert (data / "admin.token").read_text().strip() == token
    fresh = run_until_up(data, port, work_root, "--new-admin-token")
    assert (data / "admin.token").read_text().strip() != token and "(new;" in fresh
    token = (data / "admin.token").read_text().strip()
    db = f"sqlite:///{data / 'finesched.db'}"  # the kept token revoked meanwhile: up makes a new one
    listed = subprocess.run([*FINESCHED, "token", "list", "--db", db, "-o", "json"], capture_output=True, text=True)
    active = [str(t["id"]) for t in json.loads(listed.stdout) if t["role"] == "admin" and t["state"] == "Active"]
    assert subprocess.run([*FINESCHED, "token", "revoke", "--db", db, *active], capture_output=True).returncode == 0
    renewed = run_until_up(data, port, work_root)
    assert (data / "admin.token").read_text().strip() != token and "(new;" in renewed


def _pids_with(*words: str) -> list[int]:
    """Processes whose command line contains every one of `words` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(word in argv for word in words) and (entry / "stat").read_text().split()[2] != "Z":
                found.append(int(entry.name))
    return found


def _sleeping(seconds: int) -> list[int]:
    """The workload processes `sleep SECONDS` themselves (not the agent's wrapper shell around them)."""
    return [pid for pid in _pids_with("sleep", str(seconds)) if _argv(pid) == ["sleep", str(seconds)]]


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _running(admin: httpx.Client, key: str) -> bool:
    try:
        answer = admin.get(f"/v1/workloads/{key}")
    except httpx.HTTPError:  # the server is being restarted
        return False
    return answer.status_code == 200 and answer.json()["status"]["phase"] == "Running"


def _sleeper(name: str, seconds: int) -> dict[str, object]:
    return {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"requests": {"cpu": "100m", "memory": "32Mi"}, "command": ["sleep", str(seconds)]}}  # fmt: skip


def test_a_killed_control_plane_is_restarted_and_a_killed_up_takes_its_server_along(
    tmp_path: Path, work_root: Path
) -> None:
    """kill -9 of the server: `up` starts it again on the same data while the workloads run on; kill -9 of
    `up` itself: its server ends with it (the port is free for the next `up`) and the workloads run on."""
    data, port = tmp_path / "data", free_port()
    output = (tmp_path / "up.out").open("w")
    process = subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "0.5", "--quiet",
         "--work-root", str(work_root)],
        stdout=output, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    first, second = 3000 + port % 1000, 5000 + port % 1000  # sleep durations no other process has
    admin = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        wait_until(lambda: (data / "admin.token").exists(), timeout=60, what="up to write its admin token")
        admin.headers["Authorization"] = f"Bearer {(data / 'admin.token').read_text().strip()}"
        tenant = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "team-a"}}
        assert admin.post("/v1/tenants", json=tenant).status_code == 201
        assert admin.post("/v1/workloads", json=_sleeper("first", first)).status_code == 201
        wait_until(lambda: _running(admin, "team-a/first"), timeout=60, what="the first workload to run")
        [server] = _pids_with("finesched.cli", "serve", str(data))
        # Running = started; the command itself follows once its user is set up (agent/runas.py)
        wait_until(lambda: len(_sleeping(first)) == 1, timeout=30, what="the first workload's command")
        [workload] = _sleeping(first)

        os.kill(server, signal.SIGKILL)
        wait_until(lambda: _pids_with("finesched.cli", "serve", str(data)) not in ([], [server]), timeout=30,
                   what="up to start its server again")  # fmt: skip
        wait_until(lambda: _running(admin, "team-a/first"), timeout=60, what="the restarted server to answer")
        assert admin.post("/v1/workloads", json=_sleeper("second", second)).status_code == 201
        wait_until(lambda: _running(admin, "team-a/second"), timeout=60, what="a workload bound after the restart")
        assert _sleeping(first) == [workload]  # never stopped

        [restarted] = _pids_with("finesched.cli", "serve", str(data))
        process.kill()
        process.wait(timeout=30)
        wait_until(lambda: not _pids_with("finesched.cli", "serve", str(data)), timeout=30,
                   what="the server to end with its up")  # fmt: skip
        assert _sleeping(first) == [workload] and _sleeping(second)
        assert check_port("127.0.0.1", port) is None  # free for the next `up`
        log = (tmp_path / "up.out").read_text()
        assert f"the control plane (pid {server}) killed by SIGKILL; restarting it" in log
        assert f"the control plane restarted (pid {restarted}, restart 1)" in log
    finally:
        admin.close()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
        for pid in _sleeping(first) + _sleeping(second):
            os.kill(pid, signal.SIGKILL)
        output.close()


def test_up_serves_its_agents_logs_on_the_port_asked_for(tmp_path: Path, work_root: Path) -> None:
    """`up --logs-port P`, as `agent --logs-port P`: the agent serves workload output on P (reported
    to the server); a port in use, or the server's own, is refused before anything starts."""
    data, port, logs_port = tmp_path / "data", free_port(), free_port()
    started = datetime.now(UTC)
    process = up(data, port, work_root, "--logs-port", str(logs_port))
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith("admin token:"):
                break
        token = (data / "admin.token").read_text().strip()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as admin:
            wait_until(lambda: _reported_since(admin, started), timeout=60, what="the agent to report")
            (item,) = admin.get("/v1/nodes").json()["items"]
        assert item["status"]["report"]["discovery"]["logs"]["url"].endswith(f":{logs_port}")
        with socket.create_connection(("127.0.0.1", logs_port), timeout=5):
            pass  # the agent listens there
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        for asked in (busy, port):
            args = ["up", "--data", str(tmp_path / "other"), "--port", str(port), "--logs-port", str(asked)]
            refused = subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60)
            assert refused.returncode == 1 and f"--logs-port {asked}" in refused.stderr, refused.stderr
            assert not (tmp_path / "other").exists()
