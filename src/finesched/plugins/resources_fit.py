"""ResourcesFit: a node fits only if every requested scalar class fits (seed S0.3), vectorized.

One compare per requested resource over all nodes: ``free[r] >= amount``. Device resources are
owned by the device plugin and never reach this filter (see `compile_request`). Its pre_score
also publishes each requested class's share after placement, which the S0.4 scorers use.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from finesched.plugins.shares import add_shares
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import SUCCESS, Code, Explanation, FilterResult, NodeBatch, Status
from finesched.sched.request import ScheduleRequest


class ResourcesFit:
    """Filter: every requested scalar resource fits in the node's free amount."""

    NAME: ClassVar[str] = "ResourcesFit"

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        free = nodes.state.free
        if request.unknown:
            mask = np.zeros(nodes.n, dtype=bool)
        else:
            rows, amounts = request.rows, request.amounts
            mask = free[rows[0]] >= amounts[0]
            for k in range(1, len(rows)):
                mask &= free[rows[k]] >= amounts[k]
        return FilterResult(mask, lambda: self._explain(request, nodes))

    @staticmethod
    def _explain(request: ScheduleRequest, nodes: NodeBatch) -> Explanation:
        state = nodes.state
        out: dict[str, tuple[np.ndarray, Code]] = {
            f"insufficient {name} (no node offers it)": (np.ones(nodes.n, dtype=bool), Code.UNRESOLVABLE)
            for name in request.unknown
        }
        for r, amount in zip(request.rows.tolist(), request.amounts.tolist(), strict=True):
            short = state.free[r] < amount
            never = state.allocatable[r] < amount
            code = Code.UNRESOLVABLE if bool(np.all(never[short])) else Code.UNSCHEDULABLE
            out[f"insufficient {state.resources[r]}"] = (short, code)
        return out

    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        state = nodes.state
        alloc, free, inv = state.allocatable, state.free, state.inv_allocatable
        for r, amount in zip(request.share_rows.tolist(), request.share_amounts.tolist(), strict=True):
            add_shares(cycle, (alloc[r] - free[r] + amount) * inv[r])
        return SUCCESS
