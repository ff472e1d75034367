"""How many copies of a device request fit on each node (DeviceShare's `Count`), vectorized.

A gang's members of one shape are placed one after another; a topology-aware gang asks, per
domain, how many of them the nodes hold (sched/topology.py). This module answers per node with the
same definitions the filter and the allocator use, so the count is the real fit, not a scalar
estimate:

* **Per device** (`device_copies`): one instance takes exactly what the FitRule asks of that
  device (`request.py`), plus the per-card fill of the other GPU memory unit (a ratio share takes
  ``ratio · total // 100`` bytes; a bytes share ``bytes · 100 // total`` of the ratio). The FitRule
  checks ``free >= take`` per dimension, so a device holds ``min_k free[k] // take[k]`` instances
  (0 when unhealthy or the rule cannot hold there).
* **Per type** (`copies_over_devices`): an instance asks `count` distinct devices. With per-device
  capacities k_i, t copies fit iff ``sum_i min(k_i, t) >= count · t`` (each copy takes at most one
  instance per device; the condition is also sufficient, by filling devices round-robin). The
  function of t is concave and 0 at 0, so the largest t is found by bisection over all nodes at
  once. For count 1 it is ``sum_i k_i``; for whole devices ``fully free // count``.
* **MIG** (`mig_copies`): one profile: the node's cards' summed capacity (`MIGSlices.fit`, exact
  for instances of one size) // instances asked. Several profiles share slices: the least over
  profiles, an upper bound.
* **Partition tables** (`partition_copies`): where a table binds (Honor, or a gpu-partition-spec),
  the copies are counted by taking partitions one after another with `PartitionRule.pick` (the
  allocator's own choice), once per distinct (table, free devices) pair of the batch.

Exact: scalar shares on one device, whole devices (with or without a partition table), MIG of
one profile. Upper bounds (never below what placing copies one by one achieves): shares spread
over several devices (the allocator's card strategy, e.g. MostAllocated, may strand capacity the
round-robin bound counts), joint allocation and device hints (counted without their scope or
selector), a required NUMA affinity (another plugin's), several MIG profiles at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.resources import GPU
from finesched.plugins.deviceshare.mig import MIGRequest
from finesched.plugins.deviceshare.partitions import PartitionRule, combined, partition_request, rule_for
from finesched.plugins.deviceshare.request import DeviceRequest, FitRule, TypeRequest, fit_mask
from finesched.sched.framework import NO_LIMIT
from finesched.state.devices import DeviceAccounts, node_rows
from finesched.state.gpu_partitions import PartitionTables
from finesched.state.mig_slices import MIGSlices

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _per_take(free: Int64Array, take: Int64Array | int) -> Int64Array:
    """free // take where take > 0; NO_LIMIT where take <= 0 (nothing is taken of that dimension)."""
    take_arr = np.asarray(take, dtype=np.int64)
    out = np.maximum(free, 0) // np.maximum(take_arr, 1)
    return np.where(take_arr > 0, out, NO_LIMIT)


def device_copies(rule: FitRule, free: Int64Array, total: Int64Array, healthy: BoolArray) -> Int64Array:
    """[..., D] instances of one request each device can still take, one after another.

    free/total are [K, ..., D] (a type's dimensions first), healthy [..., D], as for `fit_mask`.
    """
    if rule.missing:
        return np.zeros(healthy.shape, dtype=np.int64)
    out = np.where(fit_mask(rule, free, total, healthy), NO_LIMIT, 0).astype(np.int64)
    for k, amount in rule.thresholds:
        np.minimum(out, _per_take(free[k], amount), out=out)
    if rule.ratio_bytes is not None:
        ratio, m = rule.ratio_bytes
        np.minimum(out, _per_take(free[m], total[m] * ratio // 100), out=out)
    if rule.bytes_ratio is not None:
        nbytes, r, m = rule.bytes_ratio
        take = np.where(total[m] > 0, (nbytes * 100) // np.maximum(total[m], 1), 0)
        np.minimum(out, _per_take(free[r], take), out=out)
    return out


def copies_over_devices(per_device: Int64Array, count: int) -> Int64Array:
    """[rows] largest t with ``sum_i min(k_i, t) >= count · t`` over a [rows, D] capacity array."""
    k = np.minimum(per_device, NO_LIMIT)
    if count <= 1:
        return np.minimum(k.sum(axis=1), NO_LIMIT)
    lo = np.zeros(k.shape[0], dtype=np.int64)  # holds: f(lo) >= 0
    hi = np.minimum(k.sum(axis=1) // count, NO_LIMIT)  # an upper bound on t
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi + 1) // 2
        ok = np.minimum(k, mid[:, None]).sum(axis=1) >= count * mid
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid - 1, hi)


def type_copies(accounts: DeviceAccounts, tr: TypeRequest, rule: FitRule | None, rows: Any, size: int) -> Int64Array:
    """[size] copies of one type's request per node of `rows` (a slice of all nodes, or indices).

    Over all nodes the answer is kept in the accounts' per-node cache (`DeviceAccounts.cached`,
    refreshed where devices changed), as the filter's fit counts are.
    """
    acc = accounts.types.get(tr.type)
    if rule is None or acc is None:
        return np.zeros(size, dtype=np.int64)
    # ApplyForAll takes every matching device, so the count asked is only a lower bound (1):
    # counted as one device per copy, an upper bound.
    count = 1 if tr.hint is not None and tr.hint.apply_all else tr.count

    def compute(part: Any) -> tuple[np.ndarray, ...]:
        return (copies_over_devices(device_copies(rule, *node_rows(acc, part)), count),)

    if isinstance(rows, slice):
        return accounts.cached(("count", tr.type, rule, count), compute, size)[0]
    return compute(rows)[0]


def mig_copies(slices: MIGSlices, request: MIGRequest, n: int, index: npt.NDArray[np.intp] | None) -> Int64Array:
    """[batch] copies of a MIG request: least over profiles of the cards' capacity // instances."""
    rows: Any = slice(0, n) if index is None else index
    size = n if index is None else len(index)
    out = np.full(size, NO_LIMIT, dtype=np.int64)
    for profile, count in request.wants:
        col = slices.profile_column(profile)
        if col is None:
            return np.zeros(size, dtype=np.int64)
        np.minimum(out, slices.fit[rows, col] // count, out=out)
    return out


def partition_copies(
    accounts: DeviceAccounts,
    tables: PartitionTables,
    dreq: DeviceRequest,
    rule: FitRule,
    node_ids: npt.NDArray[np.intp],
    rows: Any,
) -> Int64Array | None:
    """[batch] copies where a partition table binds (NO_LIMIT elsewhere), or None when none binds.

    Copies take partitions one after another with `PartitionRule.pick`, once per distinct
    (node rule, free devices) among the batch's binding nodes.
    """
    tr = partition_request(dreq)
    acc = accounts.types.get(GPU)
    if tr is None or acc is None:
        return None
    spec = dreq.partition
    honor = tables.honor[node_ids] | (spec is not None)
    if not honor.any():
        return None
    out = np.full(len(node_ids), NO_LIMIT, dtype=np.int64)
    if combined(dreq):
        out[honor] = 0
        return out
    fits = fit_mask(rule, *node_rows(acc, rows))
    bits = (fits.astype(np.int64) << np.arange(fits.shape[1], dtype=np.int64)).sum(axis=1)
    # A node's rule reads its table id and Honor flag: one simulation per distinct (rule, free set).
    where = np.flatnonzero(honor)
    keys = np.stack([tables.table_id[node_ids[where]], tables.honor[node_ids[where]], bits[where]], axis=1)
    distinct, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    picks = [
        _picks(rule_for(tables, int(node_ids[where[f]]), spec), int(b), tr.count)
        for f, b in zip(first.tolist(), distinct[:, 2].tolist(), strict=True)
    ]
    out[where] = np.asarray(picks, dtype=np.int64)[inverse.reshape(-1)]
    return out


def _picks(rule: PartitionRule | None, free: int, count: int) -> int:
    """How many partitions `rule.pick` hands out one after another from the free slots `free`."""
    if rule is None:
        return NO_LIMIT
    taken = 0
    while True:
        slots = [s for s in range(free.bit_length()) if free >> s & 1]
        chosen = rule.pick(slots, count)
        if chosen is None:
            return taken
        taken += 1
        for s in chosen:
            free &= ~(1 << s)
