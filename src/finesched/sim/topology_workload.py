"""What the topology experiment (sim/topology.py) runs on: the cluster cut into racks and blocks,
the gang jobs and their members, and which of the trace's pods arrive beside them (all seeded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.base import FrozenDict
from finesched.model.node import Node
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL, Topology
from finesched.model.workload import Workload
from finesched.sim.policies import resolve_policy
from finesched.sim.trace import MILLI_PER_GPU, NodeTable, PodTable, gpu_requests, to_nodes

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

TOPOLOGY_NAME = "dc"
#: The experiment's policies: gangs without topology, then the two topology policies of the profile.
UNAWARE = "unaware"
TOPOLOGY_POLICIES = (UNAWARE, "BestFit", "KeepDomainsWhole")
LEVELS = {"rack": RACK_LABEL, "block": BLOCK_LABEL}
BACKGROUNDS = ("all", "share", "none")
GANG_NAMESPACE = "gangs"
GANG_TENANT = "train"
MAX_GANG_MEMBERS = 1024
#: Every gang member's CPU and memory (small beside the nodes' 64-96 CPUs).
MEMBER_CPU_MILLI = 1000
MEMBER_MEMORY_MIB = 4096
DEFAULT_GANG_MIX = "2:0.3,8:0.4,16:0.2,64:0.1"


def parse_gang_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``2:0.3,8:0.4`` -> ((2, 0.3), (8, 0.4)): member counts and their weights; ValueError naming
    the bad element otherwise."""
    mix: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",")):
        size, colon, weight = part.partition(":")
        try:
            members, share = int(size), float(weight)
        except ValueError:
            members, share = -1, -1.0
        if not colon or members < 1 or share < 0 or not math.isfinite(share):
            raise ValueError(
                f"--gang-mix: bad element {part!r}: use MEMBERS:WEIGHT with MEMBERS >= 1 and WEIGHT >= 0 "
                "(e.g. 2:0.3,8:0.4,16:0.2,64:0.1)"
            )
        if members > MAX_GANG_MEMBERS:
            raise ValueError(f"--gang-mix: bad element {part!r}: at most {MAX_GANG_MEMBERS} members")
        if members in mix:
            raise ValueError(f"--gang-mix: {members} members given twice")
        mix[members] = share
    if sum(mix.values()) <= 0:
        raise ValueError(f"--gang-mix: the weights must have a positive sum, got {text!r}")
    return tuple(sorted(mix.items()))


@dataclass(frozen=True)
class TopologyConfig:
    """The experiment's knobs (see the module docstring); `check` says what is wrong with them."""

    rack_size: int = 8
    block_size: int = 4
    gang_mix: tuple[tuple[int, float], ...] = parse_gang_mix(DEFAULT_GANG_MIX)
    fractional_share: float = 0.3
    share_milli: int = 500
    gang_rate: float = 120.0
    gang_duration: float = 4 * 3600.0
    hours: float = 24.0
    time_scale: float = 25.0
    rack_limit: int | None = None
    level: str = "auto"
    background: str = "all"
    node_policy: str = "BestFit"

    def check(self) -> list[str]:
        """The problems, each naming its option (empty: usable)."""
        problems = []
        if self.rack_size < 1:
            problems.append(f"--rack-size must be >= 1 node, got {self.rack_size}")
        if self.block_size < 1:
            problems.append(f"--block-size must be >= 1 rack, got {self.block_size}")
        if not 0 <= self.fractional_share <= 1:
            problems.append(f"--fractional-share must be in [0, 1], got {self.fractional_share}")
        if not 10 <= self.share_milli < MILLI_PER_GPU or self.share_milli % 10:
            problems.append(f"--share-milli must be a multiple of 10 in [10, 990], got {self.share_milli}")
        if not (self.gang_rate >= 0 and math.isfinite(self.gang_rate)):
            problems.append(f"--gang-rate must be >= 0 gangs per hour, got {self.gang_rate}")
        if not (self.gang_duration > 0 and math.isfinite(self.gang_duration)):
            problems.append(f"--gang-duration must be > 0 seconds, got {self.gang_duration}")
        if not (0 < self.hours <= 10_000):
            problems.append(f"--hours must be in (0, 10000], got {self.hours}")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            problems.append(f"--time-scale must be > 0, got {self.time_scale}")
        if self.rack_limit is not None and self.rack_limit < 0:
            problems.append(f"--rack-limit must be >= 0 GPUs, got {self.rack_limit}")
        if self.level not in ("auto", *LEVELS):
            problems.append(f"--level must be auto, rack or block, got {self.level!r}")
        if self.background not in BACKGROUNDS:
            problems.append(f"--background must be one of {', '.join(BACKGROUNDS)}, got {self.background!r}")
        try:
            resolve_policy(self.node_policy)
        except ValueError as exc:
            problems.append(f"--node-policy: {exc}")
        return problems


def resolve_topology_policy(name: str) -> str:
    """The canonical name of an experiment policy (any case); ValueError listing them otherwise."""
    lookup = {p.lower(): p for p in TOPOLOGY_POLICIES}
    key = name.strip().lower()
    if key not in lookup:
        raise ValueError(f"unknown topology policy {name!r}; valid: {', '.join(TOPOLOGY_POLICIES)}")
    return lookup[key]


# Cluster -----------------------------------------------------------------------------------------------
def generate_nodes(count: int, gpus: int = 8, model: str = "A100") -> NodeTable:
    """A generated node list: `count` nodes of `gpus` GPUs, 96 CPUs and 768 GiB each."""
    if count < 1:
        raise ValueError(f"--generate must be >= 1 node, got {count}")
    return NodeTable(
        names=tuple(f"node-{i:05d}" for i in range(count)),
        cpu_milli=np.full(count, 96_000, dtype=np.int64),
        memory_mib=np.full(count, 768 * 1024, dtype=np.int64),
        gpus=np.full(count, gpus, dtype=np.int64),
        models=(model,) * count,
    )


def topology() -> Topology:
    """The experiment's tree: blocks, racks, hosts."""
    levels = [{"nodeLabel": label} for label in (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)]
    return Topology.model_validate({"name": TOPOLOGY_NAME, "levels": levels})


def rack_of(i: int, rack_size: int) -> int:
    return i // rack_size


def arrange(table: NodeTable, rack_size: int, block_size: int) -> list[Node]:
    """The nodes of `table` in racks of `rack_size` nodes and blocks of `block_size` racks (file order)."""
    out = []
    for i, node in enumerate(to_nodes(table)):
        rack = rack_of(i, rack_size)
        labels = {
            **node.labels,
            BLOCK_LABEL: f"b{rack // block_size}",
            RACK_LABEL: f"r{rack}",
            HOSTNAME_LABEL: node.name,
        }
        out.append(node.model_copy(update={"labels": FrozenDict(labels)}))
    return out


def rack_gpus(table: NodeTable, rack_size: int) -> IntArray:
    """GPUs per rack, in rack order."""
    racks = (len(table) + rack_size - 1) // rack_size
    return np.array([int(table.gpus[r * rack_size : (r + 1) * rack_size].sum()) for r in range(racks)], dtype=np.int64)


def default_rack_limit(table: NodeTable, config: TopologyConfig) -> int:
    """The largest GPU demand that asks for one rack: `rack_limit`, or the median rack's GPU count."""
    if config.rack_limit is not None:
        return config.rack_limit
    return int(np.median(rack_gpus(table, config.rack_size)))


# Gangs -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gangs:
    """The seeded gang arrivals of one run (the same for every policy of a seed)."""

    arrival: FloatArray  # [G] seconds
    duration: FloatArray  # [G] seconds
    members: IntArray  # [G]
    fractional: npt.NDArray[np.bool_]  # [G]
    level: tuple[str, ...]  # [G] node label of the required level

    def __len__(self) -> int:
        return len(self.arrival)

    def gpus(self, share_milli: int) -> FloatArray:
        """[G] GPUs each gang asks (a share member counts its share)."""
        per_member = np.where(self.fractional, share_milli / MILLI_PER_GPU, 1.0)
        return self.members * per_member


def make_gangs(config: TopologyConfig, seed: int, rack_limit: int) -> Gangs:
    """Poisson arrivals over `config.hours` (see the module docstring), from their own seeded stream."""
    rng = np.random.default_rng([seed, 28])
    horizon = config.hours * 3600.0
    times: list[float] = []
    if config.gang_rate > 0:
        t = float(rng.exponential(3600.0 / config.gang_rate))
        while t < horizon:
            times.append(t)
            t += float(rng.exponential(3600.0 / config.gang_rate))
    count = len(times)
    sizes = np.array([s for s, _ in config.gang_mix], dtype=np.int64)
    weights = np.array([w for _, w in config.gang_mix], dtype=np.float64)
    members = rng.choice(sizes, size=count, p=weights / weights.sum()).astype(np.int64)
    fractional = rng.random(count) < config.fractional_share
    duration = rng.exponential(config.gang_duration, size=count)
    gangs = Gangs(np.asarray(times), duration, members, fractional, ())
    demand = gangs.gpus(config.share_milli)
    if config.level == "auto":
        level = tuple(RACK_LABEL if g <= rack_limit else BLOCK_LABEL for g in demand.tolist())
    else:
        level = (LEVELS[config.level],) * count
    return Gangs(gangs.arrival, duration, members, fractional, level)


def gang_members(gangs: Gangs, g: int, share_milli: int, *, topology_aware: bool) -> list[Workload]:
    """The member workloads of gang `g` (``gangs/g00012-3``), with its topology request when aware."""
    members = int(gangs.members[g])
    gang: dict[str, Any] = {"name": f"g{g:05d}", "minMember": members}
    if topology_aware:
        gang["topology"] = {"name": TOPOLOGY_NAME, "required": gangs.level[g]}
    devices = gpu_requests(1, share_milli) if gangs.fractional[g] else gpu_requests(1, MILLI_PER_GPU)
    template = Workload.model_validate(
        {
            "name": f"g{g:05d}-0",
            "namespace": GANG_NAMESPACE,
            "tenant": GANG_TENANT,
            "requests": {"cpu": f"{MEMBER_CPU_MILLI}m", "memory": f"{MEMBER_MEMORY_MIB}Mi", **devices},
            "gang": gang,
        }
    )
    return [template.model_copy(update={"name": f"g{g:05d}-{m}"}) for m in range(members)]


def trace_origin(pods: PodTable) -> float:
    """Where the trace's clock starts for this experiment: its 1st percentile of creation times. The
    default trace's first 1 % of pods are stragglers spread over the 116 days before the other 99 %
    arrive (in 34 days); they are left out, so the experiment's window is busy from its start."""
    return float(np.percentile(pods.creation, 1)) if len(pods) else 0.0


def background_arrivals(pods: PodTable, config: TopologyConfig) -> FloatArray:
    """[P] each trace pod's arrival in the experiment (seconds): (creation - origin) / time_scale."""
    return (pods.creation - trace_origin(pods)) / config.time_scale


def background_pods(pods: PodTable, config: TopologyConfig) -> PodTable:
    """The trace pods that arrive (scaled, from `trace_origin`) within the gangs' window, all or only
    the GPU-share ones. Their `creation` is left as in the trace."""
    at = background_arrivals(pods, config)
    arriving = (at >= 0) & (at < config.hours * 3600.0)
    if config.background == "share":
        arriving &= (pods.num_gpu == 1) & (pods.gpu_milli < MILLI_PER_GPU)
    elif config.background == "none":
        arriving &= False
    return pods.take(np.flatnonzero(arriving))
