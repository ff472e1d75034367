"""NodeSelector: the node must carry every ``key: value`` of the workload's node selector."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import SKIP, SUCCESS, Code, FilterResult, NodeBatch, Status
from finesched.sched.request import ScheduleRequest

REASON = "node(s) didn't match node selector"


class NodeSelector:
    """Filter on labels, one vectorized compare per selector key (state/labels.py)."""

    NAME: ClassVar[str] = "NodeSelector"

    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        return SUCCESS if request.workload.node_selector else SKIP

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        mask = nodes.state.labels.match(request.workload.node_selector, nodes.n)
        return FilterResult(mask, lambda: {REASON: (np.ones(nodes.n, dtype=bool), Code.UNRESOLVABLE)})
