"""The fused device decision path (sched/fused.py): device requests without the plugin round trip.

DeviceShare offers it (`DeviceShare.fuse`) for the profiles the fused scalar path covers
(plugins/fused_scalar.py: filters ResourcesFit, NodeUnschedulable and label filters; pre_score
ResourcesFit and DeviceShare; the share scorers of plugins/scoring.py, no normalizer). A cycle
where DeviceShare skipped (no device asked) goes to that scalar path unchanged. A device cycle
runs the same plugin code the generic path runs -- each active filter's mask, ResourcesFit's and
DeviceShare's share arrays in profile order, each share scorer's function on them -- minus what
the generic path adds around it per decision: the dispatch of three extension points, the
FilterResult of DeviceShare, the cycle writes of the share lists, the range check of every
score array. The mask and the total are the generic ones bit for bit (same functions, same
arguments, same order; tests/test_fused_devices_path.py holds the two paths equal on random
clusters and device streams). When no node is feasible the scheduler re-runs the generic filters
for the diagnosis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from finesched.plugins.fused_scalar import _EPS_F, _MAX_F, _TOP_F, share_scorers
from finesched.plugins.scoring import least_requested, most_balanced
from finesched.plugins.shares import SHARES, FloatArray, Shares, _sum_rows
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import (
    MAX_SCORE,
    BoolArray,
    FilterPlugin,
    NodeBatch,
    PreScorePlugin,
    ScoreArray,
    ScorePlugin,
)
from finesched.sched.fused import FusedEvaluator, FusingPlugin
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState


class DeviceShare(Protocol):
    """What this path asks of the DeviceShare plugin (plugin.py imports this module, not the reverse)."""

    NAME: str

    def filter_mask(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> BoolArray: ...
    def share_arrays(self, cycle: CycleState, nodes: NodeBatch) -> list[np.ndarray]: ...


#: Filters run as they are in a device cycle (their own `filter`, minus the framework's loop).
_RUN_AS_IS = frozenset({"ResourcesFit", "NodeUnschedulable", "NodeSelector", "TenantIsolation"})
#: pre_score plugins whose shares this path computes (anything else: the generic path).
_SHARE_PUBLISHERS = frozenset({"ResourcesFit", "DeviceShare"})
#: Shares.variance's factor 4 with MAX_SCORE as a 0-d float64 array (the scalar path's constants below).
_FOUR_MAX_F = np.array(float(4 * MAX_SCORE))


class FusedDevice:
    """The scalar fused path for scalar cycles, and the device cycles of the same profile."""

    def __init__(
        self,
        device: DeviceShare,
        scalar: FusedEvaluator,
        filters: Sequence[FilterPlugin],
        must_skip: frozenset[str],
        publishers: Sequence[PreScorePlugin],
        scorers: Sequence[tuple[Callable[[Shares, int], ScoreArray], int]],
    ):
        self._device = device
        self._scalar = scalar
        #: Every filter of the profile a device cycle runs (when its pre_filter did not skip).
        self._filters = tuple(filters)
        #: Filters that must have skipped at pre_filter for a device cycle to take this path.
        self._must_skip = must_skip
        self._fit = next((p for p in publishers if p.NAME == "ResourcesFit"), None)
        #: The pre_score plugins in profile order: their shares are added in that order.
        self._device_first = bool(publishers) and publishers[0].NAME == "DeviceShare"
        self._scorers = tuple((f, w) for f, w in scorers if w != 0)

    @classmethod
    def build(
        cls,
        device: DeviceShare,
        state: ClusterState,
        filters: Sequence[FilterPlugin],
        pre_score: Sequence[PreScorePlugin],
        score: Sequence[tuple[ScorePlugin, int]],
        normalizing: bool,
    ) -> FusedEvaluator | None:
        """The fused path for this profile, or None (the scalar one, or the generic path)."""
        fit = next((p for p in filters if p.NAME == "ResourcesFit"), None)
        scalar = fit.fuse(state, filters, pre_score, score, normalizing) if isinstance(fit, FusingPlugin) else None
        if scalar is None or normalizing:
            return scalar
        if any(p.NAME not in _SHARE_PUBLISHERS for p in pre_score) or not any(p is device for p in pre_score):
            return scalar
        scorers = share_scorers(score)
        if scorers is None:
            return scalar
        run = [p for p in filters if p.NAME in _RUN_AS_IS or p is device]
        must_skip = frozenset(p.NAME for p in filters if p.NAME not in _RUN_AS_IS and p is not device)
        return cls(device, scalar, run, must_skip, list(pre_score), scorers)

    def path(self, request: ScheduleRequest, skipped: set[str]) -> FusedEvaluator | None:
        """The scalar path for a scalar cycle (DeviceShare skipped), this one for a device cycle it
        covers, else None."""
        if self._device.NAME in skipped:
            return self._scalar.path(request, skipped)
        return self if not request.unknown and self._must_skip <= skipped else None

    def patchable(self, request: ScheduleRequest, skipped: set[str]) -> bool:
        """No compiled patch for device cycles (a scalar cycle is handed to the scalar path by `path`)."""
        return False

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
        """Never asked (`patchable` is False): nothing written."""
        return None

    def evaluate(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, skipped: set[str]
    ) -> tuple[BoolArray, ScoreArray]:
        """run_filter's mask and run_score's total on `nodes` (see the module docstring), for a device
        cycle: the one `path` hands to this evaluator (a scalar cycle goes to the scalar path)."""
        device = self._device
        state, index, fit = nodes.state, nodes.index, self._fit
        # ResourcesFit's subset branches (filter and pre_score), inline when they apply: the
        # same numpy operations without its FilterResult and the cycle's share list.
        floor, add = request.floor, request.share_add
        rows = len(state.resources)
        subset_fit = index is not None and floor is not None and len(floor) == rows
        mask: BoolArray | None = None
        for plugin in self._filters:
            if plugin.NAME in skipped:
                continue
            if plugin is device:
                ok, fresh = device.filter_mask(cycle, request, nodes), True
            elif plugin is fit and subset_fit:
                ok, fresh = np.logical_and.reduce(state.free_at(index) >= floor, axis=0), True
            else:
                ok, fresh = plugin.filter(cycle, request, nodes).mask, False
            if mask is None:
                mask = ok if fresh else ok.copy()
            else:
                np.logical_and(mask, ok, out=mask)
        assert mask is not None  # DeviceShare's own filter ran
        n = nodes.n
        if not self._scorers:
            return mask, np.zeros(n, dtype=np.int64)
        arrays = device.share_arrays(cycle, nodes)
        if fit is not None:
            if index is not None and add is not None and len(add) == rows and request.share_pairs:
                block = state.used_float_at(index)
                block += add
                block *= state.inv_allocatable_at(index)
                scalar = [block[r] for r, _ in request.share_pairs]
            else:
                shares = Shares(n)
                cycle.write(SHARES, shares)
                fit.pre_score(cycle, request, nodes)  # type: ignore[attr-defined]  # adds its shares to `shares`
                cycle.delete(SHARES)
                scalar = shares.arrays
            arrays = arrays + scalar if self._device_first else scalar + arrays
        if len(arrays) >= 3:
            return mask, self._total_stacked(arrays, n)
        shares = Shares(n, arrays)
        total: ScoreArray | None = None
        for function, weight in self._scorers:
            scores = function(shares, n)
            if weight != 1:
                scores = scores * weight
            total = scores if total is None else np.add(total, scores, out=total)
        assert total is not None
        return mask, total

    def _total_stacked(self, arrays: list[FloatArray], n: int) -> ScoreArray:
        """The scorers' weighted total for three or more share classes (a device request's usual
        case: cpu, memory and the device dimensions), with the operations of Shares.mean,
        Shares.variance and the score functions of plugins/scoring.py on the same values (a
        Python number and its 0-d float64 array convert alike), every scorer's floor and clamp
        done once over a [scorers, n] block."""
        stack = np.array(arrays)
        scale = 1.0 / len(arrays)
        mean = _sum_rows(stack)
        mean *= scale
        scorers = self._scorers
        values = np.empty((len(scorers), n))
        clamp = []
        for j, (function, _) in enumerate(scorers):
            row = values[j]
            if function is most_balanced:
                d = stack - mean
                d *= d
                var = _sum_rows(d)
                var *= scale
                np.multiply(var, _FOUR_MAX_F, out=row)
                np.subtract(_TOP_F, row, out=row)
            elif function is least_requested:
                np.multiply(mean, _MAX_F, out=row)
                np.subtract(_TOP_F, row, out=row)
            else:  # most_allocated
                np.multiply(mean, _MAX_F, out=row)
                np.add(row, _EPS_F, out=row)
                clamp.append(j)
        scores = values.astype(np.int64)  # _to_score: truncate, floor at 0
        np.maximum(scores, 0, out=scores)
        for j in clamp:
            np.minimum(scores[j], MAX_SCORE, out=scores[j])
        weight = scorers[0][1]
        total = scores[0] if weight == 1 else np.multiply(scores[0], weight, out=scores[0])
        for j in range(1, len(scorers)):
            weight = scorers[j][1]
            np.add(total, scores[j] if weight == 1 else scores[j] * weight, out=total)
        return total
