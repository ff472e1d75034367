"""NodeUnschedulable: never place new work on a node marked unschedulable.

A driver marks a node by giving it the label `UNSCHEDULABLE_LABEL` (the control plane does so
when an operator cordons the node or its agent stops sending heartbeats), the way Kubernetes
taints such nodes `node.kubernetes.io/unschedulable` and `node.kubernetes.io/not-ready`.
Workloads already bound there stay; only new placements are refused.
"""

from __future__ import annotations

from typing import ClassVar

from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import Code, FilterResult, NodeBatch
from finesched.sched.request import ScheduleRequest

#: The label a driver sets on a node that must take no new work; its value says why.
UNSCHEDULABLE_LABEL = "finesched.io/unschedulable"
UNSCHEDULABLE_REASON = "node(s) were unschedulable (cordoned or not ready)"


class NodeUnschedulable:
    """Filter out nodes carrying `UNSCHEDULABLE_LABEL` (one vectorized label lookup)."""

    NAME: ClassVar[str] = "NodeUnschedulable"
    NODE_LOCAL: ClassVar[bool] = True

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        state = nodes.state
        marked = nodes.take(state.labels.has_key(UNSCHEDULABLE_LABEL, state.n))
        return FilterResult(~marked, lambda: {UNSCHEDULABLE_REASON: (marked, Code.UNSCHEDULABLE)})
