"""An upper bound on the GPU allocation any placement of the arrived pods can reach (an LP relaxation).

Pods are grouped into types t (cpu, memory, k GPUs of d milli, allowed models) with n_t arrivals;
nodes into types j (cpu, memory, G_j GPUs, model) with N_j nodes. Variables x_tj >= 0 count the
type-t pods placed on type-j nodes (only where one pod fits an empty node of type j and the model
is allowed). Maximize Σ k_t·d_t·x_tj subject to:

* Σ_j x_tj <= n_t (only arrived pods);
* per node type, cpu, memory and GPU milli: Σ_t a_t·x_tj <= N_j·A_j;
* per-GPU packing cuts, valid for every single GPU, hence for each node type's G_j·N_j GPUs. A
  task of k whole GPUs counts as k items of 1000 m. For each threshold α in the set of item sizes
  <= 500 (plus 500): *big* items (d > 1000 − α) leave less than α on their GPU, so no *medium* item
  (α <= d <= 1000 − α) shares it, and a GPU holds at most ⌊1000/α⌋ medium items:
  (i) 1000·#big + Σ_medium d <= 1000·G and (ii) #big + #medium/⌊1000/α⌋ <= G.

Every integer placement satisfies these, so the LP optimum bounds the best offline packing, and
therefore any online policy, from above. Example of cut (i): on 10 GPUs, 810 m tasks count as 1000
when α = 200 (their 190 m leftovers fit nothing of 200 m or more), so at most 10 of them plus no
medium item fit, not 12 (12·810 = 9720 <= 10,000 would pass the plain capacity row).

Solved with scipy's HiGHS (`scipy.optimize.linprog`); a few hundred variables and rows, well under
a second.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from finesched.sim.trace import MILLI_PER_GPU, NodeTable, PodTable, models_of


@dataclass(frozen=True)
class Bound:
    """The LP optimum in GPU milli and as percent of capacity, with the problem size."""

    milli: float
    percent: float
    variables: int
    constraints: int


#: A node type: (cpu milli, memory MiB, GPUs, model); a pod type: (cpu milli, memory MiB, GPUs, GPU
#: milli, allowed models).
NodeType = tuple[int, int, int, str]
PodType = tuple[int, int, int, int, tuple[str, ...]]


def lp_bound(nodes: NodeTable, pods: PodTable) -> Bound:
    """The LP upper bound on allocated GPU milli for placing (a subset of) `pods` on `nodes`."""
    node_types, pod_types = _node_types(nodes), _pod_types(pods)
    jtypes, ttypes = list(node_types), list(pod_types)
    variables = _variables(ttypes, jtypes)
    if not variables:
        return Bound(0.0, 0.0, 0, 0)
    rows = _Rows()
    by_type: dict[int, list[int]] = {}
    by_node: dict[int, list[int]] = {}
    for v, (t, j) in enumerate(variables):
        by_type.setdefault(t, []).append(v)
        by_node.setdefault(j, []).append(v)
    for t, vs in by_type.items():
        rows.add([(v, 1.0) for v in vs], float(pod_types[ttypes[t]]))
    sizes = sorted({d for (_, _, k, d, _) in ttypes if k and d <= MILLI_PER_GPU // 2} | {MILLI_PER_GPU // 2})
    for j, vs in by_node.items():
        ncpu, nmem, gpus, _ = jtypes[j]
        count = node_types[jtypes[j]]
        row_types = [(v, ttypes[variables[v][0]]) for v in vs]
        rows.add([(v, float(pod[0])) for v, pod in row_types], float(ncpu * count))
        rows.add([(v, float(pod[1])) for v, pod in row_types], float(nmem * count))
        gpu_total = float(gpus * count)
        rows.add([(v, float(pod[2] * pod[3])) for v, pod in row_types], MILLI_PER_GPU * gpu_total)
        for alpha in sizes:
            _packing_cuts(rows, row_types, alpha, gpu_total)
    objective = np.asarray([-float(ttypes[t][2] * ttypes[t][3]) for t, _ in variables])
    matrix = coo_matrix((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.rhs), len(variables))).tocsr()
    result = linprog(objective, A_ub=matrix, b_ub=np.asarray(rows.rhs), bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"LP bound: HiGHS did not solve the relaxation ({result.message})")
    milli = float(-result.fun)
    return Bound(milli, 100.0 * milli / nodes.gpu_capacity_milli, len(variables), len(rows.rhs))


def _node_types(nodes: NodeTable) -> Counter[NodeType]:
    """How many nodes of each type."""
    return Counter(
        zip(
            nodes.cpu_milli.tolist(),
            nodes.memory_mib.tolist(),
            nodes.gpus.tolist(),
            nodes.models,
            strict=True,
        )
    )


def _pod_types(pods: PodTable) -> Counter[PodType]:
    """How many arrived pods of each type (GPU-less pods allow every model)."""
    return Counter(
        zip(
            pods.cpu_milli.tolist(),
            pods.memory_mib.tolist(),
            pods.num_gpu.tolist(),
            pods.gpu_milli.tolist(),
            (models_of(s) if k else () for s, k in zip(pods.gpu_spec, pods.num_gpu.tolist(), strict=True)),
            strict=True,
        )
    )


def _variables(ttypes: list[PodType], jtypes: list[NodeType]) -> list[tuple[int, int]]:
    """The (pod type, node type) pairs worth a variable: one such pod fits an empty node of that type,
    on a model it allows."""
    variables: list[tuple[int, int]] = []
    for t, (cpu, mem, k, _, models) in enumerate(ttypes):
        for j, (ncpu, nmem, gpus, model) in enumerate(jtypes):
            if cpu <= ncpu and mem <= nmem and k <= gpus and (not k or not models or model in models):
                variables.append((t, j))
    return variables


class _Rows:
    """The constraint rows A_ub·x <= b_ub, gathered as a sparse matrix's coordinates."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.rhs: list[float] = []

    def add(self, entries: list[tuple[int, float]], bound: float) -> None:
        """One row Σ value·x_col <= bound (zero coefficients left out)."""
        r = len(self.rhs)
        for col, value in entries:
            if value:
                self.rows.append(r)
                self.cols.append(col)
                self.vals.append(value)
        self.rhs.append(bound)


def _packing_cuts(rows: _Rows, row_types: list[tuple[int, PodType]], alpha: int, gpu_total: float) -> None:
    """The per-GPU packing cuts (i) and (ii) of the module docstring at threshold `alpha`, for one node
    type's `gpu_total` GPUs and its variables (each with its pod type)."""
    big: list[tuple[int, float]] = []
    medium_size: list[tuple[int, float]] = []
    medium_count: list[tuple[int, float]] = []
    per_gpu = MILLI_PER_GPU // alpha
    for v, (_, _, k, d, _) in row_types:
        if not k:
            continue
        if d > MILLI_PER_GPU - alpha:
            big.append((v, float(k)))
        elif d >= alpha:
            medium_size.append((v, float(k * d)))
            medium_count.append((v, float(k) / per_gpu))
    if big or medium_size:
        rows.add([(v, MILLI_PER_GPU * c) for v, c in big] + medium_size, MILLI_PER_GPU * gpu_total)
    if medium_size:
        rows.add(big + medium_count, gpu_total)
