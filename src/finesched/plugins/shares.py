"""Per-class requested shares after placement, shared by the S0.4 scorers.

For each class c the workload asks for, ``share_c[i] = (used_c[i] + request_c) / allocatable_c[i]``
on node i. Any plugin that owns resource classes (scalar fit, devices) adds its classes in
pre_score; LeastRequested / MostBalanced / MostAllocated read them all. Shares are computed once
per cycle, however many scorers use them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from finesched.sched.cycle_state import CycleState, StateKey

FloatArray = npt.NDArray[np.float64]


class Shares:
    """The list of [n] share arrays of one cycle (written in pre_score, read in score)."""

    __slots__ = ("arrays",)

    def __init__(self) -> None:
        self.arrays: list[FloatArray] = []


SHARES = StateKey("Shares/after-placement", Shares)


def add_shares(cycle: CycleState, share: FloatArray) -> None:
    """Publish one class's [n] share array for this cycle's scorers."""
    shares = cycle.get(SHARES)
    if shares is None:
        shares = Shares()
        cycle.write(SHARES, shares)
    shares.arrays.append(share)


def shares_of(cycle: CycleState) -> list[FloatArray]:
    """Every class's share array published this cycle (empty if none)."""
    shares = cycle.get(SHARES)
    return [] if shares is None else shares.arrays
