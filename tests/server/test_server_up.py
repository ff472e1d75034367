"""`finesched up`: the port is checked before anything is written, and a data directory keeps its
admin token across restarts unless a new one is asked for."""

from __future__ import annotations

import signal
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
from server_harness import FINESCHED, free_port, wait_until


def up(data: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "0.5", "--quiet", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run_until_up(data: Path, port: int, *extra: str) -> str:
    """Start `up`, wait until its agent registered this machine, stop it with Ctrl-C; its output."""
    started = datetime.now(UTC)
    process = up(data, port, *extra)
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


def test_the_admin_token_is_kept_unless_a_new_one_is_asked_for(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    first = run_until_up(data, port)
    token = (data / "admin.token").read_text().strip()
    assert f"admin token: {token}  (new;" in first
    again = run_until_up(data, port)
    assert f"admin token: {token}  (kept from the last run" in again
    assert (data / "admin.token").read_text().strip() == token
    fresh = run_until_up(data, port, "--new-admin-token")
    assert (data / "admin.token").read_text().strip() != token and "(new;" in fresh
