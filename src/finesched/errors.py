"""Errors shared by every user-facing entry point.

A `ValidationError` carries *every* problem found in one input (not just the first), each with
the place it was found (file, document index, field path), the offending value and the rule it
broke, so a user can fix a manifest in one pass. It is a `ValueError`, so callers that only
want "bad input" can catch that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """One problem: where it is, what was there, and which rule it broke."""

    path: str
    message: str
    value: Any = _MISSING
    where: str = ""  # file and document, e.g. "examples/bad.yaml doc 2"

    def __str__(self) -> str:
        location = f"{self.where}: " if self.where else ""
        field = f"{self.path}: " if self.path else ""
        shown = "" if self.value is _MISSING else f"{_show(self.value)} "
        return f"{location}{field}{shown}{self.message}"

    def located(self, where: str, prefix: str = "") -> ErrorDetail:
        """The same problem, placed in a file/document and under a parent field path."""
        path = ".".join(p for p in (prefix, self.path) if p)
        return ErrorDetail(path, self.message, self.value, where or self.where)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class ValidationError(ValueError):
    """Invalid user input; `errors` lists every problem found."""

    def __init__(self, errors: Sequence[ErrorDetail] | str, *, path: str = "", value: Any = _MISSING):
        if isinstance(errors, str):
            errors = [ErrorDetail(path, errors, value)]
        self.errors: list[ErrorDetail] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    @classmethod
    def collect(cls, groups: Iterable[ValidationError]) -> ValidationError:
        """Merge several errors into one that lists all their problems."""
        return cls([detail for group in groups for detail in group.errors])


class InvariantViolation(AssertionError):
    """The cluster state broke a rule that must always hold; `violations` lists every one."""

    def __init__(self, violations: Sequence[object]):
        self.violations = list(violations)
        super().__init__("\n".join(str(v) for v in self.violations))
