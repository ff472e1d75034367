"""What authenticating a request costs: authenticated GETs through a `finesched serve` subprocess.

    python bench/auth.py [--requests 20000] [--clients 4] [--calls 200000]

A fresh SQLite database, one admin token; `finesched serve` on 127.0.0.1. Then:

* **HTTP**: --requests GETs of `/ui/api/whoami` (the cheapest authenticated route: it only names the
  caller) from --clients threads, one keep-alive connection each, as fast as they go; requests/s,
  p50 and p99 latency from the client, and the server process's CPU time per request (/proc).
* **in process**: --calls look-ups of the same token in a `TokenCache` on the same database (the
  per-request work of `authenticate` after the header is read), mean microseconds per call; and how
  many of them reached the database (the token table), when the cache says so.

It prints one table and a JSON line. Compare runs on one machine only (see BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api import Server
from finesched.server.api.auth import TokenCache, create_token
from finesched.server.store.store import Store


def http_phase(server: Server, requests: int, clients: int) -> dict[str, Any]:
    """`requests` GETs of /ui/api/whoami over `clients` keep-alive connections."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = requests // clients

    def run() -> None:
        mine = []
        with httpx.Client(base_url=server.base, headers=server.headers, timeout=30) as client:
            for _ in range(per_client):
                started = time.perf_counter()
                answer = client.get("/ui/api/whoami")
                mine.append(time.perf_counter() - started)
                if answer.status_code != 200:
                    raise RuntimeError(f"whoami answered {answer.status_code}: {answer.text}")
        with lock:
            latencies.extend(mine)

    cpu_before = server.cpu_seconds()
    started = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    cpu = server.cpu_seconds() - cpu_before
    ms = np.array(latencies) * 1000
    return {
        "requests": len(latencies),
        "per_s": len(latencies) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "server_cpu_us_per_request": cpu / len(latencies) * 1e6,
    }


def cache_phase(db: str, token: str, calls: int) -> dict[str, Any]:
    """`calls` look-ups of one token in a TokenCache of its own (in this process)."""
    store = Store.open(db)
    try:
        cache = TokenCache(store)
        identify = getattr(cache, "verify", None) or cache.identify
        identify(token)  # the first look-up reads the database
        started = time.perf_counter()
        for _ in range(calls):
            identify(token)
        elapsed = time.perf_counter() - started
        reads = getattr(cache, "reads", None)
        return {"calls": calls, "us_per_call": elapsed / calls * 1e6, "db_reads": reads, "seconds": elapsed}
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/bench.db"
        store = Store.open(db)
        token = create_token(store, "admin")
        store.close()
        server = Server(db, token, f"{tmp}/serve.log", ["--data", tmp])
        try:
            server.wait_leader()
            server_figures = http_phase(server, args.requests // 10, args.clients)  # warm-up
            server_figures = http_phase(server, args.requests, args.clients)
        finally:
            server.stop()
        cache_figures = cache_phase(db, token, args.calls)
    print(f"{'phase':<10} {'figure':<32} {'value':>12}")
    for name, value in server_figures.items():
        print(f"{'http':<10} {name:<32} {value:>12.2f}")
    for name, value in cache_figures.items():
        shown = "-" if value is None else f"{value:.2f}"
        print(f"{'cache':<10} {name:<32} {shown:>12}")
    print(json.dumps({"http": server_figures, "cache": cache_figures}))


if __name__ == "__main__":
    main()
