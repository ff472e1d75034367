"""Queue scaling: the cost of a decision must not grow with the number of queued workloads.

    python bench/queue_scaling.py                             # queue ops at 1k/10k/100k queued; run() at 10k nodes
    python bench/queue_scaling.py --queued 1000,10000 --nodes 2000

Two measurements, each at several queue lengths:

* queue operations alone (`SchedulingQueue`): push every workload (4 tenants with weights 1-4,
  3 priorities), then pop them all, charging each popped workload to its tenant as a placement
  would — microseconds per push and per pop;
* the whole path (`Scheduler.submit` + `Scheduler.run`, default profile) on a synthetic cluster
  large enough to place every workload — decisions/s over the whole run.

Flat columns mean no cost grows with the queue (pop is O(priorities + tenants)).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finesched import ClusterState, Scheduler
from finesched.model.tenant import Tenant
from finesched.model.workload import Workload
from finesched.sched.queue import SchedulingQueue, demand_of
from synthetic import scalar_workloads, synthetic_nodes

TENANTS = [Tenant(name=f"team-{i}", weight=float(i + 1)) for i in range(4)]


def queued_workloads(count: int, seed: int) -> list[Workload]:
    """The scalar stream of bench/synthetic.py over 4 tenants (namespaces) and 3 priorities."""
    return [w.model_copy(update={"priority": (i * 7919) % 3}) for i, w in enumerate(scalar_workloads(count, seed=seed))]


def queue_ops(workloads: list[Workload], capacity: dict[str, int]) -> tuple[float, float]:
    """Microseconds per push and per pop (with a DRF charge per pop) for the whole list."""
    queue = SchedulingQueue(TENANTS, capacity=lambda: capacity)
    t0 = time.perf_counter()
    for w in workloads:
        queue.push(w)
    t1 = time.perf_counter()
    popped = 0
    while (unit := queue.pop()) is not None:
        queue.done(unit)
        for w in unit.workloads:
            queue.charge(w.tenant, demand_of(w))
        popped += 1
    t2 = time.perf_counter()
    if popped != len(workloads):
        raise AssertionError(f"popped {popped} of {len(workloads)}")
    return (t1 - t0) / len(workloads) * 1e6, (t2 - t1) / popped * 1e6


def scheduler_run(nodes: list, workloads: list[Workload]) -> tuple[float, int]:
    """Decisions/s of submit + run over the whole list on a fresh cluster, and how many were placed."""
    state = ClusterState.from_nodes(nodes)
    sched = Scheduler(state, "default", tenants=TENANTS)
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    sched.submit(workloads)
    results = sched.run()
    wall = time.perf_counter() - t0
    gc.unfreeze()
    state.check_invariants()
    placed = sum(1 for r in results if not isinstance(r, Exception))
    return len(workloads) / wall, placed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", default="1000,10000,100000", help="queue lengths for the queue-only run")
    parser.add_argument("--run-queued", default="2000,10000,40000", help="queue lengths for submit + run")
    parser.add_argument("--nodes", type=int, default=10000, help="cluster size for submit + run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    nodes = synthetic_nodes(args.nodes, seed=0, devices=False)
    capacity = ClusterState.from_nodes(nodes).totals()
    print("queue only (4 weighted tenants, 3 priorities)")
    print(f"{'queued':>8} {'us/push':>8} {'us/pop':>8}")
    for count in (int(q) for q in args.queued.split(",")):
        push_us, pop_us = queue_ops(queued_workloads(count, args.seed), capacity)
        print(f"{count:>8} {push_us:>8.2f} {pop_us:>8.2f}", flush=True)

    print(f"submit + run, default profile, {args.nodes} nodes")
    print(f"{'queued':>8} {'dec/s':>8} {'placed':>8}")
    for count in (int(q) for q in args.run_queued.split(",")):
        rate, placed = scheduler_run(nodes, queued_workloads(count, args.seed))
        print(f"{count:>8} {rate:>8.0f} {placed:>8}", flush=True)


if __name__ == "__main__":
    main()
