"""GPU partition tables for DeviceShare (model/gpu_partitions.py says what a table means; Koordinator's
deviceshare ``allocateByPartition`` is the behaviour we follow).

A table matters for a request of whole GPUs (a shared GPU ignores it, as in Koordinator). It is
*binding* on a node when the node's policy is Honor or the workload has a gpu-partition-spec; then:

* the node needs a table with partitions of the request's GPU count (else the node is
  unresolvable: "node has no GPU partition table", "... has no 3-GPU partition"; as in Koordinator,
  a node labelled Honor without a table takes no whole-GPU request);
* the GPUs must be one partition whose members all fit (are free, healthy, and inside a required
  NUMA affinity), among the top allocationScore only (Restricted) or any score (BestEffort), with
  a ring bandwidth >= the spec's ``ringBusBandwidth`` when it names one;
* no free partition -> the filter rejects the node with a reason naming the policy.

On a Prefer node (the default when a table exists) for a workload without a spec, a free partition
is taken when there is one, else the ordinary choice (allocator.py) decides.

**Which partition** (`PartitionRule.pick`): the highest allocationScore among the free allowed ones,
then the one that keeps the most partitions of the node whole, largest sizes first (for each table
size s >= the request's count, the number of partitions of size s still entirely free after the
choice, compared lexicographically from the largest s), then the lowest minors. Koordinator
weighs sizes 8, 4 and 2 by 10000, 100 and 1 times the partition's score; counting whole partitions
per size (every size of the table, lexicographically) keeps the largest partitions of the node whole
without depending on how the scores are scaled.

A deviceAllocateHint or deviceJointAllocate on the gpu type is not combined with a binding table:
such a node is unresolvable for that request (the hint's own set rules would contradict the table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.gpu_partitions import GPUPartitionSpec
from finesched.model.resources import GPU
from finesched.plugins.deviceshare.request import DeviceRequest, FitRule, TypeRequest, fit_mask
from finesched.quantity import format_quantity
from finesched.sched.framework import Code
from finesched.state.devices import DeviceAccounts, node_rows
from finesched.state.gpu_partitions import CompiledTable, PartitionTables

BoolArray = npt.NDArray[np.bool_]


def partition_request(dreq: DeviceRequest) -> TypeRequest | None:
    """The gpu request a partition table can apply to: whole GPUs (a shared GPU never uses one)."""
    tr = dreq.types.get(GPU)
    return tr if tr is not None and not tr.shared else None


def combined(dreq: DeviceRequest) -> bool:
    """The gpu request carries a hint or is part of a joint allocation (not combined with a table)."""
    tr = dreq.types.get(GPU)
    in_joint = dreq.joint is not None and GPU in dreq.joint.types
    return tr is not None and (tr.hint is not None or in_joint)


def policy_words(node_honor: bool, spec: GPUPartitionSpec | None) -> str:
    """How reasons name what made the table binding."""
    parts = ["gpu-partition-policy Honor"] if node_honor else []
    if spec is not None:
        parts.append(f"gpu-partition-spec allocatePolicy {spec.allocate_policy}")
        if spec.ring_bus_bandwidth is not None:
            parts.append(f"ringBusBandwidth >= {format_quantity(spec.ring_bus_bandwidth, 'bytes')}")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class PartitionRule:
    """The table of one node as it applies to one request (`rule_for`)."""

    table: CompiledTable | None
    honor: bool
    node_honor: bool
    spec: GPUPartitionSpec | None

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.table, self.honor, self.node_honor, self.spec)

    def refusal(self, count: int) -> str:
        """The reason when the rule is binding and nothing can be picked."""
        why = policy_words(self.node_honor, self.spec)
        if self.table is None:
            return f"node has no GPU partition table ({why})"
        if count not in self.table.plans:
            return f"GPU partition table has no {count}-GPU partition ({why})"
        return f"no free {count}-GPU partition ({why})"

    def pick(self, slots: Sequence[int], count: int) -> tuple[int, ...] | None:
        """The partition (device slots) to take among `slots` (the devices that fit), or None."""
        plan = None if self.table is None else self.table.plans.get(count)
        if plan is None:
            return None
        assert self.table is not None
        free = sum(1 << s for s in slots)
        spec = self.spec
        ok = plan.allowed(spec is not None and spec.allocate_policy == "Restricted", _bandwidth(spec))
        ok &= (plan.masks & free) == plan.masks
        if not ok.any():
            return None
        top = int(plan.scores[ok].max())
        best: tuple[tuple[Any, ...], int] | None = None
        for p in np.flatnonzero(ok & (plan.scores == top)).tolist():
            left = free & ~int(plan.masks[p])
            whole = []
            for size in self.table.sizes:
                if size >= max(count, 2):
                    masks = self.table.plans[size].masks
                    whole.append(int(((masks & left) == masks).sum()))
            key = (tuple(-w for w in whole), plan.minors[p])
            if best is None or key < best[0]:
                best = (key, p)
        assert best is not None
        mask = int(plan.masks[best[1]])
        return tuple(s for s in sorted(slots) if mask >> s & 1)


def _bandwidth(spec: GPUPartitionSpec | None) -> int | None:
    return None if spec is None else spec.ring_bus_bandwidth


def rule_for(tables: PartitionTables, node: int, spec: GPUPartitionSpec | None) -> PartitionRule | None:
    """Node `node`'s rule for a whole-GPU request (None: the node has no table and none is asked)."""
    table = tables.table_of(node)
    node_honor = bool(tables.honor[node])
    honor = node_honor or spec is not None
    if table is None and not honor:
        return None
    return PartitionRule(table, honor, node_honor, spec)


def partition_mask(
    accounts: DeviceAccounts,
    tables: PartitionTables,
    dreq: DeviceRequest,
    rule: FitRule,
    n: int,
    index: npt.NDArray[np.intp] | None,
) -> BoolArray:
    """[batch] nodes that pass the partition rules for `dreq`'s whole-GPU request (nodes where the
    table is not binding always pass: the count filter and the allocator decide there)."""
    tr = partition_request(dreq)
    assert tr is not None
    acc = accounts.types[GPU]
    spec, blocked = dreq.partition, combined(dreq)
    restricted = spec is not None and spec.allocate_policy == "Restricted"

    def compute(rows: Any) -> tuple[np.ndarray, ...]:
        tid = tables.table_id[rows]
        honor = tables.honor[rows] | (spec is not None)
        ok = ~honor
        if blocked or not honor.any():
            return (ok,)
        fits = fit_mask(rule, *node_rows(acc, rows))
        bits = (fits.astype(np.int64) << np.arange(fits.shape[1], dtype=np.int64)).sum(axis=1)
        # Every node against its own table's allowed partitions in one pass (padded per table);
        # a binding node without a table, or whose table has no such partition, fails.
        masks, allowed = tables.plan_matrix(tr.count, restricted, _bandwidth(spec))
        has = honor & (tid >= 0)
        mine = masks[np.where(has, tid, 0)]
        free = ((bits[:, None] & mine) == mine) & allowed[np.where(has, tid, 0)]
        ok |= has & free.any(axis=1)
        return (ok,)

    if index is not None:
        return compute(index)[0]
    return accounts.cached(("gpu-partitions", rule, tr.count, spec, blocked), compute, n)[0]


def explain_partitions(
    tables: PartitionTables, dreq: DeviceRequest, node_ids: Sequence[int], failing: BoolArray
) -> dict[str, tuple[BoolArray, Code]]:
    """Reasons for the nodes `failing` the partition mask (rows of `node_ids`)."""
    tr = partition_request(dreq)
    assert tr is not None
    out: dict[str, tuple[BoolArray, Code]] = {}
    for row in np.flatnonzero(failing).tolist():
        rule = rule_for(tables, node_ids[row], dreq.partition)
        if rule is None:
            continue
        if combined(dreq):
            reason, code = (
                f"{policy_words(rule.node_honor, rule.spec)}: a gpu deviceAllocateHint or deviceJointAllocate "
                "is not combined with a GPU partition table",
                Code.UNRESOLVABLE,
            )
        else:
            reason = rule.refusal(tr.count)
            binding_gap = rule.table is None or tr.count not in rule.table.plans
            code = Code.UNRESOLVABLE if binding_gap else Code.UNSCHEDULABLE
        out.setdefault(reason, (np.zeros(len(node_ids), dtype=bool), code))[0][row] = True
    return out
