"""`make run`: a one-machine finesched cluster running real, pinned processes, then a clean stop.

1. ``finesched up`` in the background (a fresh data directory, a free port on 127.0.0.1);
2. submit ``examples/run-demo.yaml`` with the admin token ``up`` wrote;
3. show each workload as it runs: phase, the cpuset the scheduler chose, the affinity the process
   really has and what the agent did with cgroups; then each workload's output;
4. stop ``up`` (workloads, agent, server) with SIGINT and wait for it.

Usage: python scripts/run_demo.py [--manifest FILE] [--keep DIR]. Exit 0 when every workload
succeeded; the temporary data directory is removed then, and kept for a look otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
DONE = ("Succeeded", "Failed", "Rejected")
FINESCHED = [sys.executable, "-m", "finesched.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_file(path: Path, up: subprocess.Popen[bytes], timeout: float = 90.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if up.poll() is not None:
            raise SystemExit(f"finesched up exited with code {up.returncode}")
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.2)
    raise SystemExit(f"no {path} after {timeout:.0f}s")


def row(w: dict[str, Any]) -> str:
    """One line: phase, node, the binding's cpuset, the process's real affinity, exit code, cgroup."""
    status = w["status"]
    binding = status.get("binding") or {}
    info = status.get("info") or {}
    cgroup = info.get("cgroup", "-")
    if isinstance(cgroup, dict):
        cgroup = ", ".join(f"{k}={v}" for k, v in cgroup.items() if k != "path")
    cpuset = binding.get("cpuset") or info.get("cpuset") or "-"
    if "cpusetSource" in info:
        cpuset += " (shared pool)"
    name = f"{w['metadata']['namespace']}/{w['metadata']['name']}"
    exit_code = f" exit={info['exitCode']}" if "exitCode" in info else ""
    return (
        f"{name:<13} {status['phase']:<9} node={status.get('node') or binding.get('node') or '-'} "
        f"cpuset={cpuset} affinity={info.get('affinity', '-')} pid={info.get('pid', '-')}{exit_code} cgroup: {cgroup}"
    )


def describe(key: str, url: str, token: str) -> None:
    """`finesched describe` of a running workload: its binding and what the agent applied."""
    env = {**os.environ, "FINESCHED_SERVER": url, "FINESCHED_TOKEN": token, "COLUMNS": "120"}
    shown = subprocess.run([*FINESCHED, "describe", "workload", key], capture_output=True, text=True, env=env)
    print(f"\n$ finesched describe workload {key}\n{(shown.stdout or shown.stderr).rstrip()}\n", flush=True)


def watch(
    client: httpx.Client, names: list[str], on_running: Callable[[str], None], timeout: float = 120.0
) -> dict[str, dict[str, Any]]:
    """Print each workload whenever its phase changes, until all are done; `on_running` once for the first."""
    seen: dict[str, str] = {}
    latest: dict[str, dict[str, Any]] = {}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for key in names:
            response = client.get(f"/v1/workloads/{key}")
            response.raise_for_status()
            w = response.json()
            latest[key] = w
            phase = w["status"]["phase"]
            if seen.get(key) != phase:
                seen[key] = phase
                print(row(w), flush=True)
                if phase == "Running" and key == names[0]:
                    on_running(key)
        if all(seen.get(k) in DONE for k in names):
            return latest
        time.sleep(0.3)
    raise SystemExit(f"workloads not done after {timeout:.0f}s: {seen}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=ROOT / "examples" / "run-demo.yaml")
    parser.add_argument("--keep", type=Path, help="Use (and keep) this data directory.")
    args = parser.parse_args()
    data = args.keep or Path(tempfile.mkdtemp(prefix="finesched-demo-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    up_log = (data / "up.log").open("wb") if data.is_dir() else None
    if up_log is None:
        data.mkdir(parents=True)
        up_log = (data / "up.log").open("wb")
    print(f"$ finesched up --data {data} --port {port}", flush=True)
    up = subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "1", "--quiet"],
        stdout=up_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    ok = False
    try:
        token = wait_for_file(data / "admin.token", up)
        print(f"server {url} is up; admin token in {data / 'admin.token'}", flush=True)
        docs = [d for d in yaml.safe_load_all(args.manifest.read_text()) if d]
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        end = time.monotonic() + 60
        while not client.get("/v1/nodes").json().get("items"):  # the agent registers right after up
            if time.monotonic() > end:
                raise SystemExit("no node registered within 60s")
            time.sleep(0.2)
        node = client.get("/v1/nodes").json()["items"][0]
        print(f"node {node['metadata']['name']}: {json.dumps(node['spec'].get('allocatable'))}", flush=True)
        for tenant in (d for d in docs if d["kind"] == "Tenant"):  # the tenants own the namespaces
            response = client.put(f"/v1/tenants/{tenant['metadata']['name']}", json=tenant)
            if response.status_code >= 400:
                raise SystemExit(f"tenant refused: {response.status_code} {response.text}")
        docs = [d for d in docs if d["kind"] == "Workload"]
        response = client.post("/v1/workloads", json=docs)
        if response.status_code >= 400:
            raise SystemExit(f"submit refused: {response.status_code} {response.text}")
        names = [f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}" for d in docs]
        print(f"submitted {', '.join(names)} from {args.manifest.relative_to(ROOT)}\n", flush=True)
        final = watch(client, names, lambda key: describe(key, url, token))
        for key in names:
            log = subprocess.run([*FINESCHED, "logs", key, "--data", str(data)], capture_output=True, text=True)
            print(f"\n$ finesched logs {key}\n{(log.stdout or log.stderr).rstrip()}", flush=True)
        ok = all(final[k]["status"]["phase"] == "Succeeded" for k in names)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        up_log.close()
        print(f"\nstopped (finesched up exit code {up.returncode})", flush=True)
    if ok and args.keep is None:
        shutil.rmtree(data, ignore_errors=True)
    elif not ok:
        print(f"kept {data} for a look (up.log, server.log, agent/)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
