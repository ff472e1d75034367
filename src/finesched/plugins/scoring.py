"""Node preference by requested shares (seed S0.4), as pure array functions plus thin plugins.

Every function takes the list of [n] share arrays published this cycle (plugins/shares.py; one
per requested class, share = (used + request) / allocatable after placement) and returns [n]
int64 scores in [0, MAX_SCORE]. Shares are clipped to [0, 1] first: a share above 1 only occurs
on nodes the filter already rejected. A tiny epsilon keeps float noise from flooring
70.0 down to 69.

The plugins differ only in the function they apply; `SCORERS` maps the names profiles use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from finesched.plugins.shares import shares_of
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import MAX_SCORE, NodeBatch, ScoreArray
from finesched.sched.request import ScheduleRequest

FloatArray = npt.NDArray[np.float64]
_EPS = 1e-9


def _mean_and_stack(shares: Sequence[FloatArray], n: int) -> tuple[FloatArray, list[FloatArray]]:
    clipped = [np.clip(s, 0.0, 1.0) for s in shares]
    if not clipped:
        return np.zeros(n), []
    total = clipped[0].copy()
    for s in clipped[1:]:
        total += s
    return total / len(clipped), clipped


def _to_score(values: FloatArray) -> ScoreArray:
    return np.clip(np.floor(values * MAX_SCORE + _EPS), 0, MAX_SCORE).astype(np.int64)


def least_requested(shares: Sequence[FloatArray], n: int) -> ScoreArray:
    """MAX_SCORE · (1 − mean share): the node left least requested wins (spreading).

    Example, a workload asking 2 cpu and 4Gi on a node of 8 cpu / 16Gi with 2 cpu / 4Gi used:
    shares (2+2)/8 = 0.5 and (4+4)/16 = 0.5, mean 0.5 -> ⌊100 · (1 − 0.5)⌋ = 50.
    A node of 4 cpu / 16Gi, nothing used: shares 0.5, 0.25 -> mean 0.375 -> ⌊62.5⌋ = 62.
    """
    mean, _ = _mean_and_stack(shares, n)
    return _to_score(1.0 - mean)


def most_allocated(shares: Sequence[FloatArray], n: int) -> ScoreArray:
    """MAX_SCORE · mean share: the node left most requested wins (bin packing).

    Example, shares 0.5 and 0.25 -> mean 0.375 -> ⌊37.5⌋ = 37; shares 1.0 and 0.5 -> 75.
    """
    mean, _ = _mean_and_stack(shares, n)
    return _to_score(mean)


def most_balanced(shares: Sequence[FloatArray], n: int) -> ScoreArray:
    """MAX_SCORE · (1 − 4 · variance of the shares): the node whose classes stay most even wins.

    Shares lie in [0, 1], so their variance is at most 1/4; the factor 4 maps it onto the whole
    score range. Example: shares 0.5 and 0.25 -> mean 0.375, variance
    ((0.125)² + (0.125)²)/2 = 0.015625 -> ⌊100 · (1 − 0.0625)⌋ = 93. Equal shares score 100.
    """
    mean, clipped = _mean_and_stack(shares, n)
    if not clipped:
        return np.full(n, MAX_SCORE, dtype=np.int64)
    var = np.zeros(n)
    for s in clipped:
        d = s - mean
        var += d * d
    var /= len(clipped)
    return _to_score(1.0 - 4.0 * var)


ScoreFunction = Callable[[Sequence[FloatArray], int], ScoreArray]
SCORERS: dict[str, ScoreFunction] = {
    "LeastRequested": least_requested,
    "MostAllocated": most_allocated,
    "MostBalanced": most_balanced,
}


class _ShareScorer:
    """Score plugin applying one of `SCORERS` to this cycle's shares."""

    NAME: ClassVar[str]
    FUNCTION: ClassVar[ScoreFunction]

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        return type(self).FUNCTION(shares_of(cycle), nodes.n)


class LeastRequested(_ShareScorer):
    NAME = "LeastRequested"
    FUNCTION = staticmethod(least_requested)


class MostAllocated(_ShareScorer):
    NAME = "MostAllocated"
    FUNCTION = staticmethod(most_allocated)


class MostBalanced(_ShareScorer):
    NAME = "MostBalanced"
    FUNCTION = staticmethod(most_balanced)
