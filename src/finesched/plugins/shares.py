"""Per-class requested shares after placement, shared by the S0.4 scorers.

For each class c the workload asks for, ``share_c[i] = (used_c[i] + request_c) / allocatable_c[i]``
on node i. Any plugin that owns resource classes (scalar fit, devices) adds its classes in
pre_score; LeastRequested / MostBalanced / MostAllocated read them. The mean and variance over
classes are computed once per cycle, however many scorers use them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from finesched.sched.cycle_state import CycleState, StateKey

FloatArray = npt.NDArray[np.float64]


class Shares:
    """The [n] share arrays of one cycle (one per requested class), with cached mean and variance."""

    __slots__ = ("_mean", "_stack", "_var", "arrays", "n")

    def __init__(self, n: int, arrays: Sequence[FloatArray] = ()) -> None:
        self.n = n
        self.arrays: list[FloatArray] = list(arrays)
        self._mean: FloatArray | None = None
        self._var: FloatArray | None = None
        self._stack: FloatArray | None = None

    def add(self, share: FloatArray) -> None:
        self.arrays.append(share)
        self._mean = self._var = self._stack = None

    def mean(self) -> FloatArray:
        """[n] mean share over the classes (zeros when there are none)."""
        if self._mean is None:
            arrays = self.arrays
            if not arrays:
                self._mean = np.zeros(self.n)
            elif len(arrays) == 1:
                self._mean = arrays[0]
            elif len(arrays) == 2:
                total = arrays[0] + arrays[1]
                total *= 0.5
                self._mean = total
            else:
                # One reduction over the stacked classes instead of one add per class. Reducing
                # along axis 0 adds the rows in order, one after the other, exactly like
                # ``a0 + a1 + a2 ...`` (pairwise summation applies along the contiguous axis
                # only, see `_sum_rows`); tests/test_scoring.py holds the two bit for bit equal.
                total = _sum_rows(self._stacked())
                total *= 1.0 / len(arrays)
                self._mean = total
        return self._mean

    def _stacked(self) -> npt.NDArray[np.float64]:
        if self._stack is None:
            self._stack = np.array(self.arrays)
        return self._stack

    def variance(self) -> FloatArray:
        """[n] population variance of the shares over the classes (zeros for fewer than two)."""
        if self._var is None:
            arrays = self.arrays
            if len(arrays) < 2:
                self._var = np.zeros(self.n)
            elif len(arrays) == 2:
                half = arrays[0] - arrays[1]  # var of two values = ((a - b) / 2)²
                half *= 0.5
                self._var = half * half
            else:  # sum over classes of (share - mean)², in class order (see `mean`)
                d = self._stacked() - self.mean()
                d *= d
                var = _sum_rows(d)
                var *= 1.0 / len(arrays)
                self._var = var
        return self._var


def _sum_rows(stack: FloatArray) -> FloatArray:
    """The rows of a [classes, n] stack added one after the other, in order.

    With n > 1 ``np.add.reduce(axis=0)`` does exactly that; with a single node the reduced axis is
    the contiguous one and numpy switches to pairwise summation, whose rounding differs, so the
    rows are added in a loop there (a handful of one-element additions).
    """
    if stack.shape[1] != 1:
        return np.add.reduce(stack, axis=0)
    total = stack[0] + stack[1]
    for row in stack[2:]:
        total += row
    return total


SHARES = StateKey("Shares/after-placement", Shares)


def add_shares(cycle: CycleState, share: FloatArray) -> None:
    """Publish one class's [n] share array for this cycle's scorers."""
    shares = cycle.get(SHARES)
    if shares is None:
        shares = Shares(len(share))
        cycle.write(SHARES, shares)
    shares.add(share)


def shares_of(cycle: CycleState, n: int) -> Shares:
    """This cycle's shares (an empty set of `n` nodes when no plugin published any)."""
    shares = cycle.get(SHARES)
    return Shares(n) if shares is None else shares
