"""Per-cycle data that plugins compute once and read many times, under typed keys.

The Kubernetes rule: a value is written once (pre_filter, pre_score or reserve) and afterwards
only read. Keys carry the value's type, and `read` checks it, so a plugin that forgot its
pre_filter or stored the wrong thing gets a clear error, never a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: (kind, class) -> whether a value of that class is of that kind. A runtime-checkable Protocol's
#: isinstance walks the protocol's members on every call (~7 µs on Python 3.11, once per FGD
#: cycle); for a protocol whose members are all methods the verdict is the class's, asked once.
_CLASS_VERDICTS: dict[tuple[Any, type], bool] = {}


def _is_kind(value: object, kind: type | tuple[type, ...]) -> bool:
    cls = type(value)
    verdict = _CLASS_VERDICTS.get((kind, cls))
    if verdict is None:
        try:
            verdict = issubclass(cls, kind)
        except TypeError:  # a Protocol with data members: only the instance can answer
            return isinstance(value, kind)
        _CLASS_VERDICTS[(kind, cls)] = verdict
    return verdict


class MissingState(KeyError):
    """A plugin read a key nobody wrote in this cycle."""


@dataclass(frozen=True, slots=True)
class StateKey(Generic[T]):
    """A typed key: ``StateKey("ResourcesFit/request", ScalarRequest)``; name reads "<Plugin>/<what>"."""

    name: str
    kind: type[T] | tuple[type, ...]


class CycleState:
    """Key -> value store for one scheduling cycle (one workload).

    Values are stored under the key's name (names are unique, "<Plugin>/<what>"): a cycle reads
    keys a few dozen times per decision, and a str hashes once and for all where the frozen
    dataclass key would build and hash a tuple on every lookup. `write` checks the kind.
    """

    __slots__ = ("_data", "plugins", "skipped")

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        #: The plugins whose pre_filter returned SKIP in this cycle (set by the framework's
        #: run_pre_filter; read by its reserve and pre_bind, sched/runtime.py `Framework.active`).
        self.skipped: set[str] | frozenset[str] = frozenset()
        #: The framework's (reserve, pre_bind) plugin lists for this cycle, once it has looked.
        self.plugins: tuple[list[Any], list[Any]] | None = None

    def write(self, key: StateKey[T], value: T) -> None:
        if not _is_kind(value, key.kind):
            raise TypeError(f"{key.name}: expected {key.kind}, got {type(value).__name__}")
        self._data[key.name] = value

    def read(self, key: StateKey[T]) -> T:
        try:
            return self._data[key.name]  # type: ignore[no-any-return]  # (no runtime cast on the hot path)
        except KeyError:
            raise MissingState(f"{key.name}: nothing stored; did its pre_filter/pre_score run?") from None

    def get(self, key: StateKey[T], default: T | None = None) -> T | None:
        return self._data.get(key.name, default)  # type: ignore[no-any-return]

    def delete(self, key: StateKey[Any]) -> None:
        self._data.pop(key.name, None)

    def __contains__(self, key: StateKey[Any]) -> bool:
        return key.name in self._data

    def clone(self) -> CycleState:
        """A shallow copy: values are frozen or never mutated after writing."""
        other = CycleState()
        other._data = dict(self._data)
        other.skipped, other.plugins = self.skipped, self.plugins
        return other
