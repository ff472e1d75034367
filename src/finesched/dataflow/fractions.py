"""Managed-memory fractions per operator, and the absolute quotas they become (seed S2.4).

An operator never gets an absolute amount of managed memory at compile time: it gets a fraction
of its slot's managed memory, on-heap and off-heap separately, so jobs with known and unknown
resources use one mechanism. Within one slot sharing group (only operators that may run at the
same time share a slot):

* known specs:   fraction = operator's managed memory / the group's managed memory (0 when the
                 group has none in that pool);
* unknown specs: fraction = 1 / (operators of the group using that pool), for operators that use
                 it, else 0; with weighted fractions (Flink's later behaviour) weight / Σ weights.

Each fraction is rounded *down* to the largest float not above the exact ratio, and a group's
fractions are checked to sum to <= 1 (nudged down by one float step while they do not), so the
quotas of a slot never exceed it. At deploy a fraction becomes `floor(fraction x pool bytes)`.

Worked example (the seed's): one group, operators with managed off-heap 100, 300 and 700 MiB.
The group has 1100 MiB, so the fractions are 100/1100, 300/1100, 700/1100, each rounded down
(0.0909090909090909, 0.2727272727272727, 0.6363636363636364 or the float just below); a slot of
1100 MiB then gives each operator floor(fraction x 1100 MiB): 100 MiB, 300 MiB and 700 MiB less
at most a byte each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from finesched.dataflow.graph import Operator


def round_down(exact: Fraction) -> float:
    """The largest float not above `exact` (0 <= exact <= 1)."""
    value = float(exact)
    if Fraction(value) > exact:
        value = math.nextafter(value, 0.0)
    return value


def _pool_fractions(amounts: list[int] | None, uses: list[bool], weights: list[int]) -> list[float]:
    """One pool's fractions for the operators of one group (known amounts, or users and weights)."""
    if amounts is not None:
        shares = amounts
    else:
        shares = [w if use else 0 for use, w in zip(uses, weights, strict=True)]
    total = sum(shares)
    if total == 0:
        return [0.0] * len(shares)
    fractions = [round_down(Fraction(share, total)) for share in shares]
    largest = max(range(len(fractions)), key=fractions.__getitem__)
    while (total_float := max(sum(fractions), math.fsum(fractions))) > 1.0:  # float addition may round a sum up
        # take the excess (exact: total_float is within a few ulps of 1), at least one float step, from the largest
        excess = total_float - 1.0
        fractions[largest] = max(0.0, math.nextafter(fractions[largest] - excess, 0.0))
    return fractions


def group_fractions(ops: Iterable[Operator], weighted: bool) -> dict[str, tuple[float, float]]:
    """Fractions (on-heap, off-heap) of every operator of one slot sharing group.

    All operators of a job either have specs or none has (the compiler checked S2.1 before).
    """
    ops = list(ops)
    known = bool(ops) and all(op.spec is not None for op in ops)
    weights = [op.weight if weighted else 1 for op in ops]
    on_amounts = [op.spec.managed_on_heap for op in ops if op.spec is not None] if known else None
    off_amounts = [op.spec.managed_off_heap for op in ops if op.spec is not None] if known else None
    on = _pool_fractions(on_amounts, [op.uses_on_heap for op in ops], weights)
    off = _pool_fractions(off_amounts, [op.uses_off_heap for op in ops], weights)
    return {op.id: (a, b) for op, a, b in zip(ops, on, off, strict=True)}


def pool_quotas(fractions: dict[str, float], pool_bytes: int) -> dict[str, int]:
    """Operator -> `floor(fraction x pool_bytes)` for the operators of one group sharing one pool.

    The product is the plain float one (what anyone evaluating the formula gets); since that may
    round up across a whole byte, the largest quotas give a byte back while the sum exceeds the pool.
    """
    out = {op: math.floor(f * pool_bytes) for op, f in fractions.items()}
    while sum(out.values()) > pool_bytes:
        largest = max(out, key=out.__getitem__)
        out[largest] -= 1
    return out


def split_pool(total: int, on_weight: int, off_weight: int) -> tuple[int, int]:
    """`total` managed bytes split into (on-heap, off-heap) in proportion to the weights; all of it
    off-heap when both are 0."""
    if on_weight + off_weight == 0:
        return 0, total
    on = total * on_weight // (on_weight + off_weight)
    return on, total - on
