"""NodeSelector: the node must carry every ``key: value`` of the workload's node selector and
satisfy every node-affinity term (In / NotIn / Exists / DoesNotExist), as Kubernetes requires."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from finesched.model.workload import NodeAffinityTerm
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import SKIP, SUCCESS, BoolArray, Code, FilterResult, NodeBatch, Status
from finesched.sched.request import ScheduleRequest
from finesched.state.labels import LabelIndex

SELECTOR_REASON = "node(s) didn't match node selector"
AFFINITY_REASON = "node(s) didn't match node affinity"


class NodeSelector:
    """Filter on labels, one vectorized compare per selector key or affinity value (state/labels.py)."""

    NAME: ClassVar[str] = "NodeSelector"
    NODE_LOCAL: ClassVar[bool] = True

    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        w = request.workload
        return SUCCESS if w.node_selector or w.node_affinity else SKIP

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        labels, n = nodes.state.labels, nodes.state.n
        w = request.workload
        selector = nodes.take(labels.match(w.node_selector, n))
        affinity = np.ones(nodes.n, dtype=bool)
        for term in w.node_affinity:
            affinity &= nodes.take(term_mask(labels, term, n))

        def explain() -> dict[str, tuple[BoolArray, Code]]:
            return {SELECTOR_REASON: (~selector, Code.UNRESOLVABLE), AFFINITY_REASON: (~affinity, Code.UNRESOLVABLE)}

        return FilterResult(selector & affinity, explain)


def term_mask(labels: LabelIndex, term: NodeAffinityTerm, n: int) -> BoolArray:
    """[n] True where the node satisfies one affinity term."""
    if term.operator == "In":
        return labels.match_in(term.key, term.values, n)
    if term.operator == "NotIn":
        return ~labels.match_in(term.key, term.values, n)
    exists = labels.has_key(term.key, n)
    return exists if term.operator == "Exists" else ~exists
