"""`HashedOnce`: frozen dataclasses that serve as memo keys hash their fields once, not per lookup.

The CPU and NUMA plugins look up several memo tables per decision with small frozen dataclasses
as keys (a node's CPU config, a compiled CPU request, a node's per-NUMA view). The generated
`__hash__` would rebuild and hash the field tuple on every lookup. A class opts in with::

    @dataclass(frozen=True, slots=True)
    class Key(HashedOnce):
        a: int
        _hash: int = field(default=0, init=False, repr=False, compare=False)
        __hash__ = HashedOnce.__hash__  # dataclass would otherwise generate its own

Equality stays the dataclass's (field by field), so equal keys still meet in a dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from operator import attrgetter
from typing import Any


class HashedOnce:
    """Mixin: `_hash` is computed in `__post_init__` from the compared fields (see the module docstring)."""

    __slots__ = ()
    _hash: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(_compared(type(self))(self)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt through __init__, so a copy in another process hashes with that process's seed.
        return (type(self), _compared(type(self))(self))


_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _compared(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """The class's compared fields as one tuple, through a C-level getter built once per class.

    (`attrgetter` of one name returns the bare value: a one-field class gets it wrapped in a tuple,
    so `__reduce__` always passes the fields as the constructor's positional arguments.)
    """
    getter = _GETTERS.get(cls)
    if getter is None:
        names = [f.name for f in fields(cls) if f.compare]
        single = attrgetter(names[0]) if len(names) == 1 else None
        getter = _GETTERS[cls] = (lambda obj: (single(obj),)) if single is not None else attrgetter(*names)
    return getter
