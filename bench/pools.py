"""How fast the node agent moves running LS workloads out of the CPUs of a new LSE binding (issue 18).

    python bench/pools.py [--iterations 200] [--e2e-iterations 60] [--watch 0.1,1.0] [--ls 1,8]

Real processes on this machine; every LS workload is a python process with 3 extra threads and a
python child with 2 (7 threads in 3 processes with the agent's /bin/sh wrapper). Two parts:

* ``agent``: the Deploy Executor in this process, handed the LSE binding directly (as its sync gets
  it from the server), with CPU affinity only and, where the machine has a writable cpuset
  controller, with cgroups. *moved* = from the start of the sync to the moment the last LS thread
  was moved (the pool keeper returned); *sync* = the whole sync, the LSE's own start included.
  After each sync every LS thread's ``Cpus_allowed_list`` is read from /proc and checked. Each
  iteration also ends the LSE and times the LS workloads growing back.
* ``e2e``: ``finesched serve`` (SQLite) and ``finesched agent --watch W`` as child processes, as a
  user runs them. An LSE workload is POSTed next to the running LS ones; the time is from its
  binding (the server's Bound event timestamp, written in the binding's transaction) to the moment
  an observer polling /proc every millisecond sees every LS thread off the LSE's CPU. The agent
  fetches bindings every W seconds and each POST waits a random 0..W first (so it is not in step
  with the agent's ticks): expect about W/2 plus the agent's work.
  The LSE is then deleted and the LS workloads' growing back is timed from the DELETE.

Figures are p50 / p99 / max in milliseconds; with n samples p99 is the ceil(0.99 n)-th value.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "agent"))

from pool_probe import all_on, command, pids  # the tests' LS workload and its threads' CPUs

from api import Server  # bench/api.py: `finesched serve` as a child process
from finesched.agent.binding import AgentBinding, parse_binding
from finesched.agent.cgroup import CgroupSupport, detect
from finesched.agent.discover import Discovery
from finesched.agent.executor import Executor
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from finesched.server.api.auth import create_token
from finesched.server.store.store import Store

CPUS = sorted(os.sched_getaffinity(0))


def percentiles(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return f"p50 {p50 * 1000:7.2f}  p99 {p99 * 1000:7.2f}  max {ordered[-1] * 1000:7.2f} ms  (n={len(ordered)})"


# The executor alone -----------------------------------------------------------------------------------------


def discovery() -> Discovery:
    cpus = [{"id": c, "core": c, "socket": 0, "numa": 0} for c in CPUS]
    node = Node.model_validate({"name": "bench", "cpuTopology": {"cpus": cpus}})
    return Discovery(node=node, online=CPUSet(CPUS))


def item(name: str, command: list[str], cpuset: str = "", qos: str = "LS", acked: bool = False) -> AgentBinding:
    spec = {"command": command, "requests": {"cpu": "1" if cpuset else "100m"}}
    return parse_binding({"workload": f"bench/{name}", "node": "bench", "cpuset": cpuset, "qos": qos,
                          "version": 1, "acked": acked, "workloadSpec": spec})  # fmt: skip


def bench_agent(mode: str, support: CgroupSupport, n_ls: int, iterations: int, tmp: Path) -> None:
    ex = Executor(tmp / f"agent-{mode}-{n_ls}", _NoServer(), support, work_root=tmp / "work")
    marks: list[float] = []
    apply = ex.keeper.apply

    def timed(*args: Any) -> Any:
        moved = apply(*args)
        marks.append(time.perf_counter())
        return moved

    ex.keeper.apply = timed  # type: ignore[method-assign]
    ls = [item(f"ls-{i}", command(tmp / "exchange" / f"{mode}-{n_ls}-ls-{i}")) for i in range(n_ls)]
    node = discovery()
    ex.sync(ls, node)
    ls_pids = [p for i in range(n_ls) for p in pids(tmp / "exchange" / f"{mode}-{n_ls}-ls-{i}")]
    ls = [parse_binding({**b.raw, "acked": True, "workloadSpec": dict(b.spec)}) for b in ls]
    everything, rest = CPUSet(CPUS).format(), CPUSet(CPUS[1:]).format()
    threads = sum(len(os.listdir(f"/proc/{p}/task")) for p in ls_pids) + n_ls  # + each /bin/sh wrapper
    moved, synced, grown, wrong = [], [], [], 0
    try:
        for i in range(iterations):
            lse = item(f"lse-{i}", ["sleep", "3600"], cpuset=str(CPUS[0]), qos="LSE")
            marks.clear()
            start = time.perf_counter()
            ex.sync([*ls, lse], node)
            end = time.perf_counter()
            moved.append(marks[0] - start)
            synced.append(end - start)
            wrong += all_on(ls_pids) != {rest}
            start = time.perf_counter()
            ex.sync(ls, node)  # the LSE ends: its process is stopped, LS grows back
            grown.append(time.perf_counter() - start)
            wrong += all_on(ls_pids) != {everything}
    finally:
        ex.sync([], node)
    label = f"agent {mode:8s} {n_ls} LS ({threads} threads)"
    print(f"  {label}: moved  {percentiles(moved)}")
    print(f"  {label}: sync   {percentiles(synced)}")
    print(f"  {label}: grown  {percentiles(grown)}   wrong placements seen: {wrong}")


class _NoServer:
    def ack(self, workload: str) -> None:
        pass

    def reject(self, workload: str, reason: str) -> None:
        raise RuntimeError(f"the agent rejected {workload}: {reason}")

    def status(self, *args: Any) -> None:
        pass


# End to end ----------------------------------------------------------------------------------------------------


class Observer:
    """Polls the LS threads' CPUs every millisecond; `wait_for(expected)` returns the wall-clock time
    at which they all matched."""

    def __init__(self, pids: list[int]):
        self.pids = pids

    def wait_for(self, expected: str, timeout: float = 60.0) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all_on(self.pids) == {expected}:
                return time.time()
            time.sleep(0.001)
        raise RuntimeError(f"LS threads never all on {expected}: {all_on(self.pids)}")


def bench_e2e(watch: float, n_ls: int, iterations: int, tmp: Path) -> None:
    db = tmp / f"e2e-{watch}-{n_ls}.db"
    store = Store.open(f"sqlite:///{db}")
    admin, agent_token = create_token(store, "admin"), create_token(store, "agent", node="bench-node")
    store.close()
    server = Server(f"sqlite:///{db}", admin, str(tmp / "server.log"), [])
    server.wait_leader()
    agent_log = open(tmp / f"agent-{watch}.log", "ab")  # noqa: SIM115 - closed below
    agent_cmd = [sys.executable, "-m", "finesched.cli", "agent", "--server", server.base, "--token", agent_token,
                 "--node-name", "bench-node", "--data", str(tmp / f"agent-e2e-{watch}-{n_ls}"),
                 "--work-root", str(tmp / "work"), "--watch", str(watch), "--interval", "2", "--quiet"]  # fmt: skip
    agent = subprocess.Popen(agent_cmd, stdout=agent_log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=server.base, headers=server.headers, timeout=30)
    try:
        _wait(lambda: client.get("/v1/nodes/bench-node").status_code == 200, "the agent to register")
        ls_pids: list[int] = []
        for i in range(n_ls):
            out = tmp / "exchange" / f"e2e-{watch}-ls-{i}"
            _submit(client, f"ls-{i}", command(out), {"cpu": "100m"})
            ls_pids += pids(out)
        observer = Observer(ls_pids)
        everything = CPUSet(CPUS).format()
        observer.wait_for(everything)
        moved, submit_moved, grown = [], [], []
        for i in range(iterations):
            time.sleep(random.uniform(0, watch))  # not in step with the agent's ticks
            sent = time.time()
            whole = {"cpu": "1", "memory": "64Mi"}
            _submit(client, f"lse-{i}", ["sleep", "3600"], whole, limits=whole, qos="LSE")
            binding = _wait_value(lambda i=i: client.get(f"/v1/workloads/bench/lse-{i}").json()["status"]["binding"])
            rest = (CPUSet(CPUS) - CPUSet(binding["cpuset"])).format()
            seen = observer.wait_for(rest)
            events = client.get("/v1/events", params={"kind": "Workload", "object": f"bench/lse-{i}"}).json()["items"]
            bound = next(datetime.fromisoformat(e["time"]).timestamp() for e in events if e["reason"] == "Bound")
            if any(e["reason"] == "Rejected" for e in events):
                print(f"  ! lse-{i} was rejected by the agent")
            moved.append(seen - bound)
            submit_moved.append(seen - sent)
            deleted = time.time()
            client.delete(f"/v1/workloads/bench/lse-{i}").raise_for_status()
            grown.append(observer.wait_for(everything) - deleted)
        label = f"e2e watch {watch:>4}s {n_ls} LS"
        print(f"  {label}: bound -> moved   {percentiles(moved)}")
        print(f"  {label}: submit -> moved  {percentiles(submit_moved)}")
        print(f"  {label}: delete -> grown  {percentiles(grown)}")
        for i in range(n_ls):
            client.delete(f"/v1/workloads/bench/ls-{i}")
        _wait(lambda: not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in ls_pids), "the LS workloads to stop")
    finally:
        client.close()
        agent.terminate()
        agent.wait(timeout=30)
        agent_log.close()
        server.stop()


def _submit(client: httpx.Client, name: str, command: list[str], requests: dict[str, Any], **spec: Any) -> None:
    doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload", "metadata": {"name": name, "namespace": "bench"},
           "spec": {"requests": requests, "command": command, **spec}}  # fmt: skip
    client.post("/v1/workloads", json=doc).raise_for_status()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _wait_value(get: Any, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = get()
        if value:
            return value
        time.sleep(0.005)
    raise RuntimeError("timed out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=200, help="executor iterations per case")
    parser.add_argument("--e2e-iterations", type=int, default=60, help="end-to-end iterations per watch interval")
    parser.add_argument("--watch", default="0.1,1.0", help="agent --watch intervals for the end-to-end part")
    parser.add_argument("--ls", default="1,8", help="how many LS workloads run (executor part; e2e uses the first)")
    parser.add_argument("--parts", default="agent,e2e")
    args = parser.parse_args()
    if len(CPUS) < 2:
        raise SystemExit("needs at least two CPUs")
    support = detect()
    print(f"machine: {platform.node()} {platform.platform()}, {os.cpu_count()} CPUs, affinity {CPUSet(CPUS)}")
    print(f"cgroups: {support.describe()}")
    counts = [int(x) for x in args.ls.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-pools-") as tmp:
        # workloads run as their tenant's user (a root agent): they reach their working directories
        # under tmp/work and write their pids to tmp/exchange, as anyone may
        os.chmod(tmp, 0o711)
        (Path(tmp) / "exchange").mkdir(mode=0o1777)
        os.chmod(Path(tmp) / "exchange", 0o1777)
        if "agent" in args.parts:
            modes = [("affinity", CgroupSupport(None, reason="off"))]
            if "cpuset" in support.controllers:
                modes.append(("cgroup", support))
            for mode, chosen in modes:
                for n_ls in counts:
                    bench_agent(mode, chosen, n_ls, args.iterations, Path(tmp))
        if "e2e" in args.parts:
            for watch in (float(w) for w in args.watch.split(",")):
                bench_e2e(watch, counts[0], args.e2e_iterations, Path(tmp))


if __name__ == "__main__":
    main()
