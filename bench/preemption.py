"""Issue 14 benchmark: one preemption decision on a full cluster of 10,000 nodes x 8 GPUs.

    python bench/preemption.py                        # 10,000 nodes, 40 workloads each, 50 decisions
    python bench/preemption.py --nodes 1000 --decisions 20

Cluster: nodes of 64 CPUs, 512Gi, 8 GPUs (80Gi); each GPU holds 5 workloads of 20 % (gpu-core
20, gpu-memory-ratio 20) with 1 CPU and 4Gi each, so every GPU is full (40 bindings per node,
400,000 in all). Victim priorities are drawn (seeded) from 3 classes, 0 / 1 / 2, with weights
60 / 30 / 10 %, and start order is random.

Each decision: a whole-GPU workload (nvidia.com/gpu: 1, 1 CPU, 4Gi) at priority 10 fits nowhere;
`Scheduler.find_preemption` runs the DefaultPreemption post_filter (vectorized pass over all
nodes, victim selection with reprieve on the best candidates, an exact check with the real
filters on the state minus the victims). The state is not changed; the timing is the decision.
Prints the victims of the first decision, and latency percentiles over all decisions, in wall
time and in this process's CPU time (the machine is shared: a gap between them is other load).
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from finesched.model.binding import Binding, DeviceGrant
from finesched.model.node import Node
from finesched.model.resources import ResourceVector
from finesched.model.workload import Workload
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GIB = 1 << 30
PER_GPU = 5
GPUS = 8


def build(nodes: int, seed: int) -> Scheduler:
    rng = np.random.default_rng(seed)
    devices = [{"type": "gpu", "minor": g, "resources": {"koordinator.sh/gpu-memory": "80Gi"}} for g in range(GPUS)]
    shape = {"allocatable": {"cpu": "64", "memory": "512Gi"}, "devices": devices}
    node_objs = [Node.model_validate({"name": f"n{i:05d}", **shape}) for i in range(nodes)]
    state = ClusterState.from_nodes(node_objs)
    scheduler = Scheduler(state)
    requests = ResourceVector({"cpu": 1000, "memory": 4 * GIB, "pods": 1})
    share = ResourceVector({"gpu-core": 20, "gpu-memory-ratio": 20, "gpu-memory": 16 * GIB})
    priorities = rng.choice([0, 1, 2], p=[0.6, 0.3, 0.1], size=nodes * GPUS * PER_GPU)
    order = rng.permutation(nodes * GPUS * PER_GPU)  # random start order across the cluster
    for k in order:
        i, rest = divmod(int(k), GPUS * PER_GPU)
        gpu = rest // PER_GPU
        binding = Binding(
            workload=f"default/w{int(k)}",
            node=f"n{i:05d}",
            tenant="default",
            priority=int(priorities[k]),
            requests=requests,
            devices={"gpu": [DeviceGrant(minor=gpu, resources=share)]},
        )
        state.assume(binding)
        state.commit(binding.workload)
    return scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    t0 = time.perf_counter()
    scheduler = build(args.nodes, args.seed)
    built = time.perf_counter() - t0
    count = len(scheduler.state.bindings)
    print(f"cluster: {args.nodes} nodes x {GPUS} GPUs, {count} bindings (built in {built:.1f} s)")
    gc.collect()
    gc.freeze()
    times, cpu_times = [], []
    first = None
    for d in range(args.decisions):
        workload = Workload.model_validate(
            {
                "name": f"hi{d}",
                "priority": 10,
                "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": 1},
            }
        )
        start, cpu_start = time.perf_counter(), time.process_time()
        p, why = scheduler.find_preemption(workload)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        if p is None:
            raise SystemExit(f"no preemption found: {why}")
        first = first or p
    assert first is not None
    victims = ", ".join(f"{v.workload} (priority {v.priority})" for v in first.victims)
    print(f"first decision: node {first.node}, {len(first.victims)} victims: {victims}")
    for label, values in (("wall", times), ("cpu", cpu_times)):
        ms = np.array(values) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        print(
            f"preemption decision ({label} time) over {args.decisions} runs: p50 {p50:.2f} ms, p90 {p90:.2f} ms, "
            f"p99 {p99:.2f} ms, max {ms.max():.2f} ms"
        )


if __name__ == "__main__":
    main()
