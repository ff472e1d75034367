"""`CPUSet`: an immutable set of logical CPU ids that reads and writes the Linux cpulist format.

Pinned-CPU scheduling hands out exact CPU ids, and every tool in that chain (the kernel's
``cpuset.cpus``, ``/sys/devices/system/cpu/online``, kubelet's CPU manager state) writes them
as a *cpulist* such as ``"0-3,8,10-11"``. Keeping the set immutable and hashable lets bindings
and node snapshots share it freely and use it as a dict key.

Formatting follows kubelet's ``cpuset.CPUSet.String()``: ascending, every run of two or more
consecutive ids as ``a-b`` (so ``{0, 1}`` is ``"0-1"``, not ``"0,1"``), the empty set as ``""``.
Parsing follows kubelet's ``cpuset.Parse`` and, like the kernel, tolerates whitespace around
items (sysfs files end with a newline). The kernel's stride form ``0-7:2/4`` is not accepted.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from pydantic_core import CoreSchema, core_schema

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue

__all__ = ["MAX_CPU_ID", "CPUSet"]

#: The largest CPU id we accept. Linux builds for at most 8192 CPUs (NR_CPUS); the cap is far
#: above that but stops a typo like "0-4000000000" from building a set of four billion ids.
MAX_CPU_ID: Final = 65535

_DIGITS: Final = re.compile(r"[0-9]+")


class CPUSet:
    """An immutable, hashable set of logical CPU ids (ints >= 0), iterated in ascending order.

    ``CPUSet()`` is empty; ``CPUSet([0, 1, 2])`` takes ids; ``CPUSet("0-2")`` parses a cpulist,
    so ``repr`` (``CPUSet("0-2")``) evaluates back to an equal set.
    """

    __slots__ = ("_ids",)
    _ids: frozenset[int]

    def __init__(self, ids: Iterable[int] | str = ()) -> None:
        if isinstance(ids, CPUSet):
            frozen = ids._ids
        elif isinstance(ids, str):
            frozen = CPUSet.parse(ids)._ids
        else:
            frozen = frozenset(_check_id(cpu, index) for index, cpu in enumerate(ids))
        object.__setattr__(self, "_ids", frozen)

    @classmethod
    def from_ids(cls, *ids: int) -> CPUSet:
        """``CPUSet.from_ids(0, 2, 3)``: the ids as arguments."""
        return cls(ids)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Read a Linux cpulist (``"0-3,8,10-11"``); empty or blank text is the empty set.

        Raises `ValueError` naming the text, the character offset of the problem and the rule.
        """
        if not isinstance(text, str):
            raise ValueError(f'a cpulist is a string like "0-3,8", got {type(text).__name__} {text!r}')
        if not text.strip():
            return cls()
        ids: set[int] = set()
        offset = 0
        for item in text.split(","):
            lo, hi = _parse_item(text, item, offset)
            ids.update(range(lo, hi + 1))
            offset += len(item) + 1
        return _wrap(frozenset(ids))

    # Views ------------------------------------------------------------------------------------
    def format(self) -> str:
        """The canonical cpulist: ascending, runs of 2+ consecutive ids as ``a-b``."""
        parts: list[str] = []
        ids = self.sorted()
        start = 0
        for end in range(len(ids)):
            if end + 1 == len(ids) or ids[end + 1] != ids[end] + 1:
                first, last = ids[start], ids[end]
                parts.append(str(first) if first == last else f"{first}-{last}")
                start = end + 1
        return ",".join(parts)

    def sorted(self) -> list[int]:
        """The ids in ascending order."""
        return sorted(self._ids)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f'CPUSet("{self.format()}")'

    def __iter__(self) -> Iterator[int]:
        return iter(self.sorted())

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __contains__(self, cpu: object) -> bool:
        return not isinstance(cpu, bool) and cpu in self._ids

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CPUSet):
            return self._ids == other._ids
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._ids)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("CPUSet is immutable")

    def __reduce__(self) -> tuple[type[CPUSet], tuple[list[int]]]:
        # The default slot-based pickling would go through the blocked __setattr__.
        return (CPUSet, (self.sorted(),))

    # Algebra: operators take CPUSets (like frozenset's take sets); methods take any ids -----------
    def __or__(self, other: CPUSet) -> CPUSet:
        return _wrap(self._ids | other._ids) if isinstance(other, CPUSet) else NotImplemented

    def __and__(self, other: CPUSet) -> CPUSet:
        return _wrap(self._ids & other._ids) if isinstance(other, CPUSet) else NotImplemented

    def __sub__(self, other: CPUSet) -> CPUSet:
        return _wrap(self._ids - other._ids) if isinstance(other, CPUSet) else NotImplemented

    def __xor__(self, other: CPUSet) -> CPUSet:
        return _wrap(self._ids ^ other._ids) if isinstance(other, CPUSet) else NotImplemented

    def union(self, *others: Iterable[int] | str) -> CPUSet:
        return _wrap(self._ids.union(*(CPUSet(o)._ids for o in others)))

    def intersection(self, *others: Iterable[int] | str) -> CPUSet:
        return _wrap(self._ids.intersection(*(CPUSet(o)._ids for o in others)))

    def difference(self, *others: Iterable[int] | str) -> CPUSet:
        return _wrap(self._ids.difference(*(CPUSet(o)._ids for o in others)))

    def symmetric_difference(self, other: Iterable[int] | str) -> CPUSet:
        return _wrap(self._ids ^ CPUSet(other)._ids)

    def is_subset(self, other: Iterable[int] | str) -> bool:
        """True when every id here is also in `other`."""
        return self._ids <= CPUSet(other)._ids

    def is_superset(self, other: Iterable[int] | str) -> bool:
        """True when every id of `other` is also here."""
        return self._ids >= CPUSet(other)._ids

    def is_disjoint(self, other: Iterable[int] | str) -> bool:
        """True when no id is in both."""
        return self._ids.isdisjoint(CPUSet(other)._ids)

    # frozenset spellings, so a CPUSet reads like the set it is.
    issubset = is_subset
    issuperset = is_superset
    isdisjoint = is_disjoint

    # pydantic v2 -------------------------------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Accept a cpulist string, a list of ids or a CPUSet; always dump the cpulist string."""
        return core_schema.no_info_plain_validator_function(
            _from_field, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"type": "string", "description": "Linux cpulist of logical CPU ids", "examples": ["0-3,8"]}


def _wrap(ids: frozenset[int]) -> CPUSet:
    """A CPUSet around ids that are already valid (the result of algebra on CPUSets)."""
    out = CPUSet.__new__(CPUSet)
    object.__setattr__(out, "_ids", ids)
    return out


def _check_id(cpu: object, index: int) -> int:
    if type(cpu) is int and 0 <= cpu <= MAX_CPU_ID:  # the common case, without the ABC check
        return cpu
    if isinstance(cpu, bool) or not isinstance(cpu, numbers.Integral):
        raise ValueError(f"CPU id at index {index} is {cpu!r} ({type(cpu).__name__}); CPU ids are ints")
    value = int(cpu)
    if value < 0:
        raise ValueError(f"CPU id at index {index} is {value}; CPU ids must not be negative")
    if value > MAX_CPU_ID:
        raise ValueError(f"CPU id at index {index} is {value}; the maximum is {MAX_CPU_ID}")
    return value


def _parse_item(text: str, item: str, offset: int) -> tuple[int, int]:
    """One comma-separated item at `offset` of `text`, as an inclusive range (lo, hi)."""

    def fail(pos: int, rule: str) -> ValueError:
        shown = json.dumps(text, ensure_ascii=False)
        shown = shown if len(shown) <= 60 else shown[:56] + '..."'
        return ValueError(f"invalid cpulist {shown} at position {pos}: {rule}")

    body = item.strip()
    at = offset + len(item) - len(item.lstrip())
    if not body:
        raise fail(offset, "empty item (two commas in a row, or a comma at an end)")
    if body.startswith("-"):
        raise fail(at, "CPU ids must not be negative")
    first_dash = body.find("-")
    if first_dash < 0:
        cpu = _parse_id(body, at, fail)
        return cpu, cpu
    second_dash = body.find("-", first_dash + 1)
    if second_dash >= 0:
        raise fail(at + second_dash, f"a range has one '-', as in 0-3; got {_clip(body)}")
    end_text = body[first_dash + 1 :]
    end_at = at + first_dash + 1
    if not end_text.strip():
        raise fail(end_at, f"range {_clip(body)} has no end")
    lo = _parse_id(body[:first_dash], at, fail)
    hi = _parse_id(end_text, end_at + len(end_text) - len(end_text.lstrip()), fail)
    if hi < lo:
        raise fail(at, f"range {_clip(body)} ends before it starts ({hi} < {lo})")
    return lo, hi


def _clip(token: str) -> str:
    """`token` quoted for a message, shortened so a huge input is not echoed whole."""
    return repr(token if len(token) <= 30 else token[:27] + "...")


def _parse_id(token: str, at: int, fail: Callable[[int, str], ValueError]) -> int:
    digits = token.strip()
    if not _DIGITS.fullmatch(digits):
        raise fail(at, f"{_clip(digits)} is not a CPU id (a non-negative decimal integer)")
    if len(digits.lstrip("0")) > len(str(MAX_CPU_ID)) or int(digits) > MAX_CPU_ID:
        raise fail(at, f"CPU id {_clip(digits)} is above the maximum {MAX_CPU_ID}")
    return int(digits)


def _from_field(value: object) -> CPUSet:
    """pydantic validator: a ValueError here becomes a pydantic ValidationError with the message."""
    if isinstance(value, CPUSet):
        return value
    if isinstance(value, str):
        return CPUSet.parse(value)
    if isinstance(value, list | tuple | set | frozenset | range):
        return CPUSet(value)
    raise ValueError(
        f'expected a cpulist string like "0-3,8", a list of CPU ids or a CPUSet, got {type(value).__name__}'
    )
