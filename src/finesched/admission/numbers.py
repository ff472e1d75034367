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
from collections.abc import Iterator, Mapping

from pydantic import BaseModel

from finesched.model.resources import ResourceVector, resource_kind
from finesched.quantity import format_quantity

#: The largest integer every JSON client holds exactly (2^53 - 1, JavaScript's MAX_SAFE_INTEGER).
MAX_SAFE_INTEGER = 2**53 - 1

Problem = tuple[str, str, object]  # (field path, rule, value)


def number_problems(obj: object, path: str = "") -> list[Problem]:
    """(path, rule, value) for every number of `obj` out of range; paths use the manifest's names."""
    return list(_walk(obj, path))


def _walk(obj: object, path: str) -> Iterator[Problem]:
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, int):
        if abs(obj) > MAX_SAFE_INTEGER:
            yield path, f"must be between -{MAX_SAFE_INTEGER} and {MAX_SAFE_INTEGER} (2^53 - 1)", obj
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            yield path, "must be a finite number", str(obj)
        return
    if isinstance(obj, ResourceVector):
        for name, amount in obj.items():
            if abs(amount) > MAX_SAFE_INTEGER:
                kind = resource_kind(name)
                limit = format_quantity(MAX_SAFE_INTEGER, kind)
                shown = format_quantity(amount, kind) if amount >= 0 else str(amount)
                yield _join(path, name), f"is too large: at most {limit} (2^53 - 1 in its unit)", shown
        return
    if isinstance(obj, BaseModel):
        for name, info in type(obj).model_fields.items():
            yield from _walk(getattr(obj, name), _join(path, info.alias or name))
        return
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _walk(value, _join(path, str(key)))
        return
    if isinstance(obj, tuple | list | frozenset | set):
        for i, value in enumerate(obj):
            yield from _walk(value, f"{path}[{i}]")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
