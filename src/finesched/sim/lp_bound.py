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


def lp_bound(nodes: NodeTable, pods: PodTable) -> Bound:
    """The LP upper bound on allocated GPU milli for placing (a subset of) `pods` on `nodes`."""
    node_types = Counter(
        zip(
            nodes.cpu_milli.tolist(),
            nodes.memory_mib.tolist(),
            nodes.gpus.tolist(),
            nodes.models,
            strict=True,
        )
    )
    pod_types = Counter(
        zip(
            pods.cpu_milli.tolist(),
            pods.memory_mib.tolist(),
            pods.num_gpu.tolist(),
            pods.gpu_milli.tolist(),
            (models_of(s) if k else () for s, k in zip(pods.gpu_spec, pods.num_gpu.tolist(), strict=True)),
            strict=True,
        )
    )
    jtypes, ttypes = list(node_types), list(pod_types)
    variables: list[tuple[int, int]] = []
    for t, (cpu, mem, k, _, models) in enumerate(ttypes):
        for j, (ncpu, nmem, gpus, model) in enumerate(jtypes):
            if cpu <= ncpu and mem <= nmem and k <= gpus and (not k or not models or model in models):
                variables.append((t, j))
    if not variables:
        return Bound(0.0, 0.0, 0, 0)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []

    def row(entries: list[tuple[int, float]], bound: float) -> None:
        r = len(rhs)
        for col, value in entries:
            if value:
                rows.append(r)
                cols.append(col)
                vals.append(value)
        rhs.append(bound)

    by_type: dict[int, list[int]] = {}
    by_node: dict[int, list[int]] = {}
    for v, (t, j) in enumerate(variables):
        by_type.setdefault(t, []).append(v)
        by_node.setdefault(j, []).append(v)
    for t, vs in by_type.items():
        row([(v, 1.0) for v in vs], float(pod_types[ttypes[t]]))
    sizes = sorted({d for (_, _, k, d, _) in ttypes if k and d <= MILLI_PER_GPU // 2} | {MILLI_PER_GPU // 2})
    for j, vs in by_node.items():
        ncpu, nmem, gpus, _ = jtypes[j]
        count = node_types[jtypes[j]]
        row([(v, float(ttypes[variables[v][0]][0])) for v in vs], float(ncpu * count))
        row([(v, float(ttypes[variables[v][0]][1])) for v in vs], float(nmem * count))
        gpu_total = float(gpus * count)
        row(
            [(v, float(ttypes[variables[v][0]][2] * ttypes[variables[v][0]][3])) for v in vs], MILLI_PER_GPU * gpu_total
        )
        for alpha in sizes:
            big: list[tuple[int, float]] = []
            medium_size: list[tuple[int, float]] = []
            medium_count: list[tuple[int, float]] = []
            per_gpu = MILLI_PER_GPU // alpha
            for v in vs:
                _, _, k, d, _ = ttypes[variables[v][0]]
                if not k:
                    continue
                if d > MILLI_PER_GPU - alpha:
                    big.append((v, float(k)))
                elif d >= alpha:
                    medium_size.append((v, float(k * d)))
                    medium_count.append((v, float(k) / per_gpu))
            if big or medium_size:
                row([(v, MILLI_PER_GPU * c) for v, c in big] + medium_size, MILLI_PER_GPU * gpu_total)
            if medium_size:
                row(big + medium_count, gpu_total)
    objective = np.asarray([-float(ttypes[t][2] * ttypes[t][3]) for t, _ in variables])
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(rhs), len(variables))).tocsr()
    result = linprog(objective, A_ub=matrix, b_ub=np.asarray(rhs), bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"LP bound: HiGHS did not solve the relaxation ({result.message})")
    milli = float(-result.fun)
    return Bound(milli, 100.0 * milli / nodes.gpu_capacity_milli, len(variables), len(rhs))
