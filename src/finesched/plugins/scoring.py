"""Node preference by requested shares (seed S0.4), as pure array functions plus thin plugins.

Every function takes the [n] share arrays published this cycle (plugins/shares.py; one per
requested class, share = (used + request) / allocatable after placement) and returns [n] int64
scores in [0, MAX_SCORE]. On a node that fits, every share lies in [0, 1]; a share above 1 only
occurs on nodes the filter rejected, whose scores are merely kept in range. A tiny epsilon keeps
float noise from flooring 70.0 down to 69.

The plugins differ only in the function they apply; `SCORERS` maps the names profiles use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from finesched.plugins.shares import Shares, shares_of
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import MAX_SCORE, NodeBatch, ScoreArray
from finesched.sched.request import ScheduleRequest

FloatArray = npt.NDArray[np.float64]
_EPS = 1e-9


def _shares(shares: Shares | Sequence[FloatArray], n: int) -> Shares:
    return shares if isinstance(shares, Shares) else Shares(n, shares)


def _to_score(values: FloatArray) -> ScoreArray:
    """⌊values⌋ as int64, floored at 0 (values never exceed MAX_SCORE by construction)."""
    scores = values.astype(np.int64)
    return np.maximum(scores, 0, out=scores)


def least_requested(shares: Shares | Sequence[FloatArray], n: int) -> ScoreArray:
    """MAX_SCORE · (1 − mean share): the node left least requested wins (spreading).

    Example, a workload asking 2 cpu and 4Gi on a node of 8 cpu / 16Gi with 2 cpu / 4Gi used:
    shares (2+2)/8 = 0.5 and (4+4)/16 = 0.5, mean 0.5 -> ⌊100 · (1 − 0.5)⌋ = 50.
    A node of 4 cpu / 16Gi, nothing used: shares 0.5, 0.25 -> mean 0.375 -> ⌊62.5⌋ = 62.
    """
    mean = _shares(shares, n).mean()
    return _to_score((MAX_SCORE + _EPS) - MAX_SCORE * mean)


def most_allocated(shares: Shares | Sequence[FloatArray], n: int) -> ScoreArray:
    """MAX_SCORE · mean share: the node left most requested wins (bin packing).

    Example, shares 0.5 and 0.25 -> mean 0.375 -> ⌊37.5⌋ = 37; shares 1.0 and 0.5 -> 75.
    On a node the workload does not fit, shares exceed 1; those scores are capped at MAX_SCORE.
    """
    mean = _shares(shares, n).mean()
    return np.minimum(_to_score(MAX_SCORE * mean + _EPS), MAX_SCORE)


def most_balanced(shares: Shares | Sequence[FloatArray], n: int) -> ScoreArray:
    """MAX_SCORE · (1 − 4 · variance of the shares): the node whose classes stay most even wins.

    Shares of a fitting node lie in [0, 1], so their variance is at most 1/4; the factor 4 maps
    it onto the whole score range. Example: shares 0.5 and 0.25 -> mean 0.375, variance
    ((0.125)² + (0.125)²)/2 = 0.015625 -> ⌊100 · (1 − 0.0625)⌋ = 93. Equal shares score 100.
    """
    var = _shares(shares, n).variance()
    return _to_score((MAX_SCORE + _EPS) - (4 * MAX_SCORE) * var)


ScoreFunction = Callable[[Sequence[FloatArray], int], ScoreArray]
SCORERS: dict[str, ScoreFunction] = {
    "LeastRequested": least_requested,
    "MostAllocated": most_allocated,
    "MostBalanced": most_balanced,
}


class _ShareScorer:
    """Score plugin applying one of `SCORERS` to this cycle's shares."""

    NAME: ClassVar[str]
    NODE_LOCAL: ClassVar[bool] = True
    FUNCTION: ClassVar[ScoreFunction]

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        return type(self).FUNCTION(shares_of(cycle, nodes.n), nodes.n)


class LeastRequested(_ShareScorer):
    NAME = "LeastRequested"
    FUNCTION = staticmethod(least_requested)


class MostAllocated(_ShareScorer):
    NAME = "MostAllocated"
    FUNCTION = staticmethod(most_allocated)


class MostBalanced(_ShareScorer):
    NAME = "MostBalanced"
    FUNCTION = staticmethod(most_balanced)
