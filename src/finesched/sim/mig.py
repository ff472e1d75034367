"""``sim fill --mig SHARE``: the fill protocol (experiment.py) on a cluster where a share of the trace's
GPU nodes are MIG nodes, comparing software sharing, static MIG and dynamic MIG on the same pods.

* **Nodes.** With a seeded draw, ``round(SHARE x GPU nodes)`` of the trace's GPU nodes become MIG
  nodes of one product (``--mig-product``, default A100-80GB; the trace's own models are not
  MIG-capable, and the requests are fractions, so only the product's table matters). ``share``
  keeps every node software-shared (the baseline); ``static`` gives every card of a MIG node
  mig-parted's "all-balanced" layout (MIG.md §1.2: 2 x 1g + 1 x 2g + 1 x 3g on an 80 GB part;
  the same shape on the other 8-slice products, 2g + 2 x 1g on an A30); ``dynamic`` leaves the cards
  empty and lets the scheduler choose each placement.
* **Pods.** The same arrivals in every mode (experiment.inflate, same seed). A share pod of d milli
  asks, in the MIG modes, for the smallest profile whose compute and memory fractions both reach
  d/1000 (``C/compute_slices >= d`` and ``M/memory_slices >= d``) and falls back to its GPU share
  when no MIG node takes it; a pod of k whole GPUs asks for k whole GPUs first and falls back to
  k x the full-card profile (7g) -- the way a DRA claim lists alternatives (``firstAvailable``).
* **Reported**, after the last arrival and at 100 % arrived demand: GPU allocation (placed demand /
  capacity, %, as the fill protocol), GPU held (what placements take: shares as asked, a MIG
  instance its memory slices / the axis, %), fragmentation (FGD-PROTOCOL.md §4: software-shared
  GPUs by the FGD measure against the trace's target workload; a MIG card's free slices count,
  weighted by how often each profile is asked, for every profile that no longer fits there), the
  pods that failed, and those placed on MIG nodes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from finesched.model.mig import PRODUCTS, MIGGeometry, mig_resource
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.fragmentation import FragmentationIndex
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.sim import metrics
from finesched.sim.experiment import cluster_nodes, inflate
from finesched.sim.policies import policy_profile, resolve_policy, sim_registry
from finesched.sim.trace import MILLI_PER_GPU, NodeTable, PodTable, WorkloadFactory
from finesched.state.cluster import ClusterState
from finesched.state.mig_slices import MIGSlices, attach_mig_slices

MODES = ("share", "static", "dynamic")
_GPU_REQUESTS = frozenset({"gpu-core", "gpu-memory-ratio", "nvidia.com/gpu"})
DEFAULT_PRODUCT = "A100-80GB"


def balanced_layout(geometry: MIGGeometry) -> list[dict[str, Any]]:
    """mig-parted's "all-balanced" shape on one card: the largest 3g-class profile at the top of the
    axis, the 2g below it, the smallest 1g profiles in the slices left (A30: 2g at 0, two 1g)."""
    by_size = [geometry.profiles[k] for k in geometry.by_size if not geometry.profiles[k].media]
    if geometry.memory_slices == 4:
        two = next(p for p in by_size if p.memory == 2)
        one = next(p for p in reversed(by_size) if p.memory == 1)
        return [{"profile": two.name, "start": 0}, {"profile": one.name, "start": 2}, {"profile": one.name, "start": 3}]
    three = next(p for p in by_size if p.name.startswith("3g."))
    two = next(p for p in by_size if p.name.startswith("2g."))
    one = next(p for p in reversed(by_size) if p.memory == 1)
    return [
        {"profile": two.name, "start": 0},
        {"profile": one.name, "start": 2},
        {"profile": one.name, "start": 3},
        {"profile": three.name, "start": 4},
    ]


def mig_nodes(table: NodeTable, share: float, product: str, mode: str, seed: int) -> tuple[list[Node], set[str]]:
    """The cluster of `mode`, and the names of the nodes that are MIG nodes in the MIG modes."""
    base = cluster_nodes(table)
    gpu_nodes = [i for i, n in enumerate(base) if n.devices]
    rng = np.random.default_rng([seed, 21])
    chosen = set(rng.permutation(gpu_nodes)[: round(share * len(gpu_nodes))].tolist())
    names = {base[i].name for i in chosen}
    if mode == "share":
        return base, names
    geometry = PRODUCTS[product]
    instances = balanced_layout(geometry) if mode == "static" else []
    out = []
    for i, node in enumerate(base):
        if i in chosen:
            mig = {"product": product, "mode": mode, "instances": instances}
            devices = [{"type": "gpu", "minor": d.minor, "mig": mig} for d in node.devices]
            node = Node.model_validate({**node.model_dump(by_alias=True), "devices": devices})
        out.append(node)
    return out, names


def smallest_profile(geometry: MIGGeometry, milli: int) -> str:
    """The smallest profile (memory, then compute) whose compute and memory fractions reach milli/1000."""
    fits = [
        p
        for p in geometry.profiles
        if not p.media
        and p.compute * MILLI_PER_GPU >= milli * geometry.compute_slices
        and p.memory * MILLI_PER_GPU >= milli * geometry.memory_slices
    ]
    return min(fits, key=lambda p: (p.memory, p.compute)).name


def full_card(geometry: MIGGeometry) -> str:
    return geometry.profiles[geometry.by_size[0]].name


@dataclass
class MIGFill:
    mode: str
    policy: str
    seed: int
    alloc_100: float
    alloc_end: float
    held_end: float
    frag_end: float
    failed: int
    on_mig: int
    pods: int
    wall_s: float

    def record(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def run_mig_fill(
    nodes: NodeTable, pods: PodTable, policy: str, seed: int, *, share: float, product: str = DEFAULT_PRODUCT,
    mode: str = "dynamic", inflation: float = 1.3,
) -> MIGFill:  # fmt: skip
    """One mode's fill run (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    started = time.perf_counter()
    policy = resolve_policy(policy)
    geometry = PRODUCTS[product]
    capacity = nodes.gpu_capacity_milli
    target = metrics.target_workload(pods)
    arrivals = inflate(pods, inflation, capacity, np.random.default_rng(seed))
    cluster, mig_names = mig_nodes(nodes, share, product, mode, seed)
    state = ClusterState.from_nodes(cluster)
    scheduler = Scheduler(state, policy_profile(policy, seed, target.to_specs()), registry=sim_registry())
    index = FragmentationIndex.shared(state, target)
    slices = attach_mig_slices(state)
    factory, alt = WorkloadFactory(), _Alternatives(geometry)
    request = arrivals.gpu_request_milli.tolist()
    weights = _profile_weights(arrivals, geometry)
    used = held = failed = on_mig = 0
    arrived_total, alloc_100 = 0, float("nan")
    for i in range(len(arrivals)):
        arrived_total += request[i]
        workload = factory.make(arrivals, i)
        forms = (
            alt.forms(workload, int(arrivals.num_gpu[i]), int(arrivals.gpu_milli[i]))
            if mode != "share"
            else [(workload, -1)]
        )
        for form, milli_held in forms:
            try:
                binding = scheduler.schedule_one(form)
            except FitError:
                continue
            used += request[i]
            held += milli_held if milli_held >= 0 else request[i]
            on_mig += binding.node in mig_names and mode != "share"
            break
        else:
            failed += 1
        if np.isnan(alloc_100) and arrived_total >= capacity:
            alloc_100 = 100.0 * used / capacity
    share_frag, _idle = index.totals()
    frag = share_frag + _mig_fragmentation(slices, state.n, weights)
    return MIGFill(
        mode, policy, seed, alloc_100, 100.0 * used / capacity, 100.0 * held / capacity, 100.0 * frag / capacity,
        failed, on_mig, len(arrivals), time.perf_counter() - started,
    )  # fmt: skip


class _Alternatives:
    """A trace pod's forms in order of preference, each with the GPU milli it holds (-1: as asked)."""

    def __init__(self, geometry: MIGGeometry):
        self.geometry = geometry
        self._cache: dict[tuple[Any, ...], list[tuple[Workload, int]]] = {}

    def forms(self, workload: Workload, k: int, milli: int) -> list[tuple[Workload, int]]:
        if k == 0:
            return [(workload, -1)]
        key = (workload.requests, workload.node_affinity, k, milli)
        found = self._cache.get(key)
        if found is None:
            g = self.geometry
            profile = smallest_profile(g, milli) if milli < MILLI_PER_GPU else full_card(g)
            p = g.profiles[g.profile_index(profile)]  # type: ignore[index]
            per = p.memory * MILLI_PER_GPU // g.memory_slices
            data = workload.model_dump(by_alias=True)
            requests = {n: v for n, v in data["requests"].items() if n not in _GPU_REQUESTS}
            mig = Workload.model_validate({**data, "requests": {**requests, mig_resource(profile): k}})
            found = [(mig, k * per), (workload, -1)] if milli < MILLI_PER_GPU else [(workload, -1), (mig, k * per)]
            self._cache[key] = found
        return [(form.model_copy(update={"name": workload.name}), held) for form, held in found]


def _profile_weights(arrivals: PodTable, geometry: MIGGeometry) -> dict[str, float]:
    """How often each profile is asked among the arrivals' GPU pods (the fragmentation's target)."""
    counts: dict[str, int] = {}
    for k, d in zip(arrivals.num_gpu.tolist(), arrivals.gpu_milli.tolist(), strict=True):
        if k:
            name = smallest_profile(geometry, d) if d < MILLI_PER_GPU else full_card(geometry)
            counts[name] = counts.get(name, 0) + 1
    total = sum(counts.values()) or 1
    return {name: n / total for name, n in counts.items()}


def _mig_fragmentation(slices: MIGSlices, n: int, weights: dict[str, float]) -> float:
    """Σ over MIG cards and asked profiles of weight x the card's free slices (milli of a GPU) where
    that profile no longer fits: FGD's "idle GPU a typical task cannot use" on a MIG card."""
    frag = 0.0
    for i in range(n):
        for card in slices.cards[i]:
            free = card.free_slices() * MILLI_PER_GPU / card.geometry.memory_slices
            if not free:
                continue
            for name, w in weights.items():
                k = card.geometry.profile_index(name)
                if k is not None and card.capacity(k) == 0:
                    frag += w * free
    return frag


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean over seeds per mode."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        rows = [r for r in records if r["mode"] == mode]
        if rows:
            keys = ("alloc_100", "alloc_end", "held_end", "frag_end", "failed", "on_mig", "wall_s")
            out[mode] = {k: float(np.mean([r[k] for r in rows])) for k in keys} | {"seeds": len(rows)}
    return out
