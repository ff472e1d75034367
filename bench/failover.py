"""Time from a kill -9 of the scheduling leader to the first new binding, through real `finesched serve`
processes on 127.0.0.1.

    python bench/failover.py --db-backends sqlite,postgres --pg-url postgresql+psycopg://postgres@HOST:PORT/postgres
    python bench/failover.py --db-backends sqlite --scenarios restart --nodes 1000 --runs 5

For each scenario: a fresh database (bench/api.py's) with --nodes nodes registered through the store,
the leader started with its own --data directory (its replica identity) and --lease-ttl, and, for
two replicas, a follower with another one. Once the follower has seen the lease, the leader gets
SIGKILL at t0 and, at once, --workloads Pending workloads are written through the store (another
writer), so whichever process leads next has work waiting. The figure is the timestamp of the first
`Bound` event among them (written by the server in the binding's transaction, same host clock)
minus t0. Scenarios:

* `restart`: one server, restarted right after the kill with the same --data: it recognises the
  lease of its own previous life and takes it over at once;
* `restart-as-stranger`: the same, restarted with a new --data (a new identity): it waits for the
  lease to expire, as every restart did before replicas had identities;
* `takeover` (two replicas): the follower takes over once the dead leader's lease expires;
* `restart-beside-follower` (two replicas): the killed leader is restarted with its --data and takes
  its lease over at once; the follower keeps waiting.

Also printed: when the new process answered /healthz and when it reported itself leader (from
launch; the state rebuild is in between).

--runs N repeats every scenario N times (each with its own fresh database), prints every run, and
adds the median and the maximum of each figure. The servers run the code `python -m finesched.cli`
imports: run this file with PYTHONPATH=OTHER/src to measure another checkout (it prints which).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api import Server, fresh_database, manifests, register_nodes
from finesched.model.manifest import parse_manifest, to_manifest
from finesched.server.store.store import Store

SCENARIOS = ("restart", "restart-as-stranger", "takeover", "restart-beside-follower")


@dataclass
class Result:
    scenario: str
    backend: str
    nodes: int
    ttl: float
    first_bound_s: float  # kill -> first Bound event
    answers_s: float | None  # launch of the new process -> /healthz (None: no new process)
    leader_s: float | None  # launch -> /readyz says leader
    follower_stayed: bool | None  # restart-beside-follower: the follower never led


def _submit_pending(store: Store, count: int, prefix: str) -> list[str]:
    items = []
    for doc in manifests(count, prefix, 21):
        workload: Any = parse_manifest(doc)
        items.append((workload.namespace, workload.name, workload.tenant, to_manifest(workload)))
    store.submit(items)
    return [f"{ns}/{name}" for ns, name, _, _ in items]


def _first_bound(store: Store, keys: set[str], after_id: int) -> float | None:
    for event in store.events(after_id, kind="Workload", limit=100_000):
        if event["reason"] == "Bound" and event["object"] in keys:
            return float(event["time"].timestamp())
    return None


def _is(server: Server, what: str) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        if what == "answers":
            return httpx.get(f"{server.base}/healthz", timeout=1).status_code == 200
        return bool(httpx.get(f"{server.base}/readyz", timeout=1).json().get("leader"))
    return False


def run(scenario: str, backend: str, args: argparse.Namespace, tmp: str) -> Result:
    two = scenario in ("takeover", "restart-beside-follower")
    with fresh_database(backend, args.pg_url, tmp) as url:
        token, _ = register_nodes(url, args.nodes, False)
        ttl = ["--lease-ttl", str(args.lease_ttl)]
        tag = f"{backend}-{scenario}"
        leader = Server(url, token, f"{tmp}/{tag}-a.log", [*ttl, "--data", f"{tmp}/{tag}-a"])
        follower = new = None
        store = Store.open(url)
        try:
            leader.wait_leader()
            if two:
                follower = Server(url, token, f"{tmp}/{tag}-b.log", [*ttl, "--data", f"{tmp}/{tag}-b"])
                follower.wait_answers()
                time.sleep(args.lease_ttl / 3 + 1)  # the follower has tried the lease at least once
            last = store.last_event_id()
            leader.proc.send_signal(signal.SIGKILL)
            leader.proc.wait()
            killed = time.time()
            keys = set(_submit_pending(store, args.workloads, f"fo-{scenario}"))
            if scenario != "takeover":
                data = f"{tmp}/{tag}-{'c' if scenario == 'restart-as-stranger' else 'a'}"
                new = Server(url, token, f"{tmp}/{tag}-a2.log", [*ttl, "--data", data])
            answers = leads = None
            follower_led = False
            deadline = time.monotonic() + args.lease_ttl * 3 + 300
            while (first := _first_bound(store, keys, last)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{scenario}: nothing bound (logs in {tmp})")
                if new is not None:
                    if answers is None and _is(new, "answers"):
                        answers = time.perf_counter() - new.started
                    if leads is None and _is(new, "leader"):
                        leads = time.perf_counter() - new.started
                if follower is not None and scenario == "restart-beside-follower":
                    follower_led |= _is(follower, "leader")
                time.sleep(0.05)
            stayed = None
            if follower is not None and scenario == "restart-beside-follower":
                stayed = not follower_led and not _is(follower, "leader")
            return Result(scenario, backend, args.nodes, args.lease_ttl, first - killed, answers, leads, stayed)
        finally:
            for server in (new, follower, leader):
                if server is not None:
                    server.stop()
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--pg-url", default=os.environ.get("FINESCHED_TEST_PG_URL", ""),
                        help="PostgreSQL server URL (a database is created and dropped in it)")  # fmt: skip
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated: {', '.join(SCENARIOS)}")
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--workloads", type=int, default=200, help="Pending workloads written at the kill")
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="the servers' --lease-ttl (s)")
    parser.add_argument("--runs", type=int, default=1, help="repetitions of every scenario (median and max printed)")
    args = parser.parse_args()
    backends = [b for b in args.db_backends.split(",") if b]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if any(s not in SCENARIOS for s in scenarios) or any(b not in ("sqlite", "postgres") for b in backends):
        parser.error("unknown scenario or backend")
    if "postgres" in backends and not args.pg_url:
        parser.error("--pg-url (or FINESCHED_TEST_PG_URL) is needed for the postgres backend")
    import finesched

    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load {_load()}; {args.nodes:,} nodes, lease TTL {args.lease_ttl:g} s, {args.runs} run(s); "
          f"finesched from {os.path.dirname(finesched.__file__)}")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="finesched-failover-") as tmp:
        for backend in backends:
            for scenario in scenarios:
                for n in range(args.runs):
                    os.makedirs(where := f"{tmp}/{n}", exist_ok=True)  # each run's logs and --data apart
                    result = run(scenario, backend, args, where)
                    results.append(result)
                    print(f"[{backend}] {scenario} run {n + 1}: first binding {result.first_bound_s:.2f} s after "
                          f"the kill (answers {_fmt(result.answers_s)}, leader {_fmt(result.leader_s)}; "
                          f"load {_load()})", flush=True)  # fmt: skip
    print(f"\nload {_load()} at the end\n")
    print("| backend | scenario | nodes | lease TTL s | kill → first binding s | new process: answers s | leader s "
          "| follower stayed a follower |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        stayed = "—" if r.follower_stayed is None else ("yes" if r.follower_stayed else "**no**")
        print(f"| {r.backend} | {r.scenario} | {r.nodes:,} | {r.ttl:g} | {r.first_bound_s:.2f} | {_fmt(r.answers_s)} "
              f"| {_fmt(r.leader_s)} | {stayed} |")  # fmt: skip
    if args.runs > 1:
        print(f"\n| backend | scenario | figure | median of {args.runs} s | max s | runs s |")
        print("|---|---|---|---:|---:|---|")
        for backend in backends:
            for scenario in scenarios:
                mine = [r for r in results if r.backend == backend and r.scenario == scenario]
                for name in ("first_bound_s", "answers_s", "leader_s"):
                    values = [v for r in mine if (v := getattr(r, name)) is not None]
                    if values:
                        print(f"| {backend} | {scenario} | {name} | {statistics.median(values):.2f} | "
                              f"{max(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")  # fmt: skip


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
