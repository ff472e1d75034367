"""A tenant behind its own flood, through the real HTTP API of a `finesched serve` subprocess (SQLite).

    python bench/own_flood.py --workloads 20000     # the flood size; 100000 is the issue's

Tenant team-a submits `--workloads` workloads (lists of 1,000) asking more CPU than any node has, so
they stay Pending in team-a's own queue; then, every 0.5 s, `--later` more workloads of team-a that
fit, each timed from its submission to Bound (polled). Printed: the flood's rate, the reason a later
workload shows right after its submission (it must never be empty), and p50/max of the later
workloads' submit -> Bound. Before the server kept deciding while work waited its turn, an idle
batch (nothing placed) slept a quarter second, and a later workload waited for the whole flood to be
tried: minutes for 100,000.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from bench_flood import API, _cpu_model, free_port, percentiles, print_figures, tenant_tokens, workload
from finesched.server.api.auth import create_token
from finesched.server.store.store import Store


def wait_leader(http: httpx.Client) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if http.get("/readyz").json().get("leader"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not start (see its log)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=20_000, help="team-a's flood of workloads that fit nowhere")
    parser.add_argument("--later", type=int, default=5, help="team-a's later workloads that fit, timed")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="finesched-own-flood-")
    db = f"sqlite:///{tmp}/flood.db"
    store = Store.open(db)
    admin, (token_a,) = create_token(store, "admin"), tenant_tokens(store, ("team-a",))
    store.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(f"{tmp}/serve.log", "wb")  # noqa: SIM115 - closed at the end
    cmd = [sys.executable, "-m", "finesched.cli", "serve", "--db", db, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    machine = {"nproc": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version()}
    figures: dict[str, Any] = {"workloads": args.workloads, "machine": machine}
    try:
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=600)
        wait_leader(http)
        node = {"apiVersion": API, "kind": "Node", "metadata": {"name": "n1"},
                "spec": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": 5000}}}  # fmt: skip
        assert http.post("/v1/nodes", json=node).status_code == 201
        a = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token_a}"}, timeout=600)
        started = time.monotonic()
        for start in range(0, args.workloads, 1000):
            names = range(start, min(args.workloads, start + 1000))
            answer = a.post("/v1/workloads", json=[workload(f"flood-{i}", "team-a", "1000") for i in names])
            assert answer.status_code == 201, answer.text
        took = time.monotonic() - started
        figures["flood"] = {"seconds": round(took, 1), "per_second": round(args.workloads / took)}
        bound: list[float] = []
        reasons: list[str] = []
        for i in range(args.later):
            name = f"later-{i}"
            submitted = time.perf_counter()
            assert a.post("/v1/workloads", json=workload(name, "team-a", "100m")).status_code == 201
            while True:
                status = a.get(f"/v1/workloads/team-a/{name}").json()["status"]
                if len(reasons) == i and status["phase"] == "Pending":
                    reasons.append(status["reason"])
                if status["phase"] == "Bound":
                    bound.append(time.perf_counter() - submitted)
                    break
                if time.perf_counter() - submitted > 1800:
                    raise SystemExit(f"{name} was not Bound in 30 minutes")
                time.sleep(0.01)
            time.sleep(0.5)
        figures["later_submit_to_bound"] = percentiles(bound)
        figures["later_first_reasons"] = reasons
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    print_figures(figures, args.json)


if __name__ == "__main__":
    main()
