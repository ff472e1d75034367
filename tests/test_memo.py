"""The per-shape memo stays bounded by shapes and by bytes, evicting the least recently used."""

from __future__ import annotations

import numpy as np

from builders import make_node
from finesched.sched.memo import MemoEntry, ScoreMemo
from finesched.state.cluster import ClusterState


def entry(n: int) -> MemoEntry:
    return MemoEntry(0, 0, np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64))


def test_shape_bound_evicts_least_recent() -> None:
    memo = ScoreMemo(max_shapes=2)
    for shape in ("a", "b", "c"):
        memo.store(shape, entry(4))
    assert len(memo) == 2
    state = ClusterState.from_nodes([make_node(f"n{i}").cpu("4").memory("8Gi").obj() for i in range(4)])
    assert memo.lookup("a", state) == (None, None)  # evicted first


def test_byte_bound_keeps_fewer_shapes_on_large_clusters() -> None:
    # 9 bytes per node per entry (mask + key): 1,000 nodes -> 9,000 bytes; a 20,000-byte budget keeps 2.
    memo = ScoreMemo(max_shapes=512, max_bytes=20_000)
    for shape in range(5):
        memo.store(shape, entry(1_000))
    assert len(memo) == 2


def test_byte_bound_keeps_at_least_the_newest_entry() -> None:
    memo = ScoreMemo(max_shapes=512, max_bytes=10)
    memo.store("a", entry(1_000))
    memo.store("b", entry(1_000))
    assert len(memo) == 1


def test_lookup_marks_an_entry_recent() -> None:
    state = ClusterState.from_nodes([make_node(f"n{i}").cpu("4").memory("8Gi").obj() for i in range(4)])
    memo = ScoreMemo(max_shapes=2)
    position = state.change_position
    for shape in ("a", "b"):
        memo.store(shape, MemoEntry(position, state.nodes_version, np.ones(4, dtype=bool), np.zeros(4, dtype=np.int64)))
    found, dirty = memo.lookup("a", state)
    assert found is not None and dirty is not None and len(dirty) == 0
    memo.store("c", entry(4))
    assert memo.lookup("a", state)[0] is not None  # "b" was the least recent, not "a"
    assert memo.lookup("b", state) == (None, None)
