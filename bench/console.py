"""The web console and POST /v1/plan at 10,000 nodes: time to first paint, and what-if latency.

    python bench/console.py [--nodes 10000] [--workloads 20000] [--runs 5] [--screenshots docs/]

A fresh SQLite database gets --nodes synthetic nodes (bench/synthetic.py: 30 % GPU nodes with 8 GPUs
and 2 NICs, 32-128 logical CPUs) registered through the store; `finesched serve` runs on 127.0.0.1
and rebuilds its state from it; --workloads workloads (scalar, GPU shares, a tenth exclusive LSE
cpusets, over 4 tenants) are submitted through the API and bound, and a few that fit nowhere wait;
12 nodes are NotReady (no agent) and 25 cordoned.
Then, with Debian's chromium headless (Playwright, the system browser) on this same machine:

* **overview** and **node page** (a GPU node given ten more workloads of every kind, and an agent
  report, so that its page draws every kind of holder): each page loaded --runs
  times in a fresh tab of a signed-in session; per load the browser's first contentful paint (the
  page shell), "rendered" (the page's data in the DOM) and "painted" (two animation frames later:
  on screen), from navigation start. The first load of each is reported apart (cold caches).
* **/ui/api** round trips for the two pages' data, from a client in this process.
* **POST /v1/plan** with 100 new workloads (the same mix), --runs times: latency from the client;
  and, in this process on the same cluster through server/what_if.py itself, how long each dry run
  holds the scheduling loop's lock (its snapshot of the live state) and takes in all.

It prints one table and a JSON line; --screenshots DIR writes console-overview.png and
console-node.png (the README's screenshots).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api import Server, fresh_database, register_nodes
from finesched.codec import bits_for, encode
from finesched.model.manifest import to_manifest
from finesched.server.api.auth import create_token
from finesched.server.store.store import Store
from synthetic import scalar_workloads

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]  # fmt: skip
SHARES = (
    {"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory-ratio": 25},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 30, "koordinator.sh/gpu-memory": "8Gi"},
    {"nvidia.com/gpu": 1},
)


def workload_mix(count: int, prefix: str, seed: int) -> list[dict[str, Any]]:
    """Scalar workloads; 30 % with a GPU share or a whole GPU, 10 % LSE with 2-8 whole CPUs."""
    rng = np.random.default_rng(seed)
    out = []
    for i, workload in enumerate(scalar_workloads(count, seed=seed, selector_share=0.0)):
        doc = to_manifest(workload)
        doc["metadata"]["name"] = f"{prefix}-{i:06d}"
        roll = rng.random()
        if roll < 0.3:
            doc["spec"]["requests"] = {"cpu": "1", "memory": "4Gi", **SHARES[int(rng.integers(len(SHARES)))]}
        elif roll < 0.4:
            cpus = str(int(rng.choice([2, 4, 8])))
            doc["spec"]["requests"] = doc["spec"]["limits"] = {"cpu": cpus, "memory": "8Gi"}
            doc["spec"]["qos"] = "LSE"
        out.append(doc)
    return out


def showcase(node: str) -> list[dict[str, Any]]:
    """Workloads pinned to one GPU node, so its page shows every kind of holder: GPU shares and whole
    GPUs, LSE and LSR cpusets, LS and BE workloads in the shared pools."""
    shapes = [
        ("infer-a", {"cpu": "2", "memory": "8Gi", **SHARES[1]}, {}),
        ("infer-b", {"cpu": "1", "memory": "4Gi", **SHARES[0]}, {}),
        ("infer-c", {"cpu": "1", "memory": "4Gi", **SHARES[2]}, {}),
        ("train", {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 2}, {}),
        ("db", {"cpu": "8", "memory": "32Gi"}, {"qos": "LSE", "limits": {"cpu": "8", "memory": "32Gi"}}),
        ("cache", {"cpu": "4", "memory": "16Gi"}, {"qos": "LSE", "limits": {"cpu": "4", "memory": "16Gi"}}),
        ("feature-store", {"cpu": "6", "memory": "16Gi"}, {"qos": "LSR", "limits": {"cpu": "6", "memory": "16Gi"}}),
        ("web", {"cpu": "2", "memory": "4Gi"}, {}),
        ("crawler", {"cpu": "2", "memory": "2Gi"}, {"qos": "BE"}),
        ("backfill", {"cpu": "4", "memory": "8Gi"}, {"qos": "BE"}),
    ]
    return [
        {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
         "metadata": {"name": name, "namespace": f"team-{i % 4}"},
         "spec": {"requests": requests, **extra, "nodeSelector": {"finesched.io/hostname": node}}}
        for i, (name, requests, extra) in enumerate(shapes)
    ]  # fmt: skip


def report_as_agent(client: httpx.Client, url: str, node: str, stop: threading.Event) -> threading.Thread:
    """Report for `node` every 3 s as its agent would (every device dimension's free amounts, S0.2
    encoded), until `stop`: the node stays Ready and its page shows the report."""
    store = Store.open(url)
    try:
        agent = create_token(store, "agent", node=node)
    finally:
        store.close()
    page = client.get(f"/ui/api/nodes/{node}").json()
    free: dict[str, dict[str, list[int]]] = {}
    for device in page["devices"]:  # minor order, per type
        for dim, amount in device["free"].items():
            free.setdefault(device["type"], {}).setdefault(dim, []).append(amount)
    devices = {kind: {dim: {"k": encode(v, bits_for(max(v))), "count": len(v), "bits": bits_for(max(v))}
                      for dim, v in dims.items()} for kind, dims in free.items()}  # fmt: skip
    headers = {"Authorization": f"Bearer {agent}"}

    def beat() -> None:
        with httpx.Client(base_url=client.base_url, headers=headers, timeout=30) as own:
            while not stop.is_set():
                own.post(f"/v1/nodes/{node}/report", json={"devices": devices})
                stop.wait(3.0)

    thread = threading.Thread(target=beat, name="bench-agent", daemon=True)
    thread.start()
    return thread


def fill(docs: list[dict[str, Any]], client: httpx.Client, timeout: float = 600.0) -> float:
    """Submit `docs` in lists of 1,000 and wait until the scheduler decided them all (no more waiting
    than before); the seconds it took."""
    before = client.get("/ui/api/overview").json()["pending"]["total"]
    started = time.perf_counter()
    for i in range(0, len(docs), 1000):
        client.post("/v1/workloads", json=docs[i : i + 1000]).raise_for_status()
    while (waiting := client.get("/ui/api/overview").json()["pending"]["total"]) > before:
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{waiting - before} of the workloads still wait after {timeout:.0f} s")
        time.sleep(1.0)
    return time.perf_counter() - started


def page_times(browser: Any, base: str, token: str, path: str, runs: int) -> list[dict[str, float]]:
    """Per load of `path` in a fresh tab: first contentful paint, rendered and painted (ms from navigation)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(f"sessionStorage.setItem('finesched.token', {json.dumps(token)})")
    out = []
    for _ in range(runs):
        page = context.new_page()
        page.goto(base + path)
        page.locator("body[data-rendered]").wait_for(state="attached", timeout=120_000)
        page.wait_for_timeout(300)  # the "painted" mark comes two frames later
        marks = page.evaluate(
            """() => Object.fromEntries([
                ...performance.getEntriesByType('paint').map(e => [e.name, e.startTime]),
                ...performance.getEntriesByType('mark').map(e => [e.name, e.startTime])])"""
        )
        nan = float("nan")
        out.append({"fcp": marks.get("first-contentful-paint", nan), "rendered": marks["finesched-rendered"],
                    "painted": marks.get("finesched-painted", nan)})  # fmt: skip
        page.close()
    context.close()
    return out


def screenshot(browser: Any, base: str, token: str, path: str, file: str) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(f"sessionStorage.setItem('finesched.token', {json.dumps(token)})")
    page = context.new_page()
    page.goto(base + path)
    page.locator("body[data-rendered]").wait_for(state="attached", timeout=120_000)
    page.wait_for_timeout(500)
    page.screenshot(path=file, full_page=True)
    context.close()


class TimedLock:
    """The loop's lock, timing how long each holder keeps it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.held: list[float] = []

    def __enter__(self) -> None:
        self.lock.acquire()
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.held.append(1000 * (time.perf_counter() - self.started))
        self.lock.release()


def fork_times(nodes: int, docs: list[dict[str, Any]], plans: list[list[dict[str, Any]]]) -> dict[str, list[float]]:
    """POST /v1/plan's work in this process, through server/what_if.py itself, on the same synthetic
    cluster with `docs` placed: how long each dry run holds the loop's lock (the live snapshot; one
    workload is placed on the live state before each, so no snapshot is reused) and takes in all."""
    from finesched.model.manifest import parse_manifest
    from finesched.sched.scheduler import Scheduler
    from finesched.server.what_if import WhatIf
    from finesched.state.cluster import ClusterState
    from synthetic import synthetic_nodes

    live = ClusterState.from_nodes(synthetic_nodes(nodes, seed=7))
    scheduler = Scheduler(live, "default")
    scheduler.schedule_batch([parse_manifest(d) for d in docs])
    loop = SimpleNamespace(lock=TimedLock(), scheduler=scheduler, queued={})
    what_if = WhatIf(loop)  # type: ignore[arg-type]
    extra = [parse_manifest(d) for d in workload_mix(len(plans), "live", seed=99)]
    total = []
    for plan, workload in zip(plans, extra, strict=True):
        scheduler.schedule_one(workload)  # the live state changed: the dry run takes a new snapshot
        started = time.perf_counter()
        what_if.plan([parse_manifest(d) for d in plan])
        total.append(1000 * (time.perf_counter() - started))
    print(f"in-process dry runs on {nodes} nodes with {len(live.bindings)} bindings")
    return {"loop's lock held": loop.lock.held, "whole dry run": total}


def timed(call: Any, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        out.append(1000 * (time.perf_counter() - started))
    return out


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):7.1f}  min {min(values):7.1f}  max {max(values):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--workloads", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--plan-workloads", type=int, default=100)
    parser.add_argument("--screenshots", help="write console-overview.png and console-node.png here")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, fresh_database("sqlite", "", tmp) as url:
        token, took = register_nodes(url, args.nodes, gpus=True)
        print(f"registered {args.nodes} nodes in {took:.1f} s")
        store = Store.open(url)
        for i in range(12):  # nodes whose agent went away: NotReady
            store.set_node_flags(f"node-{i * args.nodes // 12:06d}", "NotReady", "no agent (benchmark)", ready=False)
        store.close()
        server = Server(url, token, f"{tmp}/server.log", [])
        agent_stop = threading.Event()
        try:
            print(f"server leader (state rebuilt) after {server.wait_leader():.1f} s")
            client = httpx.Client(base_url=server.base, headers=server.headers, timeout=600)
            for i, weight in enumerate((1, 1, 2, 4)):
                spec = {"weight": weight, "min": {"cpu": "2000"}} if i == 3 else {"weight": weight}
                doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": f"team-{i}"},
                       "spec": spec}  # fmt: skip
                client.put(f"/v1/tenants/team-{i}", json=doc).raise_for_status()
            docs = workload_mix(args.workloads, "w", seed=3)
            print(f"{len(docs)} workloads bound in {fill(docs, client):.1f} s")
            waiting = [{"apiVersion": "finesched.io/v1alpha1", "kind": "Workload",
                        "metadata": {"name": f"waits-{i}", "namespace": f"team-{i % 4}"},
                        "spec": {"requests": {"cpu": "4000", "memory": "1Gi"}}} for i in range(5)]  # fmt: skip
            client.post("/v1/workloads", json=waiting).raise_for_status()
            nodes = client.get("/ui/api/nodes").json()
            cordoned = set(nodes["names"][5::400])
            for name in cordoned:
                client.post(f"/v1/nodes/{name}/cordon").raise_for_status()
            usable = zip(nodes["gpu"], nodes["names"], nodes["ready"], strict=True)
            gpu_nodes = [n for u, n, ready in usable if u >= 0 and ready and n not in cordoned]
            busiest = gpu_nodes[len(gpu_nodes) // 2]
            print(f"showcase node {busiest}: {fill(showcase(busiest), client):.1f} s")
            report_as_agent(client, url, busiest, agent_stop)
            time.sleep(3)
            api_times = {
                "overview data": timed(lambda: client.get("/ui/api/overview").raise_for_status(), args.runs),
                "node map data": timed(lambda: client.get("/ui/api/nodes").raise_for_status(), args.runs),
                "node page data": timed(lambda: client.get(f"/ui/api/nodes/{busiest}").raise_for_status(), args.runs),
            }
            plans = [workload_mix(args.plan_workloads, f"plan{r}", seed=10 + r) for r in range(args.runs)]
            plan_ms = []
            for docs_ in plans:
                started = time.perf_counter()
                answer = client.post("/v1/plan", json=docs_)
                plan_ms.append(1000 * (time.perf_counter() - started))
                answer.raise_for_status()
            placed = answer.json()["summary"]["placed"]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                pages = {
                    "overview": page_times(browser, server.base, token, "/ui", args.runs + 1),
                    f"node {busiest}": page_times(browser, server.base, token, f"/ui/nodes/{busiest}", args.runs + 1),
                }
                if args.screenshots:
                    shots = (("/ui", "console-overview.png"), (f"/ui/nodes/{busiest}", "console-node.png"))
                    for path, name in shots:
                        screenshot(browser, server.base, token, path, os.path.join(args.screenshots, name))
                browser.close()
        finally:
            agent_stop.set()
            server.stop()
    forks = fork_times(args.nodes, workload_mix(args.workloads, "w", seed=3), plans)
    print(f"\n{args.nodes} nodes, {args.workloads} workloads; {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; times in ms")  # fmt: skip
    for name, loads in pages.items():
        first, rest = loads[0], loads[1:]
        for key in ("fcp", "rendered", "painted"):
            print(f"  {name:<18} {key:<9} first load {first[key]:7.1f}   then {summary([x[key] for x in rest])}")
    for name, values in api_times.items():
        print(f"  GET {name:<15} {summary(values)}")
    print(f"  POST /v1/plan ({args.plan_workloads} workloads, {placed} placed in the last) {summary(plan_ms)}")
    for name, values in forks.items():
        print(f"  dry run in process: {name:<18} {summary(values)}")
    print(json.dumps({"nodes": args.nodes, "workloads": args.workloads, "pages": pages, "api_ms": api_times,
                      "plan_ms": plan_ms, "fork_ms": forks, "node": busiest}))  # fmt: skip


if __name__ == "__main__":
    main()
