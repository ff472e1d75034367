"""Defragmentation planner speed: `find_defragmentation` calls per second on a fragmented cluster.

    python bench/defrag_plan.py --nodes 1000,10000 --calls 200

Each cluster: --nodes nodes of 8 GPUs (80Gi), 96 CPUs and 512Gi, filled by the default profile
with movable workloads (a random GPU share of 10-90 % with 1-16 CPUs and 4-64Gi, or a CPU-only
workload) until --fill of the GPU-core is held, so cards are left in fragments. Then --calls
waiting workloads (1, 2, 4 or 8 whole GPUs, or a GPU share with many CPUs) that fit nowhere are
planned for, one call each, on the unchanged state (the planner changes nothing). Printed per
cluster: plans/s (calls over their wall time), how many calls found a plan, the mean, median
and p99 of one call, the mean number of moves per plan and how many plans hold a chain (a move
that makes room for another mover). `--fill 0.95` packs the cards so that chains are needed.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.defrag import Defragmenter
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Defragmentation, resolve_profile
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GPU = {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"}


def node(i: int) -> Node:
    devices = [{"type": "gpu", "minor": k, "health": True, "resources": GPU} for k in range(8)]
    return Node.model_validate(
        {"name": f"n{i}", "allocatable": {"cpu": "96", "memory": "512Gi", "pods": 110}, "devices": devices}
    )


def workload(name: str, requests: dict[str, str], movable: bool) -> Workload:
    doc: dict[str, object] = {"name": name, "requests": requests}
    if movable:
        doc["migration"] = {"allowed": True}
    return Workload.model_validate(doc)


def fill(s: Scheduler, rng: random.Random, target: float, nodes: int) -> int:
    total, held, count, misses = nodes * 800, 0, 0, 0
    while held < target * total and misses < 200:
        count += 1
        if rng.random() < 0.8:
            core = rng.choice((10, 20, 25, 30, 40, 50, 60, 75, 90))
            req = {"gpu": str(core), "cpu": str(rng.randint(1, 16)), "memory": f"{rng.randint(4, 64)}Gi"}
        else:
            core, req = 0, {"cpu": str(rng.randint(4, 48)), "memory": f"{rng.randint(8, 256)}Gi"}
        try:
            s.schedule_one(workload(f"r{count}", req, movable=True))
            held += core
        except FitError:
            misses += 1
    return len(s.state.bindings)


def waiting(rng: random.Random, k: int) -> Workload:
    kind = rng.random()
    if kind < 0.7:
        req = {"nvidia.com/gpu": str(rng.choice((1, 1, 2, 4, 8))), "cpu": str(rng.randint(2, 32))}
    else:
        req = {"gpu": str(rng.choice((50, 75))), "cpu": str(rng.randint(48, 90)), "memory": "128Gi"}
    return workload(f"w{k}", req, movable=False)


def bench(nodes: int, calls: int, fill_to: float, seed: int) -> None:
    rng = random.Random(seed)
    profile = resolve_profile("default").model_copy(update={"defragmentation": Defragmentation()})
    s = Scheduler(ClusterState.from_nodes(node(i) for i in range(nodes)), profile)
    t0 = time.perf_counter()
    bound = fill(s, rng, fill_to, nodes)
    print(f"{nodes} nodes: {bound} workloads bound in {time.perf_counter() - t0:.1f}s")
    defragmenter = Defragmenter(Defragmentation(max_moves_per_minute=100_000, max_moves_per_tenant_per_minute=100_000))
    times, moves, found, chained, asked, k = [], [], 0, 0, 0, 0
    while asked < calls and k < 50 * calls:
        k += 1
        w = waiting(rng, k)
        try:  # only workloads that fit nowhere are planned for (as Scheduler.run does)
            s.schedule_one(w)
            s.release(w.key)
            continue
        except FitError as exc:
            if exc.unresolvable:
                continue
        asked += 1
        t = time.perf_counter()
        plan, _ = s.find_defragmentation(w, defragmenter, now=0.0)
        times.append(time.perf_counter() - t)
        if plan is not None:
            found += 1
            moves.append(len(plan.moves))
            chained += any("room for another workload" in m.reason for m in plan.moves)
    ms = np.array(times) * 1000
    if not len(ms):
        print("  no waiting workload fitted nowhere: raise --fill")
        return
    print(
        f"  {asked} calls: {asked / ms.sum() * 1000:.0f} plans/s, {found} found a plan "
        f"(mean {np.mean(moves) if moves else 0:.2f} moves, {chained} with a chain); per call mean {ms.mean():.2f} ms, "
        f"median {np.median(ms):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--fill", type=float, default=0.8, help="fraction of GPU-core held before planning")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    for n in (int(x) for x in args.nodes.split(",")):
        bench(n, args.calls, args.fill, args.seed)


if __name__ == "__main__":
    main()
