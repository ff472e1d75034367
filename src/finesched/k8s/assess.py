"""One Pod judged against every node: feasibility, a reason per rejected node, and scores 0-10.

kube-scheduler asks an extender for a reason per failed node and whether preemption could help
(FailedNodes vs FailedAndUnresolvableNodes), which `Scheduler.evaluate` does not give (it raises
one FitError with per-reason counts). So this module runs the same steps as `evaluate` through the
scheduler's own framework — compile, pre_filter, filter, pre_score, score — read-only, and keeps
each filter's explanation to attribute every rejected node to the first filter that rejected it
(the rule of sched/diagnosis.py). Nothing here changes the state.

A filter call and the prioritize call that follows it ask about the same Pod on an unchanged
state, so the last few assessments are kept, keyed on the Pod and the state's change position.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from finesched.k8s.wire import MAX_PRIORITY
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import MAX_SCORE, Code, FilterPlugin, FilterResult, NodeBatch, unresolvable_where
from finesched.sched.memo import request_shape
from finesched.sched.request import RequestCompiler
from finesched.sched.runtime import PreFilterFailed
from finesched.sched.scheduler import Scheduler


@dataclass
class Assessment:
    """What one evaluation found; `reason` and `scores` are computed on first use."""

    scheduler: Scheduler
    cycle: CycleState | None
    request: object
    feasible: npt.NDArray[np.bool_]
    results: list[tuple[FilterPlugin, FilterResult]]
    #: Set when pre_filter refused the pod on every node: (reason, unresolvable).
    refused: tuple[str, bool] | None = None
    _reasons: dict[int, tuple[str, bool]] | None = field(default=None, repr=False)
    _scores: npt.NDArray[np.int64] | None = field(default=None, repr=False)

    def reason(self, i: int) -> tuple[str, bool]:
        """Why node `i` is infeasible, and whether no preemption can fix it."""
        if self.refused is not None:
            return self.refused
        if self._reasons is None:
            self._reasons = _attribute(self.results, self.feasible)
        return self._reasons.get(i, ("rejected", False))

    def scores(self) -> npt.NDArray[np.int64]:
        """[n] extender scores 0..10 (MaxExtenderPriority); 0 on infeasible nodes."""
        if self._scores is None:
            self._scores = self._compute_scores()
        return self._scores

    def _compute_scores(self) -> npt.NDArray[np.int64]:
        state = self.scheduler.state
        out = np.zeros(state.n, dtype=np.int64)
        framework = self.scheduler.framework
        top = sum(w for _, w in framework.points.score) * MAX_SCORE
        if self.cycle is None or top <= 0 or not self.feasible.any():
            return out
        batch = NodeBatch(state).with_mask(self.feasible)
        try:
            framework.run_pre_score(self.cycle, self.request, batch)  # type: ignore[arg-type]
        except PreFilterFailed:
            return out
        total = framework.run_score(self.cycle, self.request, batch)  # type: ignore[arg-type]
        scaled = (total.astype(np.int64) * MAX_PRIORITY * 2 + top) // (2 * top)  # rounded to nearest
        np.clip(scaled, 0, MAX_PRIORITY, out=scaled)
        out[self.feasible] = scaled[self.feasible]
        return out


def _attribute(results: Sequence[tuple[FilterPlugin, FilterResult]], feasible: npt.NDArray[np.bool_]) -> dict:
    """Each rejected node's reasons from the first filter that rejected it (joined with "; "), the rule
    of sched/diagnosis.py. Unresolvable when some filter rejects it for a reason UNRESOLVABLE on it
    (then no preemption helps, whatever the first filter said; diagnosis.unresolvable_nodes); every
    such filter's reasons are added. Codes are per node, so a node's answer never depends on the others."""
    out: dict[int, tuple[str, bool]] = {}
    n = len(feasible)
    for plugin, result in results:
        rejected = ~result.mask
        if not rejected.any():
            continue
        texts: dict[int, list[str]] = {}
        never: set[int] = set()
        explanation = result.explain() if result.explain is not None else {}
        for reason, (mask, code) in explanation.items():
            hit = rejected & mask
            for i in np.flatnonzero(hit).tolist():
                texts.setdefault(i, []).append(reason)
            never.update(np.flatnonzero(hit & unresolvable_where(code, n)).tolist())
        for i in np.flatnonzero(rejected).tolist():
            given = texts.get(i)
            final = i in never
            text = f"{'; '.join(given)} ({plugin.NAME})" if given else f"rejected by {plugin.NAME}"
            before = out.get(i)
            if before is None:
                out[i] = (text, final)
            elif final:  # every filter that rules the node out for good is named
                out[i] = (f"{before[0]}; {text}", True)
    return out


class Assessor:
    """Assessments of workloads on one scheduler's state, the last few kept (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, keep: int = 16):
        self.scheduler = scheduler
        self._compiler = RequestCompiler(scheduler.state, scheduler.framework.owns)
        self._kept: OrderedDict[Hashable, Assessment] = OrderedDict()
        self._keep = keep

    def assess(self, workload: Workload, identity: Hashable) -> Assessment:
        state = self.scheduler.state
        key = (identity, state.change_position, state.nodes_version, state.n)
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found
        result = self._evaluate(workload)
        self._kept[key] = result
        while len(self._kept) > self._keep:
            self._kept.popitem(last=False)
        return result

    def _evaluate(self, workload: Workload) -> Assessment:
        state = self.scheduler.state
        framework = self.scheduler.framework
        request = self._compiler.compile(workload, request_shape(workload))
        cycle = CycleState()
        nodes = NodeBatch(state)
        try:
            skipped = framework.run_pre_filter(cycle, request, nodes)
        except PreFilterFailed as exc:
            status = exc.status
            refused = (f"{status.message()} ({status.plugin})", status.code in (Code.UNRESOLVABLE, Code.ERROR))
            return Assessment(self.scheduler, None, request, np.zeros(state.n, dtype=bool), [], refused)
        feasible, results = framework.run_filter(cycle, request, nodes, skipped)
        return Assessment(self.scheduler, cycle, request, feasible, results)
