"""What a topology gang fits, per node and per domain, and why a domain takes no more of it.

sched/topology.py's counting half: per member shape, one filter pass over every node and how many
copies fit on each (`Framework.run_count`), summed per domain of a level (`level_fits`, with slices
and the MostAllocated fraction BestFit breaks ties with); and, for a gang that waits, the filters'
reasons on the closest domain's own nodes (`domain_reasons`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from finesched.model.topology import Topology
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.request import ScheduleRequest
from finesched.state.topology import DomainIndex

if TYPE_CHECKING:
    from finesched.sched.profile import Profile
    from finesched.sched.queue import SchedulingQueue
    from finesched.sched.runtime import Framework
    from finesched.state.cluster import ClusterState

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass
class ShapeFit:
    """One request shape of a gang: its members (indices) and how many copies fit on each node."""

    members: list[int]
    request: ScheduleRequest | None
    cycle: CycleState | None
    skipped: set[str]
    count: IntArray
    error: FitError | None  # no node is feasible for the shape at all


@dataclass
class Level:
    """Per domain of one level (depth -1: the whole cluster as one domain) what the gang fits."""

    depth: int
    holds: BoolArray  # [D] the domain holds the gang (by count)
    members: IntArray  # [D] member-equivalents it holds (slices * size with slices)
    measure: IntArray  # [D] what BestFit compares: slices held, else members held
    allocated: npt.NDArray[np.float64]  # [D] fraction of allocatable used with the gang in it


class TopologyHost(Protocol):
    """What the placer reads of the Scheduler (sched/scheduler.py), which passes itself."""

    state: ClusterState
    framework: Framework
    queue: SchedulingQueue
    profile: Profile
    topologies: dict[str, Topology]

    def _prepare(self, workload: Workload) -> tuple[ScheduleRequest, CycleState, set[str], Hashable | None]: ...

    def _evaluate(
        self, cycle: CycleState, request: ScheduleRequest, skipped: set[str], shape: Hashable | None
    ) -> tuple[BoolArray, IntArray]: ...


# Counts ----------------------------------------------------------------------------------------------
def shape_fits(sched: TopologyHost, members: list[Workload], index: DomainIndex) -> list[ShapeFit]:
    """Per request shape: its members and per-node copy counts (one filter pass per shape)."""
    state = sched.state
    groups: dict[object, list[int]] = {}
    for i, w in enumerate(members):
        groups.setdefault(request_shape(w), []).append(i)
    fits = []
    for indices in groups.values():
        workload = members[indices[0]]
        none = np.zeros(index.n, dtype=np.int64)
        try:
            request, cycle, skipped, memo_shape = sched._prepare(workload)
        except FitError as exc:  # pre_filter refused the request everywhere
            fits.append(ShapeFit(indices, None, None, set(), none, exc))
            continue
        try:
            feasible, _ = sched._evaluate(cycle, request, skipped, memo_shape)
        except FitError as exc:  # no node passes the filters: the domains' own reasons still explain it
            fits.append(ShapeFit(indices, request, cycle, skipped, none, exc))
            continue
        count = sched.framework.run_count(cycle, request, NodeBatch(state), feasible, skipped)[: index.n]
        fits.append(ShapeFit(indices, request, cycle, skipped, count, None))
    return fits


def level_fits(
    sched: TopologyHost,
    members: list[Workload],
    fits: list[ShapeFit],
    index: DomainIndex,
    depth: int,
    slice_depth: int | None,
    size: int,
) -> Level:
    """What each domain of `depth` holds (-1: the whole cluster as one domain)."""
    m = len(members)
    need = np.array([len(f.members) for f in fits], dtype=np.int64)
    counts = np.stack([domain_sum(index, f.count, depth) for f in fits])  # [S, D]
    held = (counts * m // need[:, None]).min(axis=0)  # member-equivalents
    holds = (counts >= need[:, None]).all(axis=0)
    measure = held
    if slice_depth is not None:
        slices = m // size
        per_slice = (np.stack([index.sum(f.count, slice_depth) for f in fits]) * slices // need[:, None]).min(axis=0)
        up = np.zeros(len(held), dtype=np.int64)
        np.add.at(up, ancestors(index, slice_depth, depth), per_slice)
        holds &= up >= slices
        measure = up
        held = np.minimum(held, up * size)
    return Level(depth, holds, held, measure, allocated(sched, fits, index, depth))


def domain_sum(index: DomainIndex, per_node: IntArray, depth: int) -> IntArray:
    if depth < 0:
        return np.array([int(per_node[: index.n].sum())], dtype=np.int64)
    return index.sum(per_node, depth)


def ancestors(index: DomainIndex, level: int, depth: int) -> IntArray:
    """[domains of `level`] each one's domain at `depth` (depth -1: 0, the whole cluster)."""
    anc = np.arange(index.count(level), dtype=np.int64)
    if depth < 0:
        return np.zeros_like(anc)
    for lvl in range(level, depth, -1):
        anc = index.parents[lvl][anc]
    return anc


def allocated(sched: TopologyHost, fits: list[ShapeFit], index: DomainIndex, depth: int) -> npt.NDArray[np.float64]:
    """[D] mean over the requested resources of (used + the gang's demand) / allocatable: the
    MostAllocated placement score of Kubernetes' topology-aware PodGroup scheduling."""
    state = sched.state
    demand: dict[int, int] = {}
    for f in fits:
        if f.request is not None:
            for row, amount in f.request.share_pairs:
                demand[row] = demand.get(row, 0) + amount * len(f.members)
    domains = 1 if depth < 0 else index.count(depth)
    if not demand:
        return np.zeros(domains)
    rows = np.fromiter(demand, dtype=np.intp)
    alloc = state.allocatable[rows, : index.n]
    used = alloc - state.free[rows, : index.n]
    if depth < 0:
        a, u = alloc.sum(axis=1, keepdims=True), used.sum(axis=1, keepdims=True)
    else:
        a, u = index.sum_rows(alloc, depth), index.sum_rows(used, depth)
    want = np.array(list(demand.values()), dtype=np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(a > 0, (u + want) / np.maximum(a, 1), 0.0)
    return frac.mean(axis=0)


# Why a domain takes no more -----------------------------------------------------------------------
def domain_reasons(sched: TopologyHost, fits: list[ShapeFit], index: DomainIndex, inside: BoolArray) -> Counter[str]:
    """Why the nodes `inside` (one domain) take no (more) member: the filters' reasons there, else the
    scalar resources the domain lacks for the members it does not hold."""
    state = sched.state
    counts: Counter[str] = Counter()
    short = [f for f in fits if int(f.count[: index.n][inside[: index.n]].sum()) < len(f.members)] or fits
    for f in short:
        if f.request is None or f.cycle is None:
            if f.error is not None:
                counts.update({r: 1 for r in f.error.reasons})
            continue
        _, results = sched.framework.run_filter(f.cycle.clone(), f.request, NodeBatch(state), f.skipped)
        for plugin, result in results:
            rejected = ~result.mask & inside
            if not rejected.any():
                continue
            explanation = result.explain() if result.explain is not None else {}
            covered = np.zeros(state.n, dtype=bool)
            for reason, (mask, _code) in explanation.items():
                hit = rejected & mask
                if hit.any():
                    counts[reason] += int(hit.sum())
                    covered |= hit
            rest = int((rejected & ~covered).sum())
            if rest:
                counts[f"rejected by {plugin.NAME}"] += rest
        if not counts:  # every node takes some: the scalar resources that run out
            have = int(f.count[: index.n][inside[: index.n]].sum())
            missing = len(f.members) - have
            for row, amount in f.request.pairs:
                free = int(state.free[row, : index.n][inside[: index.n]].sum())
                if free - have * amount < missing * amount:
                    counts[f"insufficient {state.resources[row]}"] += 1
            if not counts:  # no scalar runs out: what the plugins allocate (devices) does
                owned = [r for r, a in f.request.workload.requests.items() if a > 0 and sched.framework.owns(r)]
                counts.update({f"insufficient {r}": 1 for r in owned})
    return counts


def need_of(reason: str) -> str:
    """A filter reason as what a member needs (``insufficient gpu-core`` -> ``gpu-core``)."""
    return reason.removeprefix("insufficient ").removeprefix("Insufficient ")
