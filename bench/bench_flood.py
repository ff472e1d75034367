"""Fairness under one tenant's flood, through the real HTTP API of a `finesched serve` subprocess (SQLite).

    python bench/bench_flood.py --scale 1.0      # 100,000 workloads, 3,000 watches (the issue's figures)
    python bench/bench_flood.py --scale 0.1      # a tenth of both

Tenant A holds `3000 x scale` SSE watches (`--full-watches` of them follow every event A may see,
the others A's own Tenant events: open streams that the old server polled the database for, each)
and submits `100000 x scale` workloads in lists of 1,000 from two clients; they ask for more CPU
than any node has, so they stay Pending in A's queue. Meanwhile tenant B, on a node registered
through the API, reads (`GET /v1/workloads?limit=100` and one workload) and submits one workload
every 0.5 s, timing submit -> Bound (polled). Then A deletes its namespace with one bulk delete.
Printed: p50/p99 of B's reads and submit->Bound before, during and after the flood, the flood's
rate, the bulk delete's time, and the server's RSS (VmRSS of the process) before, during, after the
flood, after the delete, and `--settle` seconds later. The server runs with its watch caps raised to
hold A's watches (the default caps would refuse all but 10 of them with 429;
tests/server/test_server_watch_hub.py checks that). Run it with PYTHONMALLOC=malloc in the environment
to measure a server whose objects are all in glibc's heap (server/loop/memory.py says why it matters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import numpy as np

from finesched.server.api.auth import create_token
from finesched.server.store.store import Store

API = "finesched.io/v1alpha1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def workload(name: str, namespace: str, cpu: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Workload", "metadata": {"name": name, "namespace": namespace},
            "spec": {"requests": {"cpu": cpu, "memory": "64Mi"}}}  # fmt: skip


def tenant_tokens(store: Store, names: tuple[str, ...]) -> list[str]:
    """A token for each tenant of `names`, created first (a tenant's token needs its tenant)."""
    for name in names:
        store.put_tenant(
            name, 1.0, {"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}}, create_only=False
        )
    return [create_token(store, "tenant", tenant=name) for name in names]


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    ms = np.array(samples) * 1000
    return {"n": len(samples), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "max_ms": round(float(ms.max()), 1)}  # fmt: skip


class TenantB:
    """B's reads and submissions, timed, in a thread until stopped."""

    def __init__(self, base: str, token: str):
        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        self.reads: list[float] = []
        self.bound: list[float] = []
        self.errors = 0
        self.seq = 0

    def read_once(self) -> None:
        for path, params in (("/v1/workloads", {"limit": 100}), ("/v1/workloads/team-b/b-0", None)):
            started = time.perf_counter()
            answer = self.client.get(path, params=params)
            self.reads.append(time.perf_counter() - started)
            if answer.status_code >= 500:
                self.errors += 1

    def submit_once(self) -> None:
        name = f"b-{self.seq}"
        self.seq += 1
        started = time.perf_counter()
        answer = self.client.post("/v1/workloads", json=workload(name, "team-b", "10m"))
        if answer.status_code != 201:
            self.errors += 1
            return
        while time.perf_counter() - started < 120:
            phase = self.client.get(f"/v1/workloads/team-b/{name}").json()["status"]["phase"]
            if phase == "Bound":
                self.bound.append(time.perf_counter() - started)
                return
            time.sleep(0.01)
        self.errors += 1

    def run(self, stop: threading.Event) -> None:
        last_submit = 0.0
        while not stop.is_set():
            self.read_once()
            if time.monotonic() - last_submit >= 0.5:
                last_submit = time.monotonic()
                self.submit_once()
            time.sleep(0.05)

    def take(self) -> dict[str, Any]:
        out = {"reads": percentiles(self.reads), "submit_to_bound": percentiles(self.bound), "errors": self.errors}
        self.reads, self.bound, self.errors = [], [], 0
        return out


def hold_watches(base: str, tokens: list[str], full: int, ready: threading.Event, stop: threading.Event,
                 counts: dict[str, int]) -> None:  # fmt: skip
    """A's watches: `full` unfiltered, the rest on A's own Tenant events; read and counted until `stop`."""

    async def one(client: httpx.AsyncClient, token: str, params: dict[str, str]) -> None:
        try:
            async with client.stream("GET", "/v1/events/watch", params=params,
                                     headers={"Authorization": f"Bearer {token}"}) as response:  # fmt: skip
                counts[str(response.status_code)] = counts.get(str(response.status_code), 0) + 1
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        counts["events"] = counts.get("events", 0) + 1
                    elif line.startswith(": this watch fell"):
                        counts["overflowed"] = counts.get("overflowed", 0) + 1
        except (httpx.HTTPError, asyncio.CancelledError):
            pass

    async def main() -> None:
        limits = httpx.Limits(max_connections=len(tokens) + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(None, connect=60), limits=limits) as client:
            tasks = []
            for i, token in enumerate(tokens):
                params = {} if i < full else {"kind": "Tenant"}
                tasks.append(asyncio.ensure_future(one(client, token, params)))
                if i % 100 == 99:
                    await asyncio.sleep(0.05)
            while sum(v for k, v in counts.items() if k.isdigit()) < len(tokens):
                await asyncio.sleep(0.1)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.2)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.1, help="1.0: 100,000 workloads and 3,000 watches")
    parser.add_argument("--full-watches", type=int, default=20, help="A's watches that follow every event it sees")
    parser.add_argument("--batch", type=int, default=1000, help="workloads per request of A (at most 1000)")
    parser.add_argument("--settle", type=float, default=35.0,
                        help="seconds after the delete (B still working) before RSS is read once more")  # fmt: skip
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    n_workloads = int(100_000 * args.scale)
    n_watches = int(3000 * args.scale)
    tmp = tempfile.mkdtemp(prefix="finesched-flood-")
    db = f"sqlite:///{tmp}/flood.db"
    store = Store.open(db)
    admin = create_token(store, "admin")
    token_a, token_b = tenant_tokens(store, ("team-a", "team-b"))
    store.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(f"{tmp}/serve.log", "wb")  # noqa: SIM115 - closed at the end
    cmd = [sys.executable, "-m", "finesched.cli", "serve", "--db", db, "--port", str(port), "--log-level", "warning",
           "--watch-per-token", str(n_watches + 10), "--max-watches", str(n_watches + 100),
           "--max-connections", str(n_watches + 1000)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    machine = {"nproc": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version()}
    figures: dict[str, Any] = {"workloads": n_workloads, "watches": n_watches, "full_watches": args.full_watches,
                               "machine": machine}  # fmt: skip
    try:
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=300)
        deadline = time.monotonic() + 60
        while True:
            try:
                if http.get("/readyz").json().get("leader"):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start (see its log)")
            time.sleep(0.2)
        node = {"apiVersion": API, "kind": "Node", "metadata": {"name": "b-node"},
                "spec": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": 5000}}}  # fmt: skip
        assert http.post("/v1/nodes", json=node).status_code == 201
        b = TenantB(base, token_b)
        b.client.post("/v1/workloads", json=workload("b-0", "team-b", "10m"))
        b.seq = 1
        time.sleep(1.0)
        figures["rss_mb"] = {"before": round(rss_mb(proc.pid), 1)}
        stop_b = threading.Event()
        thread_b = threading.Thread(target=b.run, args=(stop_b,), daemon=True)
        thread_b.start()
        time.sleep(5)
        figures["b_before"] = b.take()

        ready, stop_watches, counts = threading.Event(), threading.Event(), {}
        watches = threading.Thread(target=hold_watches, args=(base, [token_a] * n_watches, args.full_watches, ready,
                                                              stop_watches, counts), daemon=True)  # fmt: skip
        started = time.monotonic()
        watches.start()
        ready.wait(timeout=600)
        figures["watches_open_s"] = round(time.monotonic() - started, 1)
        time.sleep(3)
        figures["b_with_watches"] = b.take()
        figures["rss_mb"]["with_watches"] = round(rss_mb(proc.pid), 1)

        peak = [0.0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], rss_mb(proc.pid))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        a = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token_a}"}, timeout=600)
        refused = [0]

        def flood(part: int) -> None:
            client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token_a}"}, timeout=600)
            for start in range(part * args.batch, n_workloads, 2 * args.batch):
                batch = [
                    workload(f"a-{i}", "team-a", "1000") for i in range(start, min(n_workloads, start + args.batch))
                ]
                if client.post("/v1/workloads", json=batch).status_code != 201:
                    refused[0] += 1

        started = time.monotonic()
        flooders = [threading.Thread(target=flood, args=(p,)) for p in range(2)]
        for thread in flooders:
            thread.start()
        for thread in flooders:
            thread.join()
        took = time.monotonic() - started
        figures["flood"] = {"seconds": round(took, 1), "per_second": round(n_workloads / took), "refused": refused[0]}
        figures["b_during_flood"] = b.take()
        sampling.set()
        figures["rss_mb"]["flood_peak"] = round(peak[0], 1)
        time.sleep(3)
        figures["rss_mb"]["after_flood"] = round(rss_mb(proc.pid), 1)
        time.sleep(5)
        figures["b_after_flood"] = b.take()

        started = time.monotonic()
        deleted = a.delete("/v1/workloads", params={"namespace": "team-a"}).json()
        figures["bulk_delete"] = {"deleted": deleted.get("deleted"), "seconds": round(time.monotonic() - started, 1)}
        figures["b_during_delete"] = b.take()
        stop_watches.set()
        watches.join(timeout=60)
        figures["watch_streams"] = counts
        time.sleep(5)
        figures["rss_mb"]["after_delete"] = round(rss_mb(proc.pid), 1)
        figures["b_after_delete"] = b.take()
        time.sleep(args.settle)  # the leader trims what was freed since (server/loop/memory.py: every 30 s)
        figures["rss_mb"]["after_delete_settled"] = round(rss_mb(proc.pid), 1)
        stop_b.set()
        thread_b.join(timeout=130)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    print_figures(figures, args.json)


def print_figures(figures: dict[str, Any], path: str | None) -> None:
    """The figures on stdout as JSON, and into `path` too when given."""
    print(json.dumps(figures, indent=2))
    if path:
        with open(path, "w") as out:
            json.dump(figures, out, indent=2)


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
