"""`make run`: a one-machine finesched cluster running real, pinned processes, then a clean stop.

1. ``finesched up --fake-gpus 2:16Gi`` in the background (a fresh data directory, a free port on
   127.0.0.1; the node gets two simulated GPUs, so a GPU share can run on any machine);
2. submit ``examples/run-demo.yaml`` (workloads, one of them half a GPU, and a dataflow Job) with
   the admin token ``up`` wrote;
3. show each workload and job slot as it runs: phase, the cpuset the scheduler chose, the affinity
   the process really has and what the agent did with cgroups; then the job (`describe job`) and
   each one's output, fetched through the server (`finesched logs`);
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
        f"{name:<25} {status['phase']:<9} node={status.get('node') or binding.get('node') or '-'} "
        f"cpuset={cpuset} affinity={info.get('affinity', '-')} pid={info.get('pid', '-')}{exit_code} cgroup: {cgroup}"
    )


def cli(url: str, token: str, *args: str) -> None:
    """Run `finesched ARGS` against the demo's server and print it as a shell session would."""
    env = {**os.environ, "FINESCHED_SERVER": url, "FINESCHED_TOKEN": token, "COLUMNS": "120"}
    shown = subprocess.run([*FINESCHED, *args], capture_output=True, text=True, env=env)
    print(f"\n$ finesched {' '.join(args)}\n{(shown.stdout or shown.stderr).rstrip()}", flush=True)


def describe(key: str, url: str, token: str) -> None:
    """`finesched describe` of a running workload: its binding and what the agent applied."""
    cli(url, token, "describe", "workload", key)
    print(flush=True)


def submit(client: httpx.Client, docs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """PUT the Tenants (they own the namespaces), POST the Workloads (all at once) and each Job; (keys to
    watch: workloads and job slots, job keys)."""
    for tenant in (d for d in docs if d.get("kind") == "Tenant"):
        response = client.put(f"/v1/tenants/{tenant['metadata']['name']}", json=tenant)
        if response.status_code >= 400:
            raise SystemExit(f"tenant refused: {response.status_code} {response.text}")
    workloads = [d for d in docs if d.get("kind") == "Workload"]
    keys = [f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}" for d in workloads]
    response = client.post("/v1/workloads", json=workloads)
    if response.status_code >= 400:
        raise SystemExit(f"submit refused: {response.status_code} {response.text}")
    jobs = []
    for doc in (d for d in docs if d.get("kind") == "Job"):
        answer = client.post("/v1/jobs", json=doc)
        if answer.status_code >= 400:
            raise SystemExit(f"job refused: {answer.status_code} {answer.text}")
        jobs.append(answer.json()["job"])
        keys += [slot["workload"] for slot in answer.json()["slots"]]
    return keys, jobs


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
    print(f"$ finesched up --data {data} --port {port} --fake-gpus 2:16Gi", flush=True)
    up = subprocess.Popen(
        [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--interval", "1", "--quiet",
         "--fake-gpus", "2:16Gi"],
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
        gpus = [d["uuid"] for d in node["spec"].get("devices", []) if d["type"] == "gpu"]
        print(f"node GPUs (simulated: --fake-gpus): {', '.join(gpus)}", flush=True)
        names, jobs = submit(client, docs)
        print(f"submitted {', '.join(names)} from {args.manifest.relative_to(ROOT)}\n", flush=True)
        final = watch(client, names, lambda key: describe(key, url, token))
        for job in jobs:
            cli(url, token, "describe", "job", job)
        for key in names:
            cli(url, token, "logs", key)
        ok = all(final[k]["status"]["phase"] == "Succeeded" for k in names)
        ok = ok and all(client.get(f"/v1/jobs/{j}").json()["status"]["phase"] == "Succeeded" for j in jobs)
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
