"""Node labels as integer-coded numpy columns, so a node selector is a few vectorized compares.

Each label key gets an int32 column over nodes holding a code per distinct value (-1 = the node
lacks the key). ``match({"zone": "a", "gpu-model": "A100"})`` ANDs one compare per key. Masks per
``(key, value)`` are cached until a label changes, since selectors repeat across workloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]
ABSENT = -1


class LabelIndex:
    """Integer-coded label columns over node slots (see the module docstring)."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._codes: dict[str, dict[str, int]] = {}
        self._columns: dict[str, npt.NDArray[np.int32]] = {}
        self._cache: dict[tuple[str, str], BoolArray] = {}

    def resize(self, capacity: int) -> None:
        for key, column in self._columns.items():
            grown = np.full(capacity, ABSENT, dtype=np.int32)
            grown[: min(capacity, column.size)] = column[:capacity]
            self._columns[key] = grown
        self._capacity = capacity
        self._cache.clear()

    def set(self, i: int, labels: Mapping[str, str]) -> None:
        for column in self._columns.values():
            column[i] = ABSENT
        for key, value in labels.items():
            column = self._columns.get(key)
            if column is None:
                column = self._columns[key] = np.full(self._capacity, ABSENT, dtype=np.int32)
                self._codes[key] = {}
            codes = self._codes[key]
            column[i] = codes.setdefault(value, len(codes))
        self._cache.clear()

    def move(self, src: int, dst: int) -> None:
        for column in self._columns.values():
            column[dst] = column[src]
        self._cache.clear()

    def clear(self, i: int) -> None:
        for column in self._columns.values():
            column[i] = ABSENT
        self._cache.clear()

    def match(self, selector: Mapping[str, str], n: int) -> BoolArray:
        """[n] True where the node has every ``key: value`` of `selector`."""
        mask: BoolArray | None = None
        for key, value in selector.items():
            part = self._match_one(key, value, n)
            mask = part if mask is None else mask & part
        return np.ones(n, dtype=bool) if mask is None else mask

    def match_in(self, key: str, values: Iterable[str], n: int) -> BoolArray:
        """[n] True where the node has `key` with one of `values` (Kubernetes operator In)."""
        mask = np.zeros(n, dtype=bool)
        for value in values:
            mask |= self._match_one(key, value, n)
        return mask

    def has_key(self, key: str, n: int) -> BoolArray:
        """[n] True where the node has label `key` (operator Exists)."""
        column = self._columns.get(key)
        return np.zeros(n, dtype=bool) if column is None else column[:n] != ABSENT

    def _match_one(self, key: str, value: str, n: int) -> BoolArray:
        cached = self._cache.get((key, value))
        if cached is not None and cached.size == n:
            return cached
        code = self._codes.get(key, {}).get(value)
        column = self._columns.get(key)
        if code is None or column is None:
            mask = np.zeros(n, dtype=bool)
        else:
            mask = column[:n] == code
        self._cache[(key, value)] = mask
        return mask

    def values_of(self, key: str) -> list[str]:
        """Every value `key` has on some node, in first-seen order."""
        return list(self._codes.get(key, {}))

    def column(self, key: str, n: int) -> npt.NDArray[np.int32]:
        """[n] codes of `key` (-1 where absent); decode with `values_of`."""
        column = self._columns.get(key)
        return np.full(n, ABSENT, dtype=np.int32) if column is None else column[:n]

    def snapshot(self) -> object:
        return ({k: dict(v) for k, v in self._codes.items()}, {k: c.copy() for k, c in self._columns.items()})

    def restore(self, snapshot: object, capacity: int) -> None:
        codes, columns = snapshot  # type: ignore[misc]
        self._codes = {k: dict(v) for k, v in codes.items()}
        self._columns = {k: c.copy() for k, c in columns.items()}
        self._capacity = max(c.size for c in self._columns.values()) if self._columns else self._capacity
        self.resize(capacity)
