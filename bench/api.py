"""Control plane throughput and latency through the real HTTP API of a `finesched serve` subprocess.

    python bench/api.py --db-backends sqlite,postgres --pg-url postgresql+psycopg://postgres@HOST:PORT/postgres

For each backend: a fresh database (a temporary SQLite file, or `CREATE DATABASE bench_<random>` on the
PostgreSQL server of --pg-url, dropped at the end) gets --nodes nodes registered in bulk through the
store before the server starts (the server then rebuilds its state from the store, as after a
restart); then `finesched serve` runs on 127.0.0.1 and three workloads are timed through HTTP:

* `batched`: --workloads workloads POSTed to /v1/workloads in lists of --batch (100), by
  --batch-clients clients; target >= 1,000 workloads/s bound end to end on SQLite;
* `single`: --singles workloads POSTed one per request by --clients concurrent clients (threads,
  one keep-alive connection each); target >= 300/s;
* `latency`: open loop at --rate workloads/s for --seconds (each POST sent at its scheduled time
  whatever the earlier ones are doing); target p99 submit->bound <= 50 ms at 100/s.

"Bound" is read from the server's Server-Sent Events watch (GET /v1/events/watch?kind=Workload),
which the benchmark follows for the whole run. The watch polls the store every 250 ms, so the
moment a workload was bound is taken from the Bound event's own timestamp (written by the server in
the binding's transaction, just before its commit, on this same host's clock), not from when the
watch delivered it; submit->bound is that timestamp minus the client's clock just before the POST
was sent. Rates are bound workloads over the time from the first POST to the last Bound.

* `burst-after-nodes` (--api-nodes N > 0): N more nodes registered through HTTP (PUT, 8 clients)
  while the server runs, then at once --burst workloads POSTed in lists of --batch: the scheduler
  learns of the new nodes from its change feed while the burst arrives.

--replicas 1,2 runs every backend also with a second `finesched serve` on the same database: the
first one started holds the scheduler lease, and every request (nodes, workloads) goes to the
second, a follower, so the leader learns of all of it through the change feed (the workloads
submitted to the follower are not handed over in memory). Only PostgreSQL is meant for two
replicas; SQLite runs them too (one machine, one file).

--breakdown scrapes /metrics before and after each phase and splits the server process's CPU time
(/proc) into the scheduling core (Scheduler.run), the store (SQLAlchemy + driver + SQLite itself;
binding writes, submission writes, change feed) and the rest (HTTP, FastAPI, manifest validation,
responses, the SSE watch); on PostgreSQL the CPU time of this database's server backends is shown
beside it. --clusters scalar,gpu adds a `batched-gpu` phase on a cluster whose GPU nodes carry
8 GPUs, with 40 % of the workloads asking for a GPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finesched.model.manifest import to_manifest
from finesched.model.tenant import Tenant
from finesched.server.api.auth import create_token
from finesched.server.store.store import Store
from synthetic import scalar_workloads, synthetic_nodes

TICKS = os.sysconf("SC_CLK_TCK")
WAIT_BOUND_S = 180.0  # the longest a phase waits for its workloads to be bound
QUIET_S = 15.0  # a watch silent this long while workloads are missing: look them up instead
GPU_SHAPES = (
    {"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory-ratio": 25},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 20, "koordinator.sh/gpu-memory": "10Gi"},
    {"nvidia.com/gpu": 1},
)
BREAKDOWN = (
    "finesched_decide_cpu_seconds",
    "finesched_bind_write_cpu_seconds",
    "finesched_submit_store_cpu_seconds",
    "finesched_feed_cpu_seconds",
    "finesched_batch_seconds",
    "finesched_submit_to_bound_seconds",
)


# Databases and the server ---------------------------------------------------------------------------
@contextlib.contextmanager
def fresh_database(backend: str, pg_url: str, tmp: str) -> Iterator[str]:
    """A new empty database of `backend`, removed afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:8]}.db"
        return
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{pg_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: The namespaces of bench/synthetic.py's workloads, each owned by the tenant of its name.
TENANTS = tuple(f"team-{i}" for i in range(4))


def data_option(path: str) -> list[str]:
    """`--data PATH` for `finesched serve` (each replica its own identity), when this version has it
    (so the benchmark also runs against older versions of the server, for comparisons)."""
    global SERVE_HAS_DATA
    if SERVE_HAS_DATA is None:
        done = subprocess.run([sys.executable, "-m", "finesched.cli", "serve", "--help"], capture_output=True,
                              text=True, check=False)  # fmt: skip
        SERVE_HAS_DATA = "--data" in done.stdout
    return ["--data", path] if SERVE_HAS_DATA else []


SERVE_HAS_DATA: bool | None = None


def register_nodes(url: str, count: int, gpus: bool) -> tuple[str, float]:
    """Register `count` synthetic nodes through the store (the API's own write path, minus HTTP),
    and the tenants owning the workloads' namespaces (team-0..team-3); an admin token and the
    seconds the nodes took."""
    store = Store.open(url)
    try:
        for name in TENANTS:
            store.put_tenant(name, 1.0, to_manifest(Tenant(name=name)), create_only=True)
        started = time.perf_counter()
        for node in synthetic_nodes(count, seed=7, devices=gpus):
            store.put_node(node.name, to_manifest(node), create_only=True)
        took = time.perf_counter() - started
        return create_token(store, "admin"), took
    finally:
        store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`finesched serve` as a child process on 127.0.0.1."""

    def __init__(self, url: str, token: str, log_path: str, extra: list[str], profile: str | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"}
        serve = ["serve", "--db", url, "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "warning", *extra]  # fmt: skip
        if profile:  # this file re-run as the server, every thread under cProfile (see profiled_serve)
            cmd = [sys.executable, os.path.abspath(__file__), "--profiled-serve", profile, *serve]
        else:
            cmd = [sys.executable, "-m", "finesched.cli", *serve]
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_answers(self, timeout: float = 60.0) -> None:
        """Until the server answers /healthz (a follower never becomes leader while the first one lives)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} (log: {self.log.name})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server did not answer after {timeout:.0f}s (log: {self.log.name})")

    def wait_leader(self, timeout: float = 300.0) -> float:
        """Seconds from launch until the server answers and holds the scheduler lease (state rebuilt)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} (log: {self.log.name})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/readyz", timeout=2).json().get("leader"):
                    return time.perf_counter() - self.started
            time.sleep(0.1)
        raise RuntimeError(f"server not leader after {timeout:.0f}s (log: {self.log.name})")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.base}/metrics", timeout=10).text)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def parse_metrics(text: str) -> dict[str, float]:
    """`name{labels}` -> value for the series the benchmark reads (sums, counts, decisions)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("finesched_"):
            continue
        name, _, value = line.rpartition(" ")
        if name.endswith(("_sum", "_count")) or name.startswith(("finesched_decisions_total", "finesched_http")):
            out[name] = float(value)
    return out


def pg_backend_cpu(url: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend connected to this database, by pid (empty when not readable)."""
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    out: dict[int, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = dsn.rsplit("/", 1)[1]
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))]
        own = conn.info.backend_pid
    for pid in pids:
        if pid == own:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # another host, or the backend ended
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def pg_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU the backends used in between (those that exited meanwhile are not counted: a lower bound)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


# Following Bound events ------------------------------------------------------------------------------
class Watcher:
    """Follows GET /v1/events/watch?kind=Workload; records each workload's Bound time (event timestamp)."""

    def __init__(self, server: Server):
        self.client = httpx.Client(base_url=server.base, headers=server.headers, timeout=httpx.Timeout(30, read=None))
        self.bound: dict[str, float] = {}
        self.other: dict[str, str] = {}  # key -> reason, for workloads that ended elsewhere (Rejected)
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the event watch did not start")

    def _run(self) -> None:
        try:
            with self.client.stream("GET", "/v1/events/watch", params={"kind": "Workload"}) as response:
                response.raise_for_status()
                data = ""
                for line in response.iter_lines():
                    if line.startswith(":"):
                        self.ready.set()
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif line == "" and data:
                        self._event(json.loads(data))
                        data = ""
        except BaseException as exc:  # closed by stop(), or the server went away
            self.error = exc
            self.ready.set()
            with self.cond:
                self.cond.notify_all()

    def _event(self, event: dict[str, Any]) -> None:
        reason = event["reason"]
        if reason not in ("Bound", "Rejected"):
            return
        with self.cond:
            if reason == "Bound":
                self.bound.setdefault(event["object"], datetime.fromisoformat(event["time"]).timestamp())
            else:
                self.other[event["object"]] = reason
            self.cond.notify_all()

    def wait(self, keys: list[str], timeout: float = WAIT_BOUND_S) -> tuple[dict[str, float], int]:
        """Bound times of `keys` once all are bound or ended otherwise, and how many of them the watch
        did not deliver: when it stays silent for QUIET_S, each missing workload's Bound event is
        looked up in GET /v1/events?object=... instead."""
        deadline = time.monotonic() + timeout
        with self.cond:
            seen, quiet_since = -1, time.monotonic()
            while True:
                missing = [k for k in keys if k not in self.bound and k not in self.other]
                if len(missing) != seen:
                    seen, quiet_since = len(missing), time.monotonic()
                now_ = time.monotonic()
                if not missing or self.error is not None or now_ > deadline or now_ - quiet_since > QUIET_S:
                    break
                self.cond.wait(0.5)
            found = {k: self.bound[k] for k in keys if k in self.bound}
        recovered = 0
        for key in missing:
            events = self.client.get("/v1/events", params={"kind": "Workload", "object": key}).json()["items"]
            times = [datetime.fromisoformat(e["time"]).timestamp() for e in events if e["reason"] == "Bound"]
            if times:
                found[key] = times[0]
                recovered += 1
        if len(missing) > recovered:
            print(
                f"  ! {len(missing) - recovered} workloads not bound (e.g. {missing[0]}); watch error: {self.error!r}"
            )
        return found, recovered

    def stop(self) -> None:
        self.client.close()
        self.thread.join(timeout=5)


# Workloads -------------------------------------------------------------------------------------------
def manifests(count: int, prefix: str, seed: int, gpu_share: float = 0.0) -> list[dict[str, Any]]:
    """`count` Workload manifests named `<prefix>-<i>` (scalar stream, `gpu_share` with a GPU share)."""
    rng = np.random.default_rng(seed + 100)
    out = []
    for i, workload in enumerate(scalar_workloads(count, seed=seed)):
        doc = to_manifest(workload)
        doc["metadata"]["name"] = f"{prefix}-{i:06d}"
        if gpu_share and rng.random() < gpu_share:
            doc["spec"]["requests"] = {**doc["spec"]["requests"], **GPU_SHAPES[int(rng.integers(len(GPU_SHAPES)))]}
        out.append(doc)
    return out


def key_of(doc: dict[str, Any]) -> str:
    return f"{doc['metadata'].get('namespace', 'default')}/{doc['metadata']['name']}"


@dataclass
class Phase:
    name: str
    workloads: int = 0
    bound: int = 0
    submit_s: float = 0.0  # first POST sent -> last POST answered
    bound_s: float = 0.0  # first POST sent -> last workload bound
    latencies: list[float] = field(default_factory=list)  # submit -> bound, seconds
    post_latencies: list[float] = field(default_factory=list)  # POST round trips, seconds
    errors: int = 0
    late_sends: int = 0
    watch_missed: int = 0  # Bound events the SSE watch never delivered (found with GET /v1/events)
    client_cpu_s: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        lat = np.array(self.latencies) * 1000 if self.latencies else np.zeros(1)
        post = np.array(self.post_latencies) * 1000 if self.post_latencies else np.zeros(1)
        return {
            "phase": self.name,
            "workloads": self.workloads,
            "bound": self.bound,
            "errors": self.errors,
            "submitted_per_s": self.workloads / self.submit_s if self.submit_s else 0.0,
            "bound_per_s": self.bound / self.bound_s if self.bound_s else 0.0,
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()),
            "post_p99_ms": float(np.percentile(post, 99)),
            "late_sends": self.late_sends,
            "watch_missed": self.watch_missed,
            "client_cpu_s": self.client_cpu_s,
            **self.breakdown,
        }


class Connection:
    """One keep-alive HTTP/1.1 connection (asyncio streams) that POSTs pre-encoded JSON bodies.

    The load generator shares the machine's CPUs with the server, so it is kept lean: a request
    costs it a few tens of microseconds here, against about a millisecond of GIL-contended work
    per request for 50 threads with httpx clients, which would take CPU from the server under test.
    """

    def __init__(self, port: int, token: str):
        self.port = port
        self.head = (f"POST /v1/workloads HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: ").encode()  # fmt: skip
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> int:
        """The response status; a keep-alive connection the server closed meanwhile is reopened once."""
        for attempt in (0, 1):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            assert self.reader is not None
            self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
            status_line = await self.reader.readline()
            if not status_line:  # closed before answering: nothing was processed, send again
                self.close()
                if attempt == 0:
                    continue
                raise ConnectionError("the server closed the connection")
            length = 0
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await self.reader.readexactly(length)
            return int(status_line.split()[1])
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _post(conn: Connection, body: bytes, phase: Phase) -> float | None:
    """POST body; the client's clock just before sending (None when refused)."""
    sent = time.time()
    t0 = time.perf_counter()
    try:
        ok = await conn.post(body) == 201
    except (OSError, asyncio.IncompleteReadError, ValueError):
        conn.close()
        ok = False
    phase.post_latencies.append(time.perf_counter() - t0)
    if not ok:
        phase.errors += 1
    return sent if ok else None


def run_closed(server: Server, watcher: Watcher, name: str, docs: list[dict[str, Any]], per_post: int,
               clients: int) -> Phase:  # fmt: skip
    """`clients` concurrent connections POST `docs` in lists of `per_post` (1: one manifest per
    request), each sending its next request as soon as the previous one is answered."""
    phase = Phase(name, len(docs))
    chunks = [docs[i : i + per_post] for i in range(0, len(docs), per_post)]
    bodies = [(json.dumps(c if per_post > 1 else c[0]).encode(), [key_of(d) for d in c]) for c in chunks]
    sent_at: dict[str, float] = {}

    async def client_loop(todo: Iterator[tuple[bytes, list[str]]]) -> None:
        conn = Connection(server.port, server.token)
        try:
            for body, keys in todo:
                sent = await _post(conn, body, phase)
                if sent is not None:
                    sent_at.update((k, sent) for k in keys)
        finally:
            conn.close()

    async def main() -> None:
        todo = iter(bodies)  # shared: each client takes the next body
        await asyncio.gather(*(client_loop(todo) for _ in range(clients)))

    cpu0, start = time.process_time(), time.time()
    asyncio.run(main())
    phase.submit_s = time.time() - start
    return _finish(phase, watcher, sent_at, start, cpu0)


def run_open(server: Server, watcher: Watcher, name: str, docs: list[dict[str, Any]], rate: float) -> Phase:
    """Send one manifest every 1/rate s (open loop: a slow answer does not delay the next send;
    each send takes a free connection of a pool, or opens one)."""
    phase = Phase(name, len(docs))
    bodies = [(json.dumps(d).encode(), key_of(d)) for d in docs]
    sent_at: dict[str, float] = {}

    async def main() -> None:
        idle: list[Connection] = []
        tasks = []

        async def send(body: bytes, key: str, due: float) -> None:
            conn = idle.pop() if idle else Connection(server.port, server.token)
            if time.perf_counter() - due > 0.005:
                phase.late_sends += 1
            sent = await _post(conn, body, phase)
            idle.append(conn)
            if sent is not None:
                sent_at[key] = sent

        origin = time.perf_counter()
        for i, (body, key) in enumerate(bodies):
            due = origin + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            tasks.append(asyncio.create_task(send(body, key, due)))
        await asyncio.gather(*tasks)
        for conn in idle:
            conn.close()

    cpu0, start = time.process_time(), time.time()
    asyncio.run(main())
    phase.submit_s = time.time() - start
    return _finish(phase, watcher, sent_at, start, cpu0)


def _finish(phase: Phase, watcher: Watcher, sent_at: dict[str, float], start: float, cpu0: float) -> Phase:
    bound, phase.watch_missed = watcher.wait(list(sent_at))
    phase.client_cpu_s = time.process_time() - cpu0
    phase.bound = len(bound)
    if bound:
        phase.bound_s = max(bound.values()) - start
        phase.latencies = [bound[k] - sent_at[k] for k in bound]
    return phase


def register_via_api(server: Server, count: int, clients: int = 8) -> float:
    """PUT `count` new nodes (named api-node-...) through the HTTP API; the seconds taken."""
    docs = []
    for node in synthetic_nodes(count, seed=8, devices=False):
        doc = to_manifest(node)
        doc["metadata"]["name"] = f"api-{node.name}"
        docs.append(doc)
    started = time.perf_counter()
    with httpx.Client(base_url=server.base, headers=server.headers, timeout=60) as http:

        def put(doc: dict[str, Any]) -> None:
            answer = http.put(f"/v1/nodes/{doc['metadata']['name']}", json=doc)
            if answer.status_code != 200:
                raise RuntimeError(f"node registration refused: {answer.status_code} {answer.text[:200]}")

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(put, docs))
    return time.perf_counter() - started


def measure(server: Server, url: str, breakdown: bool, run: Any) -> Phase:
    """Run one phase; with `breakdown`, split the server's CPU time over the phase."""
    if not breakdown:
        return run()  # type: ignore[no-any-return]
    is_pg = url.startswith("postgresql")
    m0, cpu0, pg0 = server.metrics(), server.cpu_seconds(), pg_backend_cpu(url) if is_pg else {}
    phase: Phase = run()
    time.sleep(0.3)  # the last batch's metrics
    m1, cpu1, pg1 = server.metrics(), server.cpu_seconds(), pg_backend_cpu(url) if is_pg else {}

    def delta(name: str) -> float:
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    cpu = cpu1 - cpu0
    core = delta("finesched_decide_cpu_seconds_sum")
    store = sum(delta(f"finesched_{n}_cpu_seconds_sum") for n in ("bind_write", "submit_store", "feed"))
    phase.breakdown = {
        "server_cpu_s": cpu,
        "core_s": core,
        "store_s": store,
        "bind_write_s": delta("finesched_bind_write_cpu_seconds_sum"),
        "submit_store_s": delta("finesched_submit_store_cpu_seconds_sum"),
        "feed_s": delta("finesched_feed_cpu_seconds_sum"),
        "rest_s": max(0.0, cpu - core - store),
        "batches": delta("finesched_batch_seconds_count"),
        "batch_wall_s": delta("finesched_batch_seconds_sum"),
        "pg_backend_cpu_s": pg_delta(pg0, pg1),
    }
    return phase


def profiled_serve(out: str, argv: list[str]) -> None:
    """Run `finesched <argv>` with a cProfile profiler in every thread (the scheduling loop, the
    request threads, the event loop); on SIGTERM the merged statistics are written to `out`."""
    import cProfile
    import pstats
    import signal

    from finesched.cli import app

    profilers: list[cProfile.Profile] = []
    run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()
        try:
            run(self)
        finally:
            profiler.disable()

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    main_profiler = cProfile.Profile()
    profilers.append(main_profiler)

    def dump(*_: Any) -> None:
        main_profiler.disable()
        stats = None
        for profiler in profilers:
            profiler.create_stats()
            if profiler.stats:  # type: ignore[attr-defined]
                stats = pstats.Stats(profiler) if stats is None else stats.add(profiler)
        if stats is not None:
            stats.dump_stats(out)
        os._exit(0)

    signal.signal(signal.SIGTERM, dump)
    main_profiler.enable()
    app(argv, standalone_mode=True)


# The run ---------------------------------------------------------------------------------------------
def run_backend(backend: str, args: argparse.Namespace, tmp: str, gpus: bool, replicas: int) -> list[dict[str, Any]]:
    label = f"{backend}{' +gpu' if gpus else ''}{f' x{replicas}' if replicas > 1 else ''}"
    rows: list[dict[str, Any]] = []
    with fresh_database(backend, args.pg_url, tmp) as url:
        token, took = register_nodes(url, args.nodes, gpus)
        print(f"[{label}] {args.nodes} nodes registered through the store in {took:.1f}s")
        suffix = f"{backend}{'-gpu' if gpus else ''}-x{replicas}"
        profile = f"{args.profile_server}.{suffix}" if args.profile_server else None
        extra = ["--lease-ttl", str(args.lease_ttl), *args.serve_arg]
        server = Server(
            url, token, f"{tmp}/serve-{suffix}.log", [*extra, *data_option(f"{tmp}/data-{suffix}")], profile
        )
        follower = None
        try:
            startup = server.wait_leader()
            print(f"[{label}] server up and leader (state rebuilt from the store) in {startup:.1f}s")
            if replicas > 1:
                second = [*extra, *data_option(f"{tmp}/data-{suffix}-b")]
                follower = Server(url, token, f"{tmp}/serve-{suffix}-b.log", second)
                follower.wait_answers()
                print(f"[{label}] second replica up (follower); every request goes to it")
            target = follower or server
            watcher = Watcher(server)
            try:
                # A few workloads first so connections, caches and per-shape memos are warm.
                run_closed(target, watcher, "warm-up", manifests(200, "warm", 3), 50, 2)
                for run in _phases(target, watcher, args, gpus):
                    phase = measure(server, url, args.breakdown, run)
                    row = {"backend": label, **phase.row()}
                    rows.append(row)
                    print(f"[{label}] {format_row(row)}")
            finally:
                watcher.stop()
        finally:
            if follower is not None:
                follower.stop()
            server.stop()
    return rows


def _phases(target: Server, watcher: Watcher, args: argparse.Namespace, gpus: bool) -> list[Any]:
    """The phases of one run, each a callable returning its Phase; requests go to `target`."""
    if gpus:
        docs = manifests(args.workloads, "gpu", 11, gpu_share=0.4)
        return [lambda: run_closed(target, watcher, "batched-gpu", docs, args.batch, args.batch_clients)]  # fmt: skip
    batched = manifests(args.workloads, "batch", 11)
    singles = manifests(args.singles, "single", 12)
    opened = manifests(int(args.rate * args.seconds), "open", 13)
    phases = [
        ("batched", lambda: run_closed(target, watcher, "batched", batched, args.batch, args.batch_clients)),
        ("single", lambda: run_closed(target, watcher, "single", singles, 1, args.clients)),
        ("latency", lambda: run_open(target, watcher, "latency", opened, args.rate)),
    ]
    if args.api_nodes:
        burst = manifests(args.burst, "burst", 14)

        def after_nodes() -> Phase:
            took = register_via_api(target, args.api_nodes)
            print(f"  {args.api_nodes} nodes registered through the API in {took:.1f}s; the burst follows at once")
            return run_closed(target, watcher, "burst-after-nodes", burst, args.batch, args.batch_clients)

        phases.append(("burst-after-nodes", after_nodes))
    return [run for name, run in phases if not args.phases or name in args.phases.split(",")]


def format_row(r: dict[str, Any]) -> str:
    return (f"{r['phase']}: {r['bound']}/{r['workloads']} bound, {r['submitted_per_s']:.0f} submitted/s, "
            f"{r['bound_per_s']:.0f} bound/s, submit->bound p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms, "
            f"errors {r['errors']}")  # fmt: skip


def print_tables(rows: list[dict[str, Any]], breakdown: bool) -> None:
    print()
    print("| backend | phase | workloads | bound | submitted/s | bound/s end to end | submit→bound p50 ms "
          "| p99 ms | max ms | POST p99 ms | errors | late sends | missed by watch |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['phase']} | {r['workloads']:,} | {r['bound']:,} | {r['submitted_per_s']:,.0f} "
              f"| {r['bound_per_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
              f"| {r['post_p99_ms']:.1f} | {r['errors']} | {r['late_sends']} | {r['watch_missed']} |")  # fmt: skip
    if not breakdown:
        return
    print()
    print(
        "Server CPU seconds over each phase: core = Scheduler.run; store = binding writes + submission writes "
        "+ change feed (SQLAlchemy, driver, SQLite); rest = HTTP, FastAPI, validation, responses, SSE watch."
    )
    print()
    print("| backend | phase | server CPU s | core | store (bind / submit / feed) | rest | core % | store % "
          "| rest % | batches | PG backends CPU s | client CPU s |")  # fmt: skip
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cpu = r["server_cpu_s"] or 1e-9
        print(f"| {r['backend']} | {r['phase']} | {r['server_cpu_s']:.2f} | {r['core_s']:.2f} | {r['store_s']:.2f} "
              f"({r['bind_write_s']:.2f} / {r['submit_store_s']:.2f} / {r['feed_s']:.2f}) | {r['rest_s']:.2f} "
              f"| {100 * r['core_s'] / cpu:.0f} | {100 * r['store_s'] / cpu:.0f} | {100 * r['rest_s'] / cpu:.0f} "
              f"| {r['batches']:.0f} | {r['pg_backend_cpu_s']:.2f} | {r['client_cpu_s']:.2f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--pg-url", default=os.environ.get("FINESCHED_TEST_PG_URL", ""),
                        help="PostgreSQL server URL (a database is created and dropped in it)")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--workloads", type=int, default=5_000, help="batched phase: workloads in total")
    parser.add_argument("--batch", type=int, default=100, help="workloads per POST in the batched phase")
    parser.add_argument("--batch-clients", type=int, default=2, help="concurrent clients in the batched phase")
    parser.add_argument("--singles", type=int, default=3_000, help="single phase: workloads in total")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients in the single phase")
    parser.add_argument("--rate", type=float, default=100.0, help="latency phase: offered workloads/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency phase: duration")
    parser.add_argument("--clusters", default="scalar",
                        help="scalar (CPU/memory nodes; every phase), gpu (with GPUs; batched)")  # fmt: skip
    parser.add_argument(
        "--api-nodes",
        type=int,
        default=0,
        help="burst-after-nodes phase: nodes registered through the API first (0: no such phase)",
    )
    parser.add_argument("--burst", type=int, default=2_000, help="burst-after-nodes phase: workloads")
    parser.add_argument("--phases", default="", help="run only these scalar phases (comma-separated names)")
    parser.add_argument("--replicas", default="1", help="comma-separated: 1, 2 (a follower takes every request)")
    parser.add_argument("--breakdown", action="store_true", help="split server CPU time: core / store / rest")
    parser.add_argument("--lease-ttl", type=float, default=10.0,
                        help="the server's scheduler lease TTL (s); the server's default is 10")  # fmt: skip
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `finesched serve` argument")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--profile-server", metavar="PATH",
                        help="run the server under cProfile (all threads); stats to PATH.<backend>")  # fmt: skip
    if len(sys.argv) > 2 and sys.argv[1] == "--profiled-serve":
        profiled_serve(sys.argv[2], sys.argv[3:])
        return
    args = parser.parse_args()
    backends = [b.strip() for b in args.db_backends.split(",") if b.strip()]
    for b in backends:
        if b not in ("sqlite", "postgres"):
            parser.error(f"--db-backends: unknown backend {b!r} (sqlite, postgres)")
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    if not clusters or any(c not in ("scalar", "gpu") for c in clusters):
        parser.error(f"--clusters: {args.clusters!r}; use scalar, gpu or both")
    counts = [int(c) for c in args.replicas.split(",") if c.strip()]
    if not counts or any(c not in (1, 2) for c in counts):
        parser.error(f"--replicas: {args.replicas!r}; use 1, 2 or 1,2")
    if "postgres" in backends and not args.pg_url:
        parser.error("--pg-url (or FINESCHED_TEST_PG_URL) is needed for the postgres backend")
    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{args.nodes:,} nodes; server, client and database on this host (127.0.0.1)")  # fmt: skip
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="finesched-bench-") as tmp:
        for backend in backends:
            for replicas in counts:
                for cluster in clusters:
                    rows += run_backend(backend, args, tmp, gpus=cluster == "gpu", replicas=replicas)
    print_tables(rows, args.breakdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
