"""Every number an object carries is finite and within the range a JSON client can hold exactly.

Models bound the fields that have a natural range (a priority is an int32, a weight a ratio
between 0.001 and 10^6, a NUMA id below 1024); this walk covers all the others at once, so a
field added later is bounded too. Integers (quantities in their canonical unit included) must
lie within ±(2^53 - 1): what a JSON number holds exactly in every client, and small enough that
a cluster's sums of them stay within the int64 arrays of the cluster state. Floats must be
finite: Python's JSON reader turns ``1e400`` into infinity and accepts ``NaN``, and neither can
be stored or answered as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache

from pydantic import BaseModel

from finesched.model.base import FrozenDict
from finesched.model.resources import ResourceVector, resource_kind
from finesched.quantity import format_quantity

#: The largest integer every JSON client holds exactly (2^53 - 1, JavaScript's MAX_SAFE_INTEGER).
MAX_SAFE_INTEGER = 2**53 - 1

Problem = tuple[str, str, object]  # (field path, rule, value)


def number_problems(obj: object, path: str = "") -> list[Problem]:
    """(path, rule, value) for every number of `obj` out of range; paths use the manifest's names."""
    found: list[Problem] = []
    _walk(obj, path, found)
    return found


def _walk(obj: object, path: str, found: list[Problem]) -> None:
    # Cheap cases first: this runs on every workload of every submission.
    if obj is None or isinstance(obj, str | bool | FrozenDict):
        return
    if isinstance(obj, int):
        if abs(obj) > MAX_SAFE_INTEGER:
            found.append((path, f"must be between -{MAX_SAFE_INTEGER} and {MAX_SAFE_INTEGER} (2^53 - 1)", obj))
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            found.append((path, "must be a finite number", str(obj)))
        return
    if isinstance(obj, ResourceVector):
        for name, amount in obj.items():
            if abs(amount) > MAX_SAFE_INTEGER:
                kind = resource_kind(name)
                limit = format_quantity(MAX_SAFE_INTEGER, kind)
                shown = format_quantity(amount, kind) if amount >= 0 else str(amount)
                found.append((_join(path, name), f"is too large: at most {limit} (2^53 - 1 in its unit)", shown))
        return
    if isinstance(obj, BaseModel):
        aliases = _aliases(type(obj))
        for name, value in obj.__dict__.items():
            if value is not None and not isinstance(value, str | bool):
                _walk(value, _join(path, aliases.get(name, name)), found)
        return
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            _walk(value, _join(path, str(key)), found)
        return
    if isinstance(obj, tuple | list | frozenset | set):
        for i, value in enumerate(obj):
            _walk(value, f"{path}[{i}]", found)


@cache
def _aliases(model: type[BaseModel]) -> dict[str, str]:
    """A model's field names as manifests spell them."""
    return {name: info.alias or name for name, info in model.model_fields.items()}


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
