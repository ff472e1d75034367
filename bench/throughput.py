"""Scalar scheduling throughput: decisions/s and latency percentiles at 1k, 10k and 100k nodes.

    python bench/throughput.py --nodes 1000,10000,100000 --decisions 20000

Each cluster size runs in its own process so its RSS is its own. Every node is filtered and
scored for every decision (no sampling). Two workload streams:

* `shapes`: the seeded generator of bench/synthetic.py (7 CPU sizes x 3 memory ratios, 10 %
  pinned to a zone: about 100 distinct request shapes, interleaved at random) — the per-shape
  memo (sched/memo.py) re-evaluates only nodes changed since a shape was last seen;
* `unique`: every workload a different shape, so nothing is reused — the plain vectorized path.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finesched import ClusterState, FitError, Scheduler
from finesched.model.workload import Workload
from synthetic import scalar_workloads, synthetic_nodes


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def unique_shapes(workloads: list[Workload]) -> list[Workload]:
    """The same stream with every request made distinct (cpu + i millicores)."""
    out = []
    for i, w in enumerate(workloads):
        requests = dict(w.requests)
        requests["cpu"] = requests["cpu"] + (i % 997) + 1
        out.append(w.model_copy(update={"requests": type(w.requests)(requests)}))
    return out


def run_one(nodes: int, decisions: int, profile: str, stream: str, seed: int, warm: bool = False) -> dict[str, object]:
    base = rss_mib()
    t0 = time.perf_counter()
    node_list = synthetic_nodes(nodes, seed=seed, devices=False)
    state = ClusterState.from_nodes(node_list)
    build_s = time.perf_counter() - t0
    state_rss = rss_mib()
    sched = Scheduler(state, profile)
    if warm:  # a long-running process's steady state: the compiled memo patch loaded before the loop
        # (and before the freeze below, as a server would load it before freezing its start-up objects)
        try:
            from finesched.plugins.fused_scalar import wait_for_kernel
        except ImportError:  # a commit without the kernel
            pass
        else:
            wait_for_kernel()
    # The cluster is long-lived: move it out of the cyclic GC's reach, or every full collection
    # walks every node's objects (a pause of tens of ms at 100k nodes, every few thousand decisions,
    # which lands in the latency tail). A long-running server does the same after start-up.
    gc.collect()
    gc.freeze()
    workloads = scalar_workloads(decisions, seed=seed + 1)
    if stream == "unique":
        workloads = unique_shapes(workloads)
    latencies = np.empty(len(workloads), dtype=np.int64)
    failed = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for i, w in enumerate(workloads):
        t = time.perf_counter_ns()
        try:
            sched.schedule_one(w)
        except FitError:
            failed += 1
        latencies[i] = time.perf_counter_ns() - t
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    state.check_invariants()
    us = latencies / 1e3
    return {
        "nodes": nodes,
        "stream": stream,
        "profile": profile,
        "decisions": len(workloads),
        "unschedulable": failed,
        "decisions_per_s": round(len(workloads) / wall, 1),
        # On a shared machine the wall clock includes time the OS gave to other processes; CPU time does not.
        "cpu_decisions_per_s": round(len(workloads) / cpu, 1),
        "p50_us": round(float(np.percentile(us, 50)), 1),
        "p99_us": round(float(np.percentile(us, 99)), 1),
        "p999_us": round(float(np.percentile(us, 99.9)), 1),
        "build_s": round(build_s, 2),
        "rss_before_mib": round(base, 1),
        "rss_with_state_mib": round(state_rss, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000,100000", help="comma-separated cluster sizes")
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--streams", default="shapes,unique")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warm",
        action="store_true",
        help="load the fused path's compiled kernel before the measured loop (the default run counts "
        "its one-time load, ~0.45 s of CPU on a background thread, in the figures)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = run_one(int(args.nodes), args.decisions, args.profile, args.streams, args.seed, args.warm)
        print(json.dumps(result))
        return
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, numpy {np.__version__}"
    )
    header = (
        f"{'nodes':>7} {'stream':>7} {'dec/s':>9} {'CPU dec/s':>9} {'p50 us':>8} {'p99 us':>8} {'p999 us':>8} "
        f"{'state RSS':>10}"
    )
    print(header)
    for nodes in (int(n) for n in args.nodes.split(",")):
        for stream in args.streams.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--nodes",
                str(nodes),
                "--decisions",
                str(args.decisions),
                "--profile",
                args.profile,
                "--streams",
                stream,
                "--seed",
                str(args.seed),
                *(["--warm"] if args.warm else []),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(
                f"{r['nodes']:>7} {r['stream']:>7} {r['decisions_per_s']:>9} {r['cpu_decisions_per_s']:>9} "
                f"{r['p50_us']:>8} {r['p99_us']:>8} "
                f"{r['p999_us']:>8} {r['rss_with_state_mib']:>7} MiB",
                flush=True,
            )
            print("  " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
