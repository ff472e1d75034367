"""kube-scheduler extender: filter + prioritize latency for one Pod at N nodes, and binds/s.

    python bench/extender.py [--nodes 5000] [--requests 300] [--full-requests 40] [--binds 300] [--api]

The extender runs as `finesched k8s-extender --cluster` does (FastAPI under uvicorn, on 127.0.0.1,
in a child process, as kube-scheduler and the extender are separate processes) over --nodes
synthetic GPU nodes (bench/synthetic.py: 128 CPUs in 2 NUMA nodes, 8 GPUs,
2 RDMA NICs each); a keep-alive httpx client plays kube-scheduler. The Pod is the extender
fixture's (LSR, FullPCPUs, SingleNUMANode, half a GPU), with a new UID per request so nothing
carries over from the previous request; filter and then prioritize are sent for every node, as
kube-scheduler does after its own filters passed them all.

* `names`: nodeCacheCapable: true (`NodeNames`, the target: p99 <= 20 ms for filter + prioritize
  at 5,000 nodes);
* `full`: nodeCacheCapable: false (the whole `Nodes` list, ~1.6 KB of Node JSON per node both ways);
* `in-process`: the same verbs called directly on parsed arguments (no HTTP, no JSON): the
  extender's own share;
* binds/s: filter (untimed) then a timed bind, per Pod, with binds committed in memory
  (``--cluster`` mode); with --api also through the kubernetes client against the in-process API
  server of the tests (tests/k8s/fakeapi.py: patch + binding, two HTTP round trips per bind; that
  extender, the API server and the client share this one process).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "k8s"))

from finesched.k8s import wire  # noqa: E402
from finesched.k8s.app import create_app  # noqa: E402
from finesched.k8s.extender import Extender  # noqa: E402
from finesched.k8s.setup import build_extender  # noqa: E402
from synthetic import synthetic_nodes  # noqa: E402

FIXTURES = ROOT / "tests" / "k8s" / "fixtures"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(extender: Extender) -> tuple[uvicorn.Server, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(extender), host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


class CPUTimer:
    """ASGI wrapper: the event-loop thread's CPU time per request (a figure load on the host does not
    inflate), read back with ``GET /bench-cpu`` (which also clears it)."""

    def __init__(self, app: Any):
        self.app = app
        self.spent: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/bench-cpu":
            body = json.dumps(self.spent).encode()
            self.spent = []
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        c0 = time.thread_time()
        await self.app(scope, receive, send)
        if scope["type"] == "http":
            self.spent.append((time.thread_time() - c0) * 1e3)


def child(nodes: int, port: int) -> None:
    """The extender process: build the cluster, then serve until killed."""
    extender = build_extender(synthetic_nodes(nodes, gpu_share=1.0))
    gc.collect()
    gc.freeze()  # the long-lived state out of the collector's way, as a long-running server would be
    uvicorn.run(CPUTimer(create_app(extender)), host="127.0.0.1", port=port, log_level="error")


def spawn(nodes: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--nodes", str(nodes), "--serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # bounded: 2 minutes
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the extender process did not start")


def pod(k: int, name: str = "bench") -> dict[str, Any]:
    p = copy.deepcopy(fixture("extender-filter-request.json")["Pod"])
    p["metadata"].update(name=f"{name}-{k}", uid=f"{name}-uid-{k}")
    return p


def percentiles(ms: list[float]) -> str:
    a = np.array(ms)
    return f"p50 {np.percentile(a, 50):7.2f} ms  p99 {np.percentile(a, 99):7.2f} ms  max {a.max():7.2f} ms"


def latency(client: httpx.Client, names: list[str], items: list[dict] | None, requests: int, tag: str) -> dict:
    client.get("/bench-cpu")  # clear the server's CPU record
    filt, prio, both = [], [], []
    for k in range(requests):
        body = {"Pod": pod(k, tag), "Nodes": None, "NodeNames": names}
        if items is not None:
            body = {"Pod": body["Pod"], "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
        content = wire.encode(body)  # kube-scheduler's own serialization is not the extender's time
        headers = {"Content-Type": "application/json"}
        t0 = time.perf_counter()
        reply = client.post("/filter", content=content, headers=headers)
        t1 = time.perf_counter()
        scores = client.post("/prioritize", content=content, headers=headers)
        t2 = time.perf_counter()
        assert reply.status_code == 200 and scores.status_code == 200 and not reply.json()["Error"]
        filt.append((t1 - t0) * 1e3)
        prio.append((t2 - t1) * 1e3)
        both.append((t2 - t0) * 1e3)
    spent = client.get("/bench-cpu").json()
    cpu = [a + b for a, b in zip(spent[0::2], spent[1::2], strict=True)]
    return {"filter": filt, "prioritize": prio, "both": both, "cpu": cpu, "body_bytes": len(content)}


def in_process(extender: Extender, names: list[str], requests: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds per filter + prioritize pair (CPU time is what load on the host
    does not inflate)."""
    wall, cpu = [], []
    for k in range(requests):
        args = wire.ExtenderArgs(pod(k, "direct"), names, None)
        t0, c0 = time.perf_counter(), time.thread_time()
        extender.filter(args)
        extender.prioritize(args)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return wall, cpu


def binds(client: httpx.Client, names: list[str], count: int, tag: str) -> float:
    """Binds per second: each Pod filtered (untimed), then bound to its first feasible node."""
    spent = 0.0
    for k in range(count):
        p = pod(k, tag)
        reply = client.post("/filter", json={"Pod": p, "Nodes": None, "NodeNames": names}).json()
        node = reply["NodeNames"][k % len(reply["NodeNames"])]
        args = {"PodName": p["metadata"]["name"], "PodNamespace": "ml", "PodUID": p["metadata"]["uid"], "Node": node}
        t0 = time.perf_counter()
        result = client.post("/bind", json=args).json()
        spent += time.perf_counter() - t0
        assert result == {"Error": ""}, result
    return count / spent


def api_binds(nodes: list, names: list[str], count: int) -> float:
    from fakeapi import FakeAPI
    from kubernetes import client as k8s

    from finesched.k8s.api import KubeAPI

    with FakeAPI() as fake:
        for k in range(count):
            fake.put("pods", pod(k, "api"))
        configuration = k8s.Configuration()
        configuration.host = fake.url
        extender = build_extender(nodes, binder=KubeAPI(k8s.ApiClient(configuration)))
        server, url = serve(extender)
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                return binds(http, names, count, "api")
        finally:
            server.should_exit = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=300, help="filter+prioritize pairs with NodeNames")
    parser.add_argument("--full-requests", type=int, default=40, help="pairs with full Node objects")
    parser.add_argument("--binds", type=int, default=300)
    parser.add_argument("--api", action="store_true", help="also bind through the kubernetes client")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        child(args.nodes, args.serve)
        return
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, numpy {np.__version__}"
    )
    print(f"# load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t = time.perf_counter()
    process, url = spawn(args.nodes)
    print(f"# extender process with {args.nodes} nodes ready in {time.perf_counter() - t:.1f} s")
    names = [f"node-{i:06d}" for i in range(args.nodes)]  # synthetic_nodes' names
    template = fixture("extender-filter-request.json")["Nodes"]["items"][0]
    items = []
    for name in names:
        item = copy.deepcopy(template)
        item["metadata"]["name"] = item["metadata"]["labels"]["kubernetes.io/hostname"] = name
        items.append(item)
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            latency(http, names, None, 5, "warm")  # first requests compile and cache what every later one uses
            cache = latency(http, names, None, args.requests, "names")
            full = latency(http, names, items, args.full_requests, "full")
            rate = binds(http, names, args.binds, "bind")
    finally:
        process.kill()
        process.wait()
    nodes = synthetic_nodes(args.nodes, gpu_share=1.0)
    extender = build_extender(nodes)
    gc.collect()
    gc.freeze()
    in_process(extender, names, 5)
    direct, direct_cpu = in_process(extender, names, args.requests)
    print(f"nodeCacheCapable: true  ({cache['body_bytes'] / 1e3:.0f} kB request), {args.requests} pairs")
    print(f"  filter              {percentiles(cache['filter'])}")
    print(f"  prioritize          {percentiles(cache['prioritize'])}")
    print(f"  filter + prioritize {percentiles(cache['both'])}   (target p99 <= 20 ms)")
    print(f"  server CPU time     {percentiles(cache['cpu'])}")
    print(f"nodeCacheCapable: false ({full['body_bytes'] / 1e6:.1f} MB request), {args.full_requests} pairs")
    print(f"  filter              {percentiles(full['filter'])}")
    print(f"  prioritize          {percentiles(full['prioritize'])}")
    print(f"  filter + prioritize {percentiles(full['both'])}")
    print(f"  server CPU time     {percentiles(full['cpu'])}")
    print(f"in-process (no HTTP, no JSON), {args.requests} pairs")
    print(f"  filter + prioritize {percentiles(direct)}")
    print(f"  CPU time            {percentiles(direct_cpu)}")
    print(f"binds over HTTP (committed in memory): {rate:,.0f} binds/s over {args.binds} pods")
    if args.api:
        api_rate = api_binds(nodes, names, args.binds)
        print(f"binds (patch + binding through the kubernetes client, one process): {api_rate:,.0f} binds/s")
    extender.state.check_invariants()
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
