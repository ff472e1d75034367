"""Issue 29 benchmark: decisions per second of FGD-CPU and FGD-CPU-Exact on the fill protocol, in one run.

    .venv/bin/python bench/fgd_exact.py                    # seed 42, 3 rounds, default trace
    .venv/bin/python bench/fgd_exact.py --rounds 5 --seed 43

Each round runs every policy once, one after the other in one process, so both see the same load
(the machine is shared: wall-clock rates move with it, CPU-time rates much less). A decision is one
arrival placed or refused (`schedule_one`), so decisions = arrivals. Reported per policy: the median
over rounds of decisions/s by wall clock and by this process's CPU time, and the allocation at 130 %.
The claim checked (issue 29): FGD-CPU-Exact decides at the same speed as FGD-CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from finesched.sim import metrics  # noqa: E402
from finesched.sim.experiment import run_fill  # noqa: E402
from finesched.sim.policies import resolve_policy  # noqa: E402
from finesched.sim.trace import load_nodes, load_pods  # noqa: E402

DATA = ROOT / "data" / "alibaba-gpu-v2023"


def timed_run(nodes: object, pods: object, target: object, policy: str, seed: int) -> dict[str, float]:
    """One fill run: decisions, wall and CPU seconds, decisions/s both ways, allocation at 130 %."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    run = run_fill(nodes, pods, policy, seed, target=target)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "decisions": run.pods,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "decisions_per_s_wall": round(run.pods / wall),
        "decisions_per_s_cpu": round(run.pods / cpu),
        "alloc_130": run.record()["alloc"]["130"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--policies", default="FGD-CPU,FGD-CPU-Exact")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    policies = [resolve_policy(p) for p in args.policies.split(",") if p.strip()]
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    target = metrics.target_workload(pods)
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
    for _ in range(args.rounds):
        for policy in policies:
            runs[policy].append(timed_run(nodes, pods, target, policy, args.seed))
    summary = {
        p: {
            "decisions": rows[0]["decisions"],
            "alloc_130": rows[0]["alloc_130"],
            "decisions_per_s_wall_median": statistics.median(r["decisions_per_s_wall"] for r in rows),
            "decisions_per_s_cpu_median": statistics.median(r["decisions_per_s_cpu"] for r in rows),
            "wall_s_per_run": [r["wall_s"] for r in rows],
            "cpu_s_per_run": [r["cpu_s"] for r in rows],
        }
        for p, rows in runs.items()
    }
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(
        json.dumps(
            {"machine": machine, "load_1min_at_end": load, "trace": args.pods.name, "seed": args.seed,
             "rounds": args.rounds, "summary": summary},
            indent=2,
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
