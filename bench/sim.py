"""Issue 6 benchmark: speed and quality of the FGD-protocol simulator on the Alibaba GPU trace v2023.

    .venv/bin/python bench/sim.py                      # one FGD run of the default experiment (seed 42)
    .venv/bin/python bench/sim.py --policy FGD-CPU     # one run of another policy
    .venv/bin/python bench/sim.py --grid --jobs 2      # 6 baselines x seeds 42-51: wall time and quality
    .venv/bin/python bench/sim.py --grid --policies FGD,FGD-CPU \
        --pods ../shared/data/alibaba-gpu-v2023/openb_pod_list_cpu050.csv

Targets (issue 6): one FGD run of the default experiment (10,866 arrivals in the paper's seed 42,
1,213 nodes) <= 20 s; the 6-policy x 10-seed grid <= 10 min with --jobs 2; FGD within 0.5
points of the published means at 130 %; our best policy above FGD's 95.39 %.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from finesched.sim import metrics  # noqa: E402
from finesched.sim.experiment import run_fill  # noqa: E402
from finesched.sim.policies import BASELINES, resolve_policy  # noqa: E402
from finesched.sim.report import fill_summary  # noqa: E402
from finesched.sim.runner import RunSpec, parse_seeds, run_all  # noqa: E402
from finesched.sim.trace import load_nodes, load_pods  # noqa: E402

DATA = ROOT / "data" / "alibaba-gpu-v2023"


def one_run(nodes_path: Path, pods_path: Path, policy: str, seed: int) -> dict[str, object]:
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    started = time.perf_counter()
    run = run_fill(nodes, pods, policy, seed, target=metrics.target_workload(pods))
    wall = time.perf_counter() - started
    record = run.record()
    return {
        "policy": run.policy,
        "seed": seed,
        "pods": run.pods,
        "wall_s": round(wall, 2),
        "pods_per_s": round(run.pods / wall),
        "alloc_130": record["alloc"]["130"],
        "failed": run.failed,
    }


def grid(nodes_path: Path, pods_path: Path, policies: list[str], seeds: list[int], jobs: int) -> dict[str, object]:
    specs = [RunSpec("fill", str(nodes_path), str(pods_path), p, s) for p in policies for s in seeds]
    started = time.perf_counter()
    runs = run_all(specs, jobs)
    wall = time.perf_counter() - started
    summary = fill_summary([r["record"] for r in runs])
    rows = {
        p: {
            "mean_130": s["mean_130"],
            "std_130": s["std_130"],
            "published_130": s.get("published_130"),
            "run_wall_s_mean": s["wall_s_mean"],
        }
        for p, s in summary.items()
    }
    return {"runs": len(specs), "jobs": jobs, "wall_s": round(wall, 1), "summary": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--policy", default="FGD", help="policy of the single timed run")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--grid", action="store_true", help="run the policy x seed grid instead")
    parser.add_argument("--policies", default=",".join(BASELINES))
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    if args.grid:
        policies = [resolve_policy(p) for p in args.policies.split(",")]
        result = grid(args.nodes, args.pods, policies, parse_seeds(args.seeds), args.jobs)
    else:
        result = one_run(args.nodes, args.pods, resolve_policy(args.policy), args.seed)
    print(json.dumps({"machine": machine, "trace": args.pods.name, **result}, indent=2))


if __name__ == "__main__":
    main()
