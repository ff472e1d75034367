"""The MIG slice counters memoize a node's `fit` row per card tuple (state/mig_slices.py): on random
MIG clusters driven through schedule, release, health flips and snapshot/restore, every node's
rows and slice counts equal a direct computation from its cards (the pre-memo code, kept here as
the reference)."""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from finesched.state.mig_slices import MIGSlices, attach_mig_slices
from test_mig_properties import MIGMachine


def reference_rows(slices: MIGSlices, i: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Node i's fit row, profile_slices row, healthy and used memory slices, computed from its cards."""
    row = np.zeros(slices.fit.shape[1], dtype=np.int64)
    sizes = np.zeros(slices.fit.shape[1], dtype=np.int64)
    total = used = 0
    for card in slices.cards[i]:
        for k, p in enumerate(card.geometry.profiles):
            col = slices.profile_ids[p.name]
            row[col] += card.capacity(k)
            sizes[col] = sizes[col] or p.memory
        if card.healthy:
            total += card.geometry.memory_slices
            used += card.geometry.memory_slices - card.free_slices()
    return row, sizes, total, used


class MemoizedRowsMachine(MIGMachine):
    saved: object = None

    @rule()
    def snapshot(self) -> None:
        self.saved = (self.state.snapshot(), attach_mig_slices(self.state))

    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        if self.saved is not None and data.draw(st.booleans()):
            snap, _ = self.saved
            self.state.restore(snap)

    @invariant()
    def rows_equal_a_direct_computation(self) -> None:
        slices = attach_mig_slices(self.state)
        for i in range(self.state.n):
            row, sizes, total, used = reference_rows(slices, i)
            assert np.array_equal(slices.fit[i], row)
            assert np.array_equal(slices.profile_slices[i], sizes)
            assert (int(slices.slices_total[i]), int(slices.slices_used[i])) == (total, used)


TestMemoizedRows = MemoizedRowsMachine.TestCase
TestMemoizedRows.settings = settings(max_examples=60, stateful_step_count=15, deadline=None)
