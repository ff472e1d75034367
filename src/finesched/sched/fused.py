"""Fused decision paths: a plugin may stand in for the filter and score round trip of a profile.

The generic path (sched/runtime.py) runs every filter, pre_score and score plugin in turn, a few
microseconds of Python per plugin per decision. Once the per-shape memo (sched/memo.py) has cut
the node work down to the few nodes changed since, that overhead is most of a decision. A plugin
that knows how to compute a profile's mask and score total in a few numpy calls offers a
`FusedEvaluator` through `fuse`; the scheduler uses it for the cycles its `path` takes,
and the generic path otherwise. A fused evaluator must give exactly the generic answer (mask and
total, bit for bit): the generic path is the reference, and the fused path's tests compare both
on random clusters (tests/test_fused_scalar.py). When nothing is feasible, the scheduler asks
the generic filters for the diagnosis.

(The protocols live here, the implementations with the plugins they fuse: sched/ imports no plugin.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import BoolArray, FilterPlugin, NodeBatch, PreScorePlugin, ScoreArray, ScorePlugin
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState


class FusedEvaluator(Protocol):
    """Filter and score of a profile's plugins in one call, for the cycles it covers."""

    def path(self, request: ScheduleRequest, skipped: set[str]) -> FusedEvaluator | None:
        """The evaluator that takes this cycle (after pre_filter; `skipped` is its answer): this one,
        one it wraps, or None for the generic path. The scheduler asks once per decision and then
        calls the answer directly, without a wrapper's hops."""
        ...

    def evaluate(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, skipped: set[str]
    ) -> tuple[BoolArray, ScoreArray]:
        """What `run_filter`'s mask and `run_score`'s total would be on `nodes` (every node scored)."""
        ...

    def patchable(self, request: ScheduleRequest, skipped: set[str]) -> bool:
        """Whether `patch` may take this cycle (one `path` handed to this evaluator): a compiled
        pass that covers it is loaded. Asked before the memo lookup, once per memoized decision."""
        ...

    def patch(
        self,
        cycle: CycleState,
        request: ScheduleRequest,
        nodes: NodeBatch,
        skipped: set[str],
        feasible: BoolArray,
        key: ScoreArray,
        ranks: npt.NDArray[np.int64] | None,
    ) -> int | None:
        """Write the mask and selection key of `nodes.index` (may repeat) into a memo entry's
        `feasible` and `key`; the change of its feasible count, or None when nothing was written
        (the caller then runs `evaluate`). Only after `patchable` said yes."""
        ...


@runtime_checkable
class FusingPlugin(Protocol):
    """A plugin that can offer a fused evaluator for the profile it sits in."""

    def fuse(
        self,
        state: ClusterState,
        filters: Sequence[FilterPlugin],
        pre_score: Sequence[PreScorePlugin],
        score: Sequence[tuple[ScorePlugin, int]],
        normalizing: bool,
    ) -> FusedEvaluator | None: ...
