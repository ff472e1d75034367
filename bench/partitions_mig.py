"""Decisions/s with GPU partition tables and with MIG on a large synthetic cluster.

    .venv/bin/python bench/partitions_mig.py --nodes 10000 --decisions 5000                 # both
    .venv/bin/python bench/partitions_mig.py --scenario partitions --nodes 10000
    .venv/bin/python bench/partitions_mig.py --scenario mig --nodes 10000 --breakdown

* ``partitions``: the nodes of bench/devices.py (8 GPUs, NVLink pairs, 2 NUMA nodes) carrying an
  HGX-style partition table (the eight, two fours, four NVLink pairs at score 1, two cross pairs at
  score 0, the ones); half the nodes Honor, half Prefer. Stream: whole GPUs 1/2/4/8 (a third with a
  gpu-partition-spec: Restricted, BestEffort, or a ring bandwidth) and some GPU shares.
* ``mig``: nodes of 8 H100 80GB cards in MIG mode, three quarters dynamic and a quarter static with
  mig-parted's balanced layout. Stream: one instance of 1g.10gb (40 %), 2g.20gb (20 %), 3g.40gb
  (20 %), 4g.40gb (5 %), 7g.80gb (5 %), and two 1g.10gb (10 %).

Every node is filtered and scored for every decision (per-shape memo on); the exact choice runs on
the candidates. Prints decisions/s and latency percentiles like bench/devices.py.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from typing import Any

from devices import PROFILE, node_template, timed
from finesched.model.binding import Binding
from finesched.model.mig import PRODUCTS
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare.mig import mig_request
from finesched.sched.profile import Profile
from finesched.sched.scheduler import Scheduler
from finesched.sim.mig import balanced_layout
from finesched.state.cluster import ClusterState

PAIRS = [[0, 1], [2, 3], [4, 5], [6, 7]]
TABLE: dict[str, list[dict[str, Any]]] = {
    "8": [{"minors": list(range(8)), "allocationScore": 1, "ringBusBandwidth": "400Gi"}],
    "4": [{"minors": [0, 1, 2, 3], "allocationScore": 1, "ringBusBandwidth": "400Gi"},
          {"minors": [4, 5, 6, 7], "allocationScore": 1, "ringBusBandwidth": "400Gi"}],
    "2": [*({"minors": p, "allocationScore": 1, "ringBusBandwidth": "400Gi"} for p in PAIRS),
          {"minors": [1, 2], "allocationScore": 0, "ringBusBandwidth": "200Gi"},
          {"minors": [5, 6], "allocationScore": 0, "ringBusBandwidth": "200Gi"}],
    "1": [{"minors": [m], "allocationScore": 1} for m in range(8)],
}  # fmt: skip


def partition_nodes(n: int) -> list[Node]:
    base = node_template(["80Gi"] * 8)
    shapes = []
    for policy in ("Honor", "Prefer"):
        data = {**base.model_dump(by_alias=True), "gpuPartitions": TABLE, "policies": {"gpuPartitionPolicy": policy}}
        shapes.append(Node.model_validate(data))
    return [shapes[i % 2].model_copy(update={"name": f"node-{i:06d}"}) for i in range(n)]


def mig_nodes(n: int) -> list[Node]:
    shapes = []
    for mode, instances in (("dynamic", []), ("static", balanced_layout(PRODUCTS["H100-80GB"]))):
        mig = {"product": "H100-80GB", "mode": mode, "instances": instances}
        devices = [{"type": "gpu", "minor": m, "numa": m // 4, "mig": mig} for m in range(8)]
        shapes.append(
            Node.model_validate(
                {
                    "name": "t",
                    "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"},
                    "numaZones": [{"id": 0}, {"id": 1}],
                    "devices": devices,
                }
            )
        )
    return [shapes[0 if i % 4 else 1].model_copy(update={"name": f"node-{i:06d}"}) for i in range(n)]


PARTITION_STREAM = [
    (20, {"nvidia.com/gpu": 1}, None),
    (20, {"nvidia.com/gpu": 2}, None),
    (8, {"nvidia.com/gpu": 4}, None),
    (4, {"nvidia.com/gpu": 8}, None),
    (10, {"nvidia.com/gpu": 2}, {"allocatePolicy": "Restricted"}),
    (10, {"nvidia.com/gpu": 2}, {"allocatePolicy": "BestEffort"}),
    (8, {"nvidia.com/gpu": 2}, {"ringBusBandwidth": "300Gi"}),
    (20, {"koordinator.sh/gpu": 25}, None),
]
MIG_STREAM = [
    (40, {"nvidia.com/mig-1g.10gb": 1}, None),
    (20, {"nvidia.com/mig-2g.20gb": 1}, None),
    (20, {"nvidia.com/mig-3g.40gb": 1}, None),
    (5, {"nvidia.com/mig-4g.40gb": 1}, None),
    (5, {"nvidia.com/mig-7g.80gb": 1}, None),
    (10, {"nvidia.com/mig-1g.10gb": 2}, None),
]


def stream(kind: str, count: int, seed: int = 1) -> list[Workload]:
    rng = random.Random(seed)
    table = PARTITION_STREAM if kind == "partitions" else MIG_STREAM
    weights = [w for w, _, _ in table]
    out = []
    for i in range(count):
        _, requests, spec = rng.choices(table, weights)[0]
        data: dict[str, Any] = {
            "name": f"w{i:07d}",
            "requests": {"cpu": rng.choice(["1", "2"]), "memory": "8Gi", **requests},
        }
        if spec is not None:
            data["gpuPartitionSpec"] = spec
        out.append(Workload.model_validate(data))
    return out


def run(kind: str, n: int, decisions: int, warmup: int, breakdown: bool) -> None:
    start = time.perf_counter()
    nodes = partition_nodes(n) if kind == "partitions" else mig_nodes(n)
    scheduler = Scheduler(ClusterState.from_nodes(nodes), profile=Profile.model_validate(PROFILE))
    print(f"{kind}, nodes {n}: state + scheduler built in {time.perf_counter() - start:.1f}s")
    workloads = stream(kind, warmup + decisions)
    timed(scheduler, workloads, warmup, breakdown, f"{kind}, nodes {n}")
    if n <= 20000:
        scheduler.state.check_invariants()
    wrong = [w.key for w in workloads if not _as_asked(w, scheduler.state.bindings.get(w.key))]
    if wrong:  # the state's invariants cannot see this: they do not know the requests
        raise SystemExit(f"{len(wrong)} MIG grants are not the profiles and counts asked for, e.g. {wrong[0]}")


def _as_asked(workload: Workload, binding: Binding | None) -> bool:
    """The binding's MIG instances are the workload's MIG request (True when it asks none or is unbound)."""
    asked = mig_request(workload.requests)
    if asked is None or binding is None:
        return True
    held = Counter(g.mig.profile for g in binding.devices.get("gpu", ()) if g.mig is not None)
    return held == Counter(dict(asked.wants))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["partitions", "mig", "both"], default="both")
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--breakdown", action="store_true", help="time each plugin's extension points")
    args = parser.parse_args(argv)
    for kind in ("partitions", "mig") if args.scenario == "both" else (args.scenario,):
        run(kind, args.nodes, args.decisions, args.warmup, args.breakdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
