"""`finesched serve` start to first request answered, through real processes on 127.0.0.1.

    python bench/startup.py --nodes 1000 --runs 5 --base /work/base30/src
    python bench/startup.py --db-backends sqlite,postgres --pg-url postgresql+psycopg://postgres@HOST:PORT/postgres

Each run launches `python -m finesched.cli serve` and polls (every 10 ms, a new connection each
time) until it answers; the figures are seconds from the launch (just before the process is
spawned) to:

* `healthz`: the first 200 of GET /healthz;
* `authed`: the first 200 of an authenticated GET /v1/nodes?limit=1 (an admin token; on a fresh
  database the token is written as soon as the server has made the schema, so this one includes
  that write's wait);
* `leader`: /readyz says this replica leads (the state rebuilt from the store);
* `healthz cpu`, `leader cpu`: the server process's own CPU seconds (user + system, /proc) at those
  two moments: steadier than the wall clock on a machine that other processes load.

Two databases: `fresh` (a new, empty one for every run: the server makes the schema) and `existing`
(made once, --nodes nodes registered through the store, then reused by every run: the schema is
current, the server rebuilds its state from it). Each server is stopped (SIGTERM) before the next
starts.

--base SRC alternates every run with a server started from the code under SRC (PYTHONPATH=SRC, e.g.
a checkout of the previous commit), base first: base, new, base, new, ... (the load average is
printed before each pair), and prints each pair's ratio new/base. The database of `existing` is
made by this checkout's code (the two must share the schema's revision).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api import free_port, fresh_database, register_nodes
from finesched.server.api.auth import create_token
from finesched.server.store.db import open_engines
from finesched.server.store.store import Store

HERE_SRC = str(Path(__file__).resolve().parent.parent / "src")
POLL_S = 0.01
FIGURES = ("healthz", "authed", "leader")
#: The server's own CPU seconds (user + system) when it first answered /healthz and when it led:
#: on a machine other processes load, a steadier figure than the wall clock.
CPU_FIGURES = ("healthz cpu", "leader cpu")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Code:
    """Which code a server runs: its label and the source directory put first on its PYTHONPATH."""

    label: str
    src: str
    figures: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": self.src}

    def check(self) -> str:
        """Where this code's finesched is imported from (so a base run cannot silently run the new code)."""
        done = subprocess.run([sys.executable, "-c", "import finesched; print(finesched.__file__)"],
                              env=self.env(), capture_output=True, text=True, check=True)  # fmt: skip
        where = done.stdout.strip()
        if not where.startswith(self.src):
            raise SystemExit(f"{self.label}: finesched is imported from {where}, not from {self.src}")
        return where


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _get(url: str, headers: dict[str, str] | None = None) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, headers=headers, timeout=2).status_code == 200
    return False


def _leads(base: str) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return bool(httpx.get(f"{base}/readyz", timeout=2).json().get("leader"))
    return False


def _token_when_ready(url: str) -> str | None:
    """An admin token written into `url` once the server made the schema (None: not yet)."""
    with contextlib.suppress(Exception):
        store = Store(open_engines(url, migrate=False))
        try:
            return create_token(store, "admin")
        finally:
            store.close()
    return None


def launch(code: Code, url: str, token: str | None, log: Path) -> dict[str, float]:
    """Start a server from `code` on `url`; seconds from launch to each figure, then stop it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "finesched.cli", "serve", "--db", url, "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", "--data", str(log.with_suffix(".data"))]  # fmt: skip
    out: dict[str, float] = {}
    with open(log, "ab") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=code.env())
        try:
            deadline = time.monotonic() + 120
            while len(out) < len(FIGURES) + len(CPU_FIGURES):
                if proc.poll() is not None:
                    raise RuntimeError(f"{code.label}: server exited with {proc.returncode} (log: {log})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{code.label}: no answer after 120 s (log: {log})")
                if "healthz" not in out and _get(f"{base}/healthz"):
                    out["healthz"] = time.perf_counter() - started
                    out["healthz cpu"] = _cpu_seconds(proc.pid)
                if "healthz" in out and token is None:
                    token = _token_when_ready(url)
                authed = {"Authorization": f"Bearer {token}"}
                if "authed" not in out and token is not None and _get(f"{base}/v1/nodes?limit=1", authed):
                    out["authed"] = time.perf_counter() - started
                if "leader" not in out and "healthz" in out and _leads(base):
                    out["leader"] = time.perf_counter() - started
                    out["leader cpu"] = _cpu_seconds(proc.pid)
                time.sleep(POLL_S)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-backends", default="sqlite", help="comma-separated: sqlite, postgres")
    parser.add_argument("--pg-url", default=os.environ.get("FINESCHED_TEST_PG_URL", ""),
                        help="PostgreSQL server URL (databases are created and dropped in it)")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=1_000, help="nodes in the existing database")
    parser.add_argument("--runs", type=int, default=5, help="launches per code, database and backend")
    parser.add_argument("--databases", default="fresh,existing", help="comma-separated: fresh, existing")
    parser.add_argument("--base", default="", help="alternate with a server from the code under this src directory")
    args = parser.parse_args()
    backends = [b for b in args.db_backends.split(",") if b]
    databases = [d for d in args.databases.split(",") if d]
    if any(b not in ("sqlite", "postgres") for b in backends) or any(d not in ("fresh", "existing") for d in databases):
        parser.error("unknown backend or database")
    if "postgres" in backends and not args.pg_url:
        parser.error("--pg-url (or FINESCHED_TEST_PG_URL) is needed for the postgres backend")
    codes = [Code("new", HERE_SRC)]
    if args.base:
        codes.insert(0, Code("base", os.path.abspath(args.base)))
    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"{args.nodes:,} nodes in the existing database; median of {args.runs}")  # fmt: skip
    for code in codes:
        print(f"{code.label}: {code.check()}")
    ratios: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="finesched-startup-") as tmp:
        for backend in backends:
            with fresh_database(backend, args.pg_url, tmp) as existing:
                token, _ = register_nodes(existing, args.nodes, False)
                for run in range(args.runs):
                    print(f"[{backend}] run {run + 1}: load {_load()}", flush=True)
                    for database in databases:
                        pair: dict[str, dict[str, float]] = {}
                        for code in codes:
                            log = Path(tmp) / f"{backend}-{database}-{code.label}-{run}.log"
                            if database == "existing":
                                pair[code.label] = launch(code, existing, token, log)
                            else:
                                with fresh_database(backend, args.pg_url, tmp) as url:
                                    pair[code.label] = launch(code, url, None, log)
                            for name, value in pair[code.label].items():
                                code.figures.setdefault((backend, database, name), []).append(value)
                        shown = "  ".join(f"{label} " + " ".join(f"{k} {v:.2f}" for k, v in fig.items())
                                          for label, fig in pair.items())  # fmt: skip
                        print(f"  {database}: {shown}", flush=True)
                        if "base" in pair:
                            for name in FIGURES + CPU_FIGURES:
                                ratios.setdefault((backend, database, name), []).append(
                                    pair["new"][name] / pair["base"][name]
                                )
    print(f"\nload {_load()} at the end\n")
    header = "| backend | database | figure | " + " | ".join(f"{c.label} median s (min–max)" for c in codes)
    print(header + (" | ratios new/base per pair |" if args.base else " |"))
    print("|---|---|---|" + "---:|" * len(codes) + ("---|" if args.base else ""))
    for backend in backends:
        for database in databases:
            for name in FIGURES + CPU_FIGURES:
                key = (backend, database, name)
                cells = []
                for code in codes:
                    values = code.figures.get(key, [])
                    cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})")
                row = f"| {backend} | {database} | {name} | " + " | ".join(cells) + " |"
                if args.base:
                    row += " " + ", ".join(f"{r:.2f}" for r in ratios[key]) + " |"
                print(row)


if __name__ == "__main__":
    main()
