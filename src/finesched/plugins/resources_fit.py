"""ResourcesFit: a node fits only if every requested scalar class fits (seed S0.3), vectorized.

One compare per requested resource over all nodes: ``free[r] >= amount``. Device resources are
owned by the device plugin and never reach this filter (see `compile_request`). Its pre_score
also publishes each requested class's share after placement, which the S0.4 scorers use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from finesched.plugins.shares import add_shares
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import (
    NO_LIMIT,
    SUCCESS,
    Code,
    CountArray,
    Explanation,
    FilterPlugin,
    FilterResult,
    NodeBatch,
    PreScorePlugin,
    ScorePlugin,
    Status,
)
from finesched.sched.fused import FusedEvaluator
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState


class ResourcesFit:
    """Filter: every requested scalar resource fits in the node's free amount."""

    NAME: ClassVar[str] = "ResourcesFit"
    NODE_LOCAL: ClassVar[bool] = True

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        free = nodes.state.free
        floor = request.floor
        if request.unknown:
            mask = np.zeros(nodes.n, dtype=bool)
        elif nodes.index is not None and floor is not None and len(floor) == len(free):
            # A subset batch (the memo's changed nodes): gather every row of the few nodes at
            # once and compare with the per-row floor (int64 min where nothing is asked): three
            # numpy calls instead of three per requested resource.
            mask = np.logical_and.reduce(nodes.state.free_at(nodes.index) >= floor, axis=0)
        else:
            pairs = request.pairs
            r, amount = pairs[0]
            mask = nodes.row(free, r) >= amount
            for r, amount in pairs[1:]:
                mask &= nodes.row(free, r) >= amount
        return FilterResult(mask, lambda: self._explain(request, nodes))

    def count(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> CountArray:
        """Exact: the least over requested scalar resources (pods included) of ``free // amount``.

        Copies take the same amounts each, so nothing else can run out first.
        """
        if request.unknown:
            return np.zeros(nodes.n, dtype=np.int64)
        out = np.full(nodes.n, NO_LIMIT, dtype=np.int64)
        for r, amount in request.pairs:
            if amount > 0:
                np.minimum(out, nodes.row(nodes.state.free, r) // amount, out=out)
        return np.maximum(out, 0, out=out)

    @staticmethod
    def _explain(request: ScheduleRequest, nodes: NodeBatch) -> Explanation:
        """One reason per short resource, "insufficient <name>"; unresolvable on the nodes whose
        allocatable is below the request (kube-scheduler's Fit does the same per node)."""
        state = nodes.state
        out: dict[str, tuple[np.ndarray, Code | np.ndarray]] = {
            f"insufficient {name} (no node offers it)": (np.ones(nodes.n, dtype=bool), Code.UNRESOLVABLE)
            for name in request.unknown
        }
        for r, amount in request.pairs:
            short = nodes.row(state.free, r) < amount
            never = nodes.row(state.allocatable, r) < amount
            out[f"insufficient {state.resources[r]}"] = (short, never)
        return out

    def fuse(
        self,
        state: ClusterState,
        filters: Sequence[FilterPlugin],
        pre_score: Sequence[PreScorePlugin],
        score: Sequence[tuple[ScorePlugin, int]],
        normalizing: bool,
    ) -> FusedEvaluator | None:
        """The fused scalar path (plugins/fused_scalar.py) when the profile's plugins allow it."""
        from finesched.plugins.fused_scalar import FusedScalar  # it imports this module's neighbours

        return FusedScalar.build(state, filters, pre_score, score, normalizing)

    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        state = nodes.state
        used, inv = state.used_float, state.inv_allocatable
        add, index = request.share_add, nodes.index
        if index is not None and add is not None and len(add) == len(used) and request.share_pairs:
            # Subset batch: every row of the few nodes in one gather each; rows nobody asked for
            # are computed and dropped. Each kept row gets the operations of the loop below.
            block = state.used_float_at(index)
            block += add
            block *= state.inv_allocatable_at(index)
            for r, _ in request.share_pairs:
                add_shares(cycle, block[r])
            return SUCCESS
        for r, amount in request.share_pairs:
            share = nodes.row(used, r) + float(amount)
            add_shares(cycle, np.multiply(share, nodes.row(inv, r), out=share))
        return SUCCESS
