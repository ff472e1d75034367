"""Issue 28 figure: gang decisions/s for 8- and 64-member gangs at 10,000 nodes in 3 levels.

    .venv/bin/python bench/topology_gangs.py                       # 10,000 nodes, 100 gangs per case
    .venv/bin/python bench/topology_gangs.py --nodes 2000 --gangs 20 --policy KeepDomainsWhole

Cluster: `--nodes` nodes of 8 GPUs (gpu-core and gpu-memory-ratio 100, 80 GiB each), 64 CPUs, 512 GiB, labelled
in blocks of `--block-size` racks of `--rack-size` nodes (topology.finesched.io/block, .../rack,
kubernetes.io/hostname); every fourth rack is already half used (4 whole GPUs taken on each of its
nodes) so domains differ. Cases: 8 and 64 members, whole-GPU members (1 GPU each) and GPU-share members
(gpu-core 50 each), with `required: rack`, `required: block`, and the same gangs without topology.
Each case places `--gangs` gangs one after another on a fresh copy of the cluster (they stay
placed; two untimed gangs first) with `Scheduler.schedule_gang`. Prints gangs/s and members/s per case and the ratio
topology / no topology in the same run; and how many gangs landed inside one domain of the level
they required (a check, not a speed).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from typing import Any

from finesched.model.node import Node
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL, Topology
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

PLUGINS = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}, {"name": "DeviceShare"}, {"name": "MostAllocated"}]
TOPOLOGY = Topology.model_validate(
    {"name": "dc", "levels": [{"nodeLabel": BLOCK_LABEL}, {"nodeLabel": RACK_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]}
)
LEVELS = {"rack": RACK_LABEL, "block": BLOCK_LABEL}
#: Gangs placed before the clock starts in each case.
WARMUP = 2


def cluster(n: int, rack_size: int, block_size: int) -> tuple[ClusterState, dict[str, tuple[str, str]]]:
    """`n` 8-GPU nodes in racks and blocks, every fourth rack half used; node -> (rack, block)."""
    gpus = [
        {"type": "gpu", "minor": m, "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"}}
        for m in range(8)
    ]
    template = Node.model_validate(
        {"name": "t", "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "1000"}, "devices": gpus}
    )
    nodes, where = [], {}
    for i in range(n):
        rack, block = f"r{i // rack_size}", f"b{i // (rack_size * block_size)}"
        name = f"node-{i:05d}"
        labels = {BLOCK_LABEL: block, RACK_LABEL: rack, HOSTNAME_LABEL: name}
        nodes.append(template.model_copy(update={"name": name, "labels": labels}))
        where[name] = (rack, block)
    state = ClusterState.from_nodes(nodes)
    filler = Scheduler(state, Profile.model_validate({"name": "fill", "plugins": PLUGINS}), registry=default_registry())
    for i in (i for i in range(n) if (i // rack_size) % 4 == 3):
        w = Workload.model_validate(
            {
                "name": f"busy-{i}",
                "requests": {"cpu": "8", "nvidia.com/gpu": 4},
                "nodeSelector": {HOSTNAME_LABEL: f"node-{i:05d}"},
            }
        )
        filler.schedule_one(w)
    return state, where


def gang(g: int, members: int, share: bool, level: str | None) -> list[Workload]:
    spec: dict[str, Any] = {"name": f"g{g}", "minMember": members}
    if level is not None:
        spec["topology"] = {"name": "dc", "required": LEVELS[level]}
    devices = {"gpu-core": 50, "gpu-memory-ratio": 50} if share else {"nvidia.com/gpu": 1}
    first = Workload.model_validate({"name": f"g{g}-0", "requests": {"cpu": "1", **devices}, "gang": spec})
    return [first.model_copy(update={"name": f"g{g}-{m}"}) for m in range(members)]


def run_case(args: argparse.Namespace, members: int, share: bool, level: str | None) -> dict[str, Any]:
    state, where = cluster(args.nodes, args.rack_size, args.block_size)
    profile: dict[str, Any] = {"name": "bench-topology", "plugins": PLUGINS}
    if level is not None and "topology_policy" in Profile.model_fields:
        profile["topologyPolicy"] = args.policy
    scheduler = Scheduler(state, Profile.model_validate(profile), registry=default_registry(), topologies=[TOPOLOGY])
    for g in range(WARMUP):  # first decisions build per-shape caches: not what a busy scheduler pays
        with contextlib.suppress(FitError):  # a gang that waits is reported below, as not placed
            scheduler.schedule_gang(gang(-1 - g, members, share, level))
    gangs = [gang(g, members, share, level) for g in range(args.gangs)]
    placed = inside = 0
    gc.collect()
    started = time.perf_counter()
    for workloads in gangs:
        try:
            bindings = scheduler.schedule_gang(workloads)
        except FitError:
            continue
        placed += 1
        if level is not None:
            column = 0 if level == "rack" else 1
            inside += len({where[b.node][column] for b in bindings}) == 1
    wall = time.perf_counter() - started
    return {"gangs_s": args.gangs / wall, "members_s": args.gangs * members / wall, "placed": placed, "inside": inside}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rack-size", type=int, default=8, help="nodes per rack")
    parser.add_argument("--block-size", type=int, default=8, help="racks per block")
    parser.add_argument("--gangs", type=int, default=100, help="gangs placed per case")
    parser.add_argument("--policy", default="BestFit", help="topologyPolicy: BestFit or KeepDomainsWhole")
    args = parser.parse_args()
    if min(args.nodes, args.rack_size, args.block_size, args.gangs) < 1:
        parser.error("--nodes, --rack-size, --block-size and --gangs must be >= 1")
    print(
        f"{args.nodes} nodes x 8 GPUs, racks of {args.rack_size} nodes, blocks of {args.block_size} racks; "
        f"{args.gangs} gangs per case; topologyPolicy {args.policy}"
        + ("" if "topology_policy" in Profile.model_fields else " (not in this Scheduler: default placement)")
    )
    head = ("members", "kind", "required", "gangs/s", "members/s", "vs none", "placed", "inside")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (7, 6, 8, 9, 10, 8, 7, 7), strict=True)))
    for members in (8, 64):
        for share in (False, True):
            base = run_case(args, members, share, None)
            for level in (None, "rack", "block"):
                r = base if level is None else run_case(args, members, share, level)
                ratio = r["gangs_s"] / base["gangs_s"]
                inside = "" if level is None else str(r["inside"])
                print(
                    f"{members:>7} {'share' if share else 'whole':>6} {level or 'none':>8} {r['gangs_s']:>9.1f} "
                    f"{r['members_s']:>10.0f} {ratio:>8.2f} {r['placed']:>7} {inside:>7}"
                )


if __name__ == "__main__":
    main()
