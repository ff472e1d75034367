"""One compiled pass for the fused path's memo patch (plugins/fused_scalar.py, `FusedScalar.patch`).

A memo patch refreshes the ~60-100 nodes that changed since the shape's last decision. In numpy
that is ~25 calls on arrays of that size (gather the free, used and 1/allocatable columns, compare
with the floor, two shares, the score passes, the key, the scatter into the entry), each costing
more in call overhead than in arithmetic. This kernel does all of it in one loop per node.

Bit for bit the numpy path: every float is computed with the same IEEE operations in the same
order (`(used + add) * inv` per share, then `FusedScalar._total_two`'s passes), numba's default
`fastmath=False` emits no contraction flags (no fused multiply-add), and float -> int64 truncates
toward zero as `astype` does. tests/test_fused_scalar.py holds the kernel equal to the numpy path.

Importing this module imports numba and compiles (or loads from numba's on-disk cache) the kernel
for its one signature: the fused path imports it lazily, on the first memo patch it can take.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types

#: Score pass codes, in `FusedScalar._scorers` order (`FusedScalar.kernel_codes`).
MOST_BALANCED, LEAST_REQUESTED, MOST_ALLOCATED = 0, 1, 2

_I64_2D = types.Array(types.int64, 2, "C")
_F64_2D = types.Array(types.float64, 2, "C")
_SIGNATURE = types.int64(
    types.Array(types.intp, 1, "C", readonly=True),  # dirty: the change log's view (repeats allowed)
    _I64_2D,  # free [R, capacity]
    _I64_2D,  # floor [R, 1] (int64 min on rows not asked for)
    _F64_2D,  # used_float [R, capacity]
    _F64_2D,  # share_add [R, 1]
    _F64_2D,  # inv_allocatable [R, capacity]
    types.intp,  # r0: first share row
    types.intp,  # r1: second share row
    types.Array(types.int64, 1, "C"),  # codes: score pass per scorer
    types.Array(types.int64, 1, "C"),  # weights per scorer
    types.float64,  # top: MAX_SCORE + _EPS
    types.float64,  # max_score
    types.float64,  # half_max: MAX_SCORE // 2
    types.float64,  # eps
    types.Array(types.bool_, 1, "C"),  # schedulable [n] (empty: no NodeUnschedulable)
    types.Array(types.bool_, 1, "C"),  # allow [len(dirty)]: other filters' mask (empty: none)
    types.Array(types.int64, 1, "C"),  # tie ranks [n] (empty: lowest-index ties)
    types.int64,  # n: node count (for the random tie-break)
    types.Array(types.bool_, 1, "C"),  # feasible [n]: the memo entry's mask, patched in place
    types.Array(types.int64, 1, "C"),  # key [n]: the memo entry's key, patched in place
)


@numba.njit(_SIGNATURE, cache=True, nogil=True)
def patch_two(  # pragma: no cover - compiled; exercised through FusedScalar.patch
    dirty, free, floor, used, add, inv, r0, r1, codes, weights, top, max_score, half_max, eps,
    schedulable, allow, ranks, n, feasible, key,
):  # fmt: skip
    """Write feasibility and key of the `dirty` nodes into `feasible`/`key`; return the change in
    the count of feasible nodes. A repeated node gets the same result again (nothing it reads
    changes here), so its second write counts 0 and the delta is exact with repeats."""
    rows = free.shape[0]
    delta = 0
    for j in range(dirty.shape[0]):
        i = dirty[j]
        ok = True
        for r in range(rows):
            if free[r, i] < floor[r, 0]:
                ok = False
        if ok and schedulable.shape[0] > 0 and not schedulable[i]:
            ok = False
        if ok and allow.shape[0] > 0 and not allow[j]:
            ok = False
        value = -1
        if ok:
            a0 = (used[r0, i] + add[r0, 0]) * inv[r0, i]
            a1 = (used[r1, i] + add[r1, 0]) * inv[r1, i]
            twice_mean = a0 + a1
            diff = a0 - a1
            square_diff = diff * diff
            total = 0
            for s in range(codes.shape[0]):
                code = codes[s]
                if code == 0:  # MOST_BALANCED
                    buf = top - square_diff * max_score
                elif code == 1:  # LEAST_REQUESTED
                    buf = top - twice_mean * half_max
                else:  # MOST_ALLOCATED
                    buf = twice_mean * half_max + eps
                total += np.int64(buf) * weights[s]
            if ranks.shape[0] > 0:
                total = total * (n + 1) + (n - ranks[i])
            value = total
        if ok != feasible[i]:
            delta += 1 if ok else -1
        feasible[i] = ok
        key[i] = value
    return delta
