"""TenantIsolation: one tenant at a time on a node that cannot keep tenants apart.

A node agent that is not root cannot run workloads as their tenants' users (agent/identity.py):
every workload there runs as the agent's own user, and could read, signal or trace the others.
The control plane labels such a node ``finesched.io/tenant-isolation: "false"`` (from the agent's
report and registration: server/store/cluster_view.py), and this filter then lets onto it only the
tenant whose workloads are already bound there, or any tenant when it holds none, as Slurm's
exclusive user policy does. ``"shared"`` marks a non-isolating node whose admin allows tenants to
share it (``finesched agent --allow-tenant-sharing``), ``"true"`` a node that keeps them apart;
neither is filtered. The label is a plain label, so a workload may also ask for isolating nodes
with a node selector.

Which tenants hold bindings on each such node is kept by `TenantHolders`, a ClusterState extra
(every assume and forget passes through it): per node, the tenant that holds it alone as an
integer code (`NONE` when free, `SEVERAL` when two tenants already share it, as after the label
came), so the filter is two vectorized compares, whatever the number of nodes and tenants. The
verdict depends on the workload's tenant, which the request shape leaves out: `shape_key` adds
it to the memo key (sched/memo.py) while some node carries the label, and adds nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import SKIP, SUCCESS, Code, FilterResult, NodeBatch, Status
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState

TENANT_ISOLATION_LABEL = "finesched.io/tenant-isolation"
ISOLATED, ONE_TENANT, SHARED = "true", "false", "shared"
ISOLATION_REASON = "node(s) cannot keep tenants apart (TenantIsolation=False) and run another tenant's workloads"
NONE, SEVERAL, UNKNOWN = -1, -2, -3


def isolation_label(isolated: bool, allow_sharing: bool) -> str:
    """The label value for a node that does (not) keep tenants apart, sharing allowed or not."""
    return ISOLATED if isolated else (SHARED if allow_sharing else ONE_TENANT)


class TenantHolders:
    """Per node labelled one-tenant-at-a-time, the tenants holding bindings there (module docstring)."""

    name = "TenantHolders"

    def __init__(self) -> None:
        self.exclusive: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        #: Per node: the code of the one tenant holding it, NONE or SEVERAL.
        self.sole: npt.NDArray[np.int64] = np.full(0, NONE, dtype=np.int64)
        self._counts: dict[int, dict[int, int]] = {}
        self._codes: dict[str, int] = {}
        #: How many nodes carry the label, and how many of those some tenant holds.
        self.labelled = 0
        self.held = 0

    def code(self, tenant: str) -> int:
        """`tenant`'s code (UNKNOWN for one that never held a labelled node: none holds it)."""
        return self._codes.get(tenant, UNKNOWN)

    def holder(self, index: int) -> str | None:
        """The tenant holding node `index` alone (None: free, or several)."""
        code = int(self.sole[index])
        return next((t for t, c in self._codes.items() if c == code), None) if code >= 0 else None

    # NodeExtra ------------------------------------------------------------------------------------
    def resize(self, capacity: int) -> None:
        exclusive = np.zeros(capacity, dtype=bool)
        sole = np.full(capacity, NONE, dtype=np.int64)
        keep = min(capacity, self.sole.size)
        exclusive[:keep], sole[:keep] = self.exclusive[:keep], self.sole[:keep]
        self.exclusive, self.sole = exclusive, sole

    def set_node(self, index: int, node: Node) -> None:
        self.clear(index)  # the state replays the node's bindings after this
        if node.labels.get(TENANT_ISOLATION_LABEL) == ONE_TENANT:
            self.exclusive[index] = True
            self.labelled += 1

    def move(self, src: int, dst: int) -> None:
        self.clear(dst)
        self.exclusive[dst], self.sole[dst] = self.exclusive[src], self.sole[src]
        self.labelled += int(self.exclusive[dst])
        self.held += int(self.sole[dst] != NONE)
        if src in self._counts:
            self._counts[dst] = self._counts.pop(src)

    def clear(self, index: int) -> None:
        self.labelled -= int(self.exclusive[index])
        self.held -= int(self.sole[index] != NONE)
        self.exclusive[index], self.sole[index] = False, NONE
        self._counts.pop(index, None)

    def assume(self, index: int, binding: Binding) -> None:
        if not self.exclusive[index]:
            return
        code = self._codes.setdefault(binding.tenant, len(self._codes))
        counts = self._counts.setdefault(index, {})
        counts[code] = counts.get(code, 0) + 1
        self._settle(index, counts)

    def forget(self, index: int, binding: Binding) -> None:
        counts = self._counts.get(index)
        code = self._codes.get(binding.tenant)
        if counts is None or code not in counts:
            return
        counts[code] -= 1
        if not counts[code]:
            del counts[code]
        self._settle(index, counts)

    def _settle(self, index: int, counts: dict[int, int]) -> None:
        before = self.sole[index] != NONE
        if not counts:
            self._counts.pop(index, None)
            self.sole[index] = NONE
        else:
            self.sole[index] = next(iter(counts)) if len(counts) == 1 else SEVERAL
        self.held += int(self.sole[index] != NONE) - int(before)

    def snapshot(self) -> object:
        counts = {i: dict(c) for i, c in self._counts.items()}
        return self.exclusive.copy(), self.sole.copy(), counts, dict(self._codes), self.labelled, self.held

    def restore(self, snapshot: object) -> None:
        exclusive, sole, counts, codes, labelled, held = snapshot  # type: ignore[misc]
        capacity = self.sole.size
        self.exclusive, self.sole = exclusive.copy(), sole.copy()
        self._counts = {i: dict(c) for i, c in counts.items()}
        self._codes, self.labelled, self.held = dict(codes), labelled, held
        self.resize(max(capacity, self.sole.size))

    def violations(self) -> list[str]:
        out = []
        for i, counts in self._counts.items():
            want = next(iter(counts)) if len(counts) == 1 else SEVERAL
            if not self.exclusive[i] or int(self.sole[i]) != want:
                out.append(f"TenantHolders: node {i} holders {counts} but sole {int(self.sole[i])}")
        if self.held != int(np.count_nonzero(self.sole != NONE)):
            out.append(f"TenantHolders: {self.held} held nodes counted, {np.count_nonzero(self.sole != NONE)} found")
        return out


class TenantIsolation:
    """Filter out labelled nodes another tenant holds (module docstring)."""

    NAME: ClassVar[str] = "TenantIsolation"
    NODE_LOCAL: ClassVar[bool] = True

    def __init__(self) -> None:
        self.holders = TenantHolders()

    def attach(self, state: ClusterState) -> None:
        self.holders = state.attach(TenantHolders())

    def shape_key(self, workload: Workload) -> Hashable:
        """The tenant, while a node carries the label (verdicts then differ between tenants)."""
        return workload.tenant if self.holders.labelled else None

    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        return SUCCESS if self.holders.held else SKIP

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        sole = nodes.take(self.holders.sole)
        blocked = (sole != NONE) & (sole != self.holders.code(request.workload.tenant))
        return FilterResult(~blocked, lambda: {ISOLATION_REASON: (blocked, Code.UNSCHEDULABLE)})
