"""Pipelined regions and connected components of a job graph (seed S2.2).

A pipelined region is a set of tasks that must be scheduled together: a pipelined edge streams
data, so a consumer that cannot start would stall its producer forever (the deadlock FLIP-53
describes). Hence:

1. tasks joined by pipelined edges (all-to-all or pointwise alike: at the task level a pointwise
   edge still joins producer and consumer) are one region; blocking edges do not join;
2. with `all_sources_in_same_region`, every source behaves as if one virtual source fed it
   through a pipelined edge, so all sources (and what they stream into) form one region;
3. regions that depend on each other in a cycle through blocking edges (A's region consumes B's
   result and B's region consumes A's) cannot run one after the other, so they merge into one.

Worked example: a -> b pipelined, a -> c blocking, c -> b blocking. Step 1 gives {a, b}, {c};
{c} consumes {a, b} (a -> c) and {a, b} consumes {c} (c -> b): a cycle, so one region {a, b, c}.
"""

from __future__ import annotations

import itertools
from typing import Any

from finesched.dataflow.graph import Edge, JobGraph

Subtask = tuple[str, int]


class UnionFind:
    """Disjoint sets (of task ids, or subtasks); `groups` lists them in the order of their first member."""

    def __init__(self, items: list[Any]):
        self._order = list(items)
        self._parent = {item: item for item in items}

    def find(self, item: Any) -> Any:
        root = item
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[item] != root:  # path compression
            self._parent[item], item = root, self._parent[item]
        return root

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self._parent[rb] = ra

    def groups(self) -> list[frozenset[Any]]:
        by_root: dict[Any, list[Any]] = {}
        for item in self._order:
            by_root.setdefault(self.find(item), []).append(item)
        return [frozenset(members) for members in by_root.values()]


def pipelined_regions(graph: JobGraph, all_sources_in_same_region: bool) -> list[frozenset[str]]:
    """The job's pipelined regions (rules 1-3 of the module docstring), ordered by their first task
    in manifest order."""
    sets = UnionFind(graph.task_ids)
    for edge in graph.edges:
        if edge.type == "pipelined":
            sets.union(edge.source, edge.target)
    if all_sources_in_same_region:
        sources = graph.sources
        for other in sources[1:]:
            sets.union(sources[0], other)
    regions = sets.groups()
    # Rule 3: merge the strongly connected components of the region graph (blocking edges only).
    index = {task: k for k, region in enumerate(regions) for task in region}
    successors: list[set[int]] = [set() for _ in regions]
    for edge in graph.edges:
        a, b = index[edge.source], index[edge.target]
        if a != b:
            successors[a].add(b)
    merged = UnionFind([str(k) for k in range(len(regions))])
    for component in _strongly_connected(successors):
        for k in component[1:]:
            merged.union(str(component[0]), str(k))
    out = [frozenset().union(*(regions[int(k)] for k in group)) for group in merged.groups()]
    order = {task: k for k, task in enumerate(graph.task_ids)}
    return sorted(out, key=lambda region: min(order[t] for t in region))


def _strongly_connected(successors: list[set[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components of a small graph, iteratively (no recursion limit)."""
    counter = 0
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    for root in range(len(successors)):
        if root in index:
            continue
        work = [(root, iter(sorted(successors[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(successors[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def connected_components(graph: JobGraph) -> list[frozenset[str]]:
    """Tasks joined by any edge, either direction: parts of a job that share no data at all."""
    sets = UnionFind(graph.task_ids)
    for edge in graph.edges:
        sets.union(edge.source, edge.target)
    return sets.groups()


def pointwise_links(producers: int, consumers: int) -> list[tuple[int, int]]:
    """(producer subtask, consumer subtask) pairs of a pointwise edge: i feeds i when the counts are
    equal; otherwise consecutive ranges, so each subtask has ceil(larger / smaller) partners at most
    (the channel counts `finesched.dataflow.network` uses). 4 -> 2: (0,0), (1,0), (2,1), (3,1)."""
    if producers >= consumers:
        return [(i, i * consumers // producers) for i in range(producers)]
    return [(j * producers // consumers, j) for j in range(consumers)]


def subtask_regions(graph: JobGraph, all_sources_in_same_region: bool) -> list[frozenset[Subtask]]:
    """Pipelined regions of the execution graph, whose vertices are subtasks ``(task, index)``.

    The same three rules as `pipelined_regions`, applied per subtask: an all-to-all edge joins every
    producer subtask with every consumer subtask, a pointwise edge only the pairs it links, so
    a (2) -> b (2) pointwise gives two regions {a0, b0} and {a1, b1} where the task level has one.
    It says how independently the job can be restarted or staged; slots are asked per task-level
    group. Cost: linear in subtasks and pointwise links (an all-to-all edge is joined as one chain).
    """
    subtasks = [(t.id, i) for t in graph.tasks for i in range(t.parallelism)]
    sets = UnionFind(subtasks)
    for edge in graph.edges:
        if edge.type != "pipelined":
            continue
        for a, b in _pointwise(edge, graph) if edge.pattern == "pointwise" else _chain(edge, graph):
            sets.union(a, b)
    if all_sources_in_same_region:
        sources = [(t, i) for t in graph.sources for i in range(graph.task(t).parallelism)]
        for other in sources[1:]:
            sets.union(sources[0], other)
    regions = sets.groups()
    index = {sub: k for k, region in enumerate(regions) for sub in region}
    successors: list[set[int]] = [set() for _ in regions]
    for edge in graph.edges:
        if edge.pattern == "pointwise":
            pairs = {(index[a], index[b]) for a, b in _pointwise(edge, graph)}
        else:  # every producer region feeds every consumer region
            producers = {index[(edge.source, i)] for i in range(graph.task(edge.source).parallelism)}
            consumers = {index[(edge.target, j)] for j in range(graph.task(edge.target).parallelism)}
            pairs = {(a, b) for a in producers for b in consumers}
        for a, b in pairs:
            if a != b:
                successors[a].add(b)
    merged = UnionFind(list(range(len(regions))))
    for component in _strongly_connected(successors):
        for k in component[1:]:
            merged.union(component[0], k)
    return [frozenset().union(*(regions[k] for k in group)) for group in merged.groups()]


def _pointwise(edge: Edge, graph: JobGraph) -> list[tuple[Subtask, Subtask]]:
    pairs = pointwise_links(graph.task(edge.source).parallelism, graph.task(edge.target).parallelism)
    return [((edge.source, i), (edge.target, j)) for i, j in pairs]


def _chain(edge: Edge, graph: JobGraph) -> list[tuple[Subtask, Subtask]]:
    """Pairs that join all subtasks of both ends (what p x q all-to-all links join, in p + q - 1 unions)."""
    ends = [(edge.source, i) for i in range(graph.task(edge.source).parallelism)]
    ends += [(edge.target, j) for j in range(graph.task(edge.target).parallelism)]
    return list(itertools.pairwise(ends))
