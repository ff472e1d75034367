"""Issue 28 figure: member counts (`Framework.run_count`) over a large cluster.

    .venv/bin/python bench/member_count.py --nodes 10000 --calls 200

The topology step asks, per gang shape, how many members each node holds, then sums that up
the tree; this measures the per-node part: pre_filter + filter + run_count over every node of
bench/devices.py's cluster (8 GPUs per node), with some shares already placed so the cards
differ. Shapes: scalar only (cpu + memory), a 25% GPU share, a 50% share by bytes, 2 whole GPUs,
and a 2-card share (gpu.shared). One share is placed between calls (not timed), so the per-node
caches refresh a changed node each time, as between two gang decisions. Prints calls/s per shape
(a figure, not a test).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

from devices import PROFILE, synthetic_nodes
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.request import compile_request
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

SHAPES = {
    "scalar (cpu 4, memory 16Gi)": {"cpu": "4", "memory": "16Gi"},
    "GPU share 25%": {"cpu": "1", "koordinator.sh/gpu": 25},
    "GPU share 20Gi bytes": {"cpu": "1", "gpu-core": 20, "gpu-memory": "20Gi"},
    "2 whole GPUs": {"cpu": "8", "nvidia.com/gpu": 2},
    "2-card share (gpu.shared 2, 60% each)": {"cpu": "1", "gpu.shared": 2, "gpu": 120},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--fill", type=int, default=20000, help="shares placed first so cards differ")
    args = parser.parse_args()
    scheduler = Scheduler(ClusterState.from_nodes(synthetic_nodes(args.nodes)), PROFILE)
    rng = random.Random(1)
    for k in range(args.fill):
        share = rng.choice([{"koordinator.sh/gpu": 25}, {"koordinator.sh/gpu": 50}, {"nvidia.com/gpu": 1}])
        with contextlib.suppress(FitError):
            scheduler.schedule_one(Workload.model_validate({"name": f"fill-{k}", "requests": {"cpu": "1", **share}}))
    state, framework = scheduler.state, scheduler.framework
    print(f"{args.nodes} nodes x 8 GPUs, {len(state.bindings)} bindings; {args.calls} calls per shape")
    for shape, (label, requests) in enumerate(SHAPES.items()):
        workload = Workload.model_validate({"name": "member", "requests": requests})
        request = compile_request(workload, state, framework.owns)
        nodes = NodeBatch(state)
        elapsed = 0.0
        for call in range(args.calls):
            # one placement between calls, as between two gang decisions: caches refresh that node
            with contextlib.suppress(FitError):
                scheduler.schedule_one(
                    Workload.model_validate(
                        {"name": f"churn-{shape}-{call}", "requests": {"cpu": "1", "koordinator.sh/gpu": 10}}
                    )
                )
            start = time.perf_counter()
            cycle = CycleState()
            skipped = framework.run_pre_filter(cycle, request, nodes)
            feasible, _ = framework.run_filter(cycle, request, nodes, skipped)
            total = framework.run_count(cycle, request, nodes, feasible, skipped)
            elapsed += time.perf_counter() - start
        print(f"  {label:40s} {args.calls / elapsed:8.1f} calls/s  ({int(total.sum())} members fit in all)")


if __name__ == "__main__":
    main()
