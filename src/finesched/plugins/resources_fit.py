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
    NODE_LOCAL: ClassVar[bool] = True

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        free = nodes.state.free
        if request.unknown:
            mask = np.zeros(nodes.n, dtype=bool)
        else:
            pairs = request.pairs
            r, amount = pairs[0]
            mask = nodes.row(free, r) >= amount
            for r, amount in pairs[1:]:
                mask &= nodes.row(free, r) >= amount
        return FilterResult(mask, lambda: self._explain(request, nodes))

    @staticmethod
    def _explain(request: ScheduleRequest, nodes: NodeBatch) -> Explanation:
        state = nodes.state
        out: dict[str, tuple[np.ndarray, Code]] = {
            f"insufficient {name} (no node offers it)": (np.ones(nodes.n, dtype=bool), Code.UNRESOLVABLE)
            for name in request.unknown
        }
        for r, amount in request.pairs:
            short = nodes.row(state.free, r) < amount
            never = nodes.row(state.allocatable, r) < amount
            code = Code.UNRESOLVABLE if bool(np.all(never[short])) else Code.UNSCHEDULABLE
            out[f"insufficient {state.resources[r]}"] = (short, code)
        return out

    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        state = nodes.state
        used, inv = state.used_float, state.inv_allocatable
        for r, amount in request.share_pairs:
            share = nodes.row(used, r) + float(amount)
            add_shares(cycle, np.multiply(share, nodes.row(inv, r), out=share))
        return SUCCESS
