"""The domains of a Topology over the node arrays: which domain of each level every node is in.

A domain of level L is the tuple of a node's label values for levels 0..L (rack `r1` of block
`b1` is not rack `r1` of block `b2`). `DomainIndex.ids[L]` is an int array over node slots: the
domain number of each node at level L, or -1 when the node lacks the label of L or of a level
above it (outside every domain of L and of the levels below). Domains are numbered in the order of
their label values, so ties between equal domains break the same way on every run.

Per-domain sums (free capacity, how many members of a gang each domain holds) are one
`np.add.at` per level: `DomainIndex.sum(values, level)`. An index is built from the state's label
columns and is valid while `ClusterState.nodes_version` is unchanged (`domain_index` caches it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from finesched.model.topology import Topology
from finesched.state.cluster import ClusterState
from finesched.state.devices import device_types

IntArray = npt.NDArray[np.int64]
OUTSIDE = -1


@dataclass(frozen=True)
class DomainIndex:
    """The domains of one topology over the first `n` node slots (see the module docstring)."""

    topology: Topology
    n: int
    #: Per level: [n] domain number of each node (-1: outside every domain of the level).
    ids: tuple[IntArray, ...]
    #: Per level: each domain's label values, top level down to it (its identity).
    values: tuple[tuple[tuple[str, ...], ...], ...]
    #: Per level: each domain's parent domain number at the level above (-1 at the top level).
    parents: tuple[IntArray, ...]

    def count(self, level: int) -> int:
        """How many domains level `level` has."""
        return len(self.values[level])

    def sum(self, per_node: npt.NDArray[np.int64], level: int) -> IntArray:
        """[domains of `level`] the sum of `per_node` ([n]) over each domain's nodes."""
        ids = self.ids[level]
        inside = ids >= 0
        summed = np.zeros(self.count(level), dtype=np.int64)
        np.add.at(summed, ids[inside], per_node[: self.n][inside])  # exact int64 (bincount sums floats)
        return summed

    def sum_rows(self, per_node: npt.NDArray[np.int64], level: int) -> IntArray:
        """[R, domains of `level`] the row-wise sums of an [R, n] array (allocatable, free) per domain."""
        ids = self.ids[level]
        inside = ids >= 0
        summed = np.zeros((per_node.shape[0], self.count(level)), dtype=np.int64)
        for r in range(per_node.shape[0]):
            np.add.at(summed[r], ids[inside], per_node[r, : self.n][inside])
        return summed

    def nodes_of(self, level: int, domain: int) -> npt.NDArray[np.bool_]:
        """[n] True on the nodes of `domain` of level `level`."""
        return self.ids[level] == domain

    def name(self, level: int, domain: int) -> str:
        """A domain's display name: its label values joined by '/' (``b1/r3``)."""
        return "/".join(self.values[level][domain])

    def find(self, level: int, name: str) -> int | None:
        """The number of the domain of `level` named `name` (as `name` writes it), None if none is."""
        for domain, values in enumerate(self.values[level]):
            if "/".join(values) == name:
                return domain
        return None


def build_index(state: ClusterState, topology: Topology) -> DomainIndex:
    """The domains of `topology` over the state's nodes, from the label columns (vectorized)."""
    n = state.n
    ids: list[IntArray] = []
    values: list[tuple[tuple[str, ...], ...]] = []
    parents: list[IntArray] = []
    above = np.zeros(n, dtype=np.int64)  # one root domain (number 0) holding every node
    above_values: list[tuple[str, ...]] = [()]
    for label in topology.labels:
        codes = state.labels.column(label, n).astype(np.int64)
        names = state.labels.values_of(label)
        inside = (above >= 0) & (codes >= 0)
        # A domain is (parent domain, own label value); numbered by (parent's values, own value).
        stride = max(len(names), 1)
        present, inverse = np.unique(above[inside] * stride + codes[inside], return_inverse=True)
        pairs = [(int(k) // stride, int(k) % stride) for k in present.tolist()]
        order = sorted(range(len(pairs)), key=lambda i: (above_values[pairs[i][0]], names[pairs[i][1]]))
        number = np.empty(len(pairs), dtype=np.int64)
        number[order] = np.arange(len(pairs))
        pairs = [pairs[i] for i in order]
        level_ids = np.full(n, OUTSIDE, dtype=np.int64)
        level_ids[inside] = number[inverse]
        level_values = tuple((*above_values[p], names[c]) for p, c in pairs)
        ids.append(level_ids)
        values.append(level_values)
        top = len(ids) == 1  # the root above the top level is no domain
        parents.append(np.full(len(pairs), OUTSIDE) if top else np.array([p for p, _ in pairs], dtype=np.int64))
        above, above_values = level_ids, list(level_values)
    return DomainIndex(topology, n, tuple(ids), tuple(values), tuple(parents))


class DomainIndexCache:
    """`build_index` results per topology, rebuilt when the state's node set or labels change. One
    per cluster state: the Scheduler's (`TopologyPlacer.domains`), which every view of that state
    reads too, so an index is built once however many ask."""

    def __init__(self) -> None:
        self._cached: dict[Topology, tuple[int, int, DomainIndex]] = {}

    def keep(self, topologies: Iterable[Topology]) -> None:
        """Forget the indexes of every topology but `topologies` (replaced ones do not pile up)."""
        wanted = set(topologies)
        self._cached = {t: entry for t, entry in self._cached.items() if t in wanted}

    def index(self, state: ClusterState, topology: Topology) -> DomainIndex:
        entry = self._cached.get(topology)
        if entry is not None and entry[0] == state.nodes_version and entry[1] == state.n:
            return entry[2]
        built = build_index(state, topology)
        self._cached[topology] = (state.nodes_version, state.n, built)
        return built


@dataclass(frozen=True)
class DomainCapacity:
    """One domain's size and capacity, for views (`describe topology`, the console's node map)."""

    level: str
    name: str
    nodes: int
    allocatable: dict[str, int]
    free: dict[str, int]


def domain_capacities(state: ClusterState, index: DomainIndex) -> list[DomainCapacity]:
    """Every domain of every level of `index`, coarse levels first, with its node count and its
    allocatable and free amount of each resource the cluster has (summed over its nodes)."""
    out: list[DomainCapacity] = []
    names, allocatable, free = _capacity_rows(state, index.n)
    for depth, label in enumerate(index.topology.labels):
        nodes = index.sum(np.ones(index.n, dtype=np.int64), depth)
        alloc, avail = index.sum_rows(allocatable, depth), index.sum_rows(free, depth)
        for domain in range(index.count(depth)):
            out.append(
                DomainCapacity(
                    label,
                    index.name(depth, domain),
                    int(nodes[domain]),
                    {r: int(alloc[i, domain]) for i, r in enumerate(names) if alloc[i, domain]},
                    {r: int(avail[i, domain]) for i, r in enumerate(names) if alloc[i, domain]},
                )
            )
    return out


def _capacity_rows(state: ClusterState, n: int) -> tuple[list[str], IntArray, IntArray]:
    """Resource names and [R, n] allocatable and free rows: the scalar resources, then each device
    dimension (gpu-core, gpu-memory, ...) summed over each node's healthy devices, which the device
    accounts hold apart from the scalar columns."""
    names = list(state.resources)
    allocatable, free = [state.allocatable[:, :n]], [state.free[:, :n]]
    for acc in device_types(state).values():
        for k, dim in enumerate(acc.dims):
            if dim in names:
                continue
            names.append(dim)
            allocatable.append(acc.htotal[k : k + 1, :n])
            free.append(acc.hfree[k : k + 1, :n])
    return names, np.concatenate(allocatable), np.concatenate(free)
