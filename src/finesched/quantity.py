"""Kubernetes resource quantities ("500m", "16Gi", "1e3") read and written as exact integers.

Users write amounts the way Kubernetes manifests do, so we accept exactly the grammar of
``k8s.io/apimachinery/pkg/api/resource.Quantity``::

    <quantity> ::= [+|-] <number> [<suffix>]
    <number>   ::= <digits> | <digits>. | <digits>.<digits> | .<digits>
    <suffix>   ::= n | u | m | "" | k | M | G | T | P | E        (powers of 1000)
                 | Ki | Mi | Gi | Ti | Pi | Ei                     (powers of 1024)
                 | (e | E) [+|-] <digits>                          (a power of ten)

Inside finesched every amount is an integer in one of three units (a *kind*):

* ``"cpu"``: millicores. Like Kubernetes' ``MilliValue()``, a non-zero amount below the millicore
  grid rounds *up* ("if you ask for some, you get some"): ``"0.0001"`` and ``"1n"`` are 1m.
* ``"bytes"``: bytes; a fractional byte rounds up, as ``Value()`` does.
* ``"count"``: a whole number of things (pods, devices). Kubernetes would round ``"1.5"`` pods up
  to 2; we refuse it instead, because a fractional count in a manifest is always a typo.

The arithmetic is exact (integers only, never floats), and magnitude is checked *before* any
power of ten is built, so ``"1e1000000"`` fails at once instead of allocating a million digits.
Like Kubernetes we cap amounts at 2**63-1 (in the kind's unit), but we reject larger ones
instead of silently clamping them.

Where Kubernetes' hand-written scanner is laxer than its own grammar, we follow the grammar
(and the OpenAPI pattern Kubernetes publishes): ``"."``, ``"-"`` and ``"+"`` alone are errors
here, although ``ParseQuantity`` reads them as zero.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from typing import Final

__all__ = ["KINDS", "MAX_QUANTITY", "QuantityError", "format_quantity", "human_quantity", "parse_quantity"]

KINDS: Final = ("cpu", "bytes", "count")

#: The largest amount of any kind, in the kind's unit (Kubernetes quantities are int64).
MAX_QUANTITY: Final = 2**63 - 1

_UNIT_NAME: Final = {"cpu": "millicores", "bytes": "bytes", "count": ""}
# Power of ten from the user's unit (cores, bytes, things) to the stored unit.
_UNIT_EXP10: Final = {"cpu": 3, "bytes": 0, "count": 0}

# Decimal suffix -> power of ten (n=-9, u=-6 ... E=18); binary suffix -> power of two (Ki=10 ... Ei=60).
_DECIMAL_NAMES: Final = ("n", "u", "m", "", "k", "M", "G", "T", "P", "E")
_DECIMAL_SUFFIXES: Final = dict(zip(_DECIMAL_NAMES, range(-9, 19, 3), strict=True))
_BINARY_SUFFIXES: Final = dict(zip(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), range(10, 61, 10), strict=True))

_EXPECTED: Final = (
    "expected a number with an optional suffix (n, u, m, k, M, G, T, P, E, Ki..Ei or an exponent like e3)"
)
_SUFFIX_RULE: Final = "expected one of n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent like e3"
_NUMBER: Final = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?")
_EXPONENT: Final = re.compile(r"[eE]([+-]?)([0-9]+)")
# Go's strconv.ParseInt(.., 64) refuses longer exponents, so Kubernetes does too.
_MAX_EXPONENT_DIGITS: Final = 18
# 10**19 > MAX_QUANTITY, and anything below 10**-20 stays below 1 even times 2**60 (Ei).
_HUGE_DIGITS: Final = 19
_TINY_DIGITS: Final = -20
# int(str) refuses more than 4300 digits (CPython's DoS guard); convert longer strings in chunks.
_CHUNK: Final = 4000


class QuantityError(ValueError):
    """A quantity that cannot be read; the message names the text and the rule it broke.

    Deliberately a plain `ValueError` subclass without a field path: the manifest layer knows
    where the text came from and wraps this message with it.
    """


def parse_quantity(text: str | int | float, kind: str, *, allow_negative: bool = False) -> int:
    """Read a Kubernetes quantity as an integer amount of `kind` (see the module docstring).

    `text` may also be an int or float, because YAML turns ``cpu: 4`` and ``cpu: 0.5`` into
    numbers. A float is read through its shortest repr ("0.1", not 0.1000000000000000055...), which
    is the decimal the user wrote, so ``0.5`` cpu is exactly 500 millicores.

    Resource amounts are never negative, so a leading ``-`` is refused unless `allow_negative`
    (used for deltas); negative amounts round away from zero, mirroring Kubernetes' rounding
    of the magnitude.
    """
    _check_kind(kind)
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity: expected a string or a number, not a boolean")
    if isinstance(text, str):
        return _parse_text(text, _show(text), kind, allow_negative)
    if isinstance(text, numbers.Integral):
        return _from_int(int(text), kind, allow_negative)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a quantity: it must be a finite number")
        return _parse_text(repr(text), repr(text), kind, allow_negative)
    raise QuantityError(f"{_show(text)} is not a quantity: expected a string or a number, got {type(text).__name__}")


def format_quantity(value: int, kind: str) -> str:
    """The shortest exact quantity string for `value` (an amount of `kind`).

    Candidates follow Kubernetes' canonical form: an integer mantissa (never a decimal point or
    an exponent) and a suffix. Among the candidates that are exact, the shortest wins:

    * cpu: ``"<n>m"`` or whole cores with a decimal suffix: 500 -> "500m", 1000 -> "1",
      1500 -> "1500m" (not "1.5": no fractions), 2_000_000 -> "2k".
    * bytes: decimal or binary suffix: 17179869184 -> "16Gi", 1000000 -> "1M",
      1024000 -> "1024k" (shorter than "1000Ki"). On a tie in length the binary suffix wins,
      because memory sizes are usually powers of two.
    * count: decimal suffix only: 110 -> "110", 1000 -> "1k".

    Zero is "0". A negative value gets a leading "-" and parses back with ``allow_negative``.
    ``parse_quantity(format_quantity(v, kind), kind) == v`` for every ``0 <= v <= MAX_QUANTITY``.
    """
    _check_kind(kind)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"format_quantity needs an int amount, got {type(value).__name__} {value!r}")
    if abs(value) > MAX_QUANTITY:
        raise _too_large(str(value), kind)
    if value < 0:
        return "-" + format_quantity(-value, kind)
    if kind == "cpu":
        candidates = [f"{value}m"]
        if value % 1000 == 0:
            candidates += _decimal_forms(value // 1000)
    elif kind == "bytes":
        candidates = _binary_forms(value) + _decimal_forms(value)  # binary first: it wins ties
    else:
        candidates = _decimal_forms(value)
    return min(candidates, key=len)  # min() keeps the first of equally short candidates


def human_quantity(value: int, kind: str) -> str:
    """An amount as every human view shows it (CLI tables, describe, event text, the console).

    Kubernetes' forms, and only two rules to learn:

    * cpu: whole cores as a plain number, anything else in millicores, as ``kubectl describe``
      writes them: 4000 -> "4", 500 -> "500m", 1500 -> "1500m".
    * bytes: below 1Ki the number itself; else the largest binary suffix (Ki, Mi, Gi, Ti, Pi, Ei)
      under which the amount is at least 1. A whole number is exact ("16Gi", "1Ki"); anything
      else is rounded half up to one decimal and always shows that decimal ("1.5Gi", "9.6Gi",
      "10.0Gi" for 10Gi less a byte), so a whole number never hides a remainder. A rounding that
      reaches 1024 moves to the next suffix ("1.0Mi", never "1024.0Ki").
    * count: the number itself.

    Zero is "0"; a negative amount (a delta) gets a leading "-". Exact integers stay in the
    ``-o json|yaml`` outputs and the API; this is for reading at a glance. The console's
    ``quantity()`` (server/console/static/dom.js) follows the same rules, checked against the same
    table (tests/test_quantity_views.py).
    """
    _check_kind(kind)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"human_quantity needs an int amount, got {type(value).__name__} {value!r}")
    if value < 0:
        return "-" + human_quantity(-value, kind)
    if kind == "cpu":
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if kind == "count" or value < 1024:
        return str(value)
    names = tuple(_BINARY_SUFFIXES)
    unit = min((value.bit_length() - 1) // 10, len(names)) - 1  # the largest 1024**(unit+1) <= value
    while True:
        scale = 1 << (10 * (unit + 1))
        if value % scale == 0:
            return f"{value // scale}{names[unit]}"
        tenths = (value * 20 + scale) // (2 * scale)  # round(value * 10 / scale), halves up
        if tenths < 10240 or unit == len(names) - 1:
            return f"{tenths // 10}.{tenths % 10}{names[unit]}"
        unit += 1


def _decimal_forms(n: int) -> list[str]:
    return [f"{n // 10**e}{s}" for s, e in _DECIMAL_SUFFIXES.items() if e >= 0 and n % 10**e == 0]


def _binary_forms(n: int) -> list[str]:
    return [f"{n >> e}{s}" for s, e in _BINARY_SUFFIXES.items() if n % (1 << e) == 0]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown quantity kind {kind!r}: expected one of {', '.join(KINDS)}")


def _show(value: object) -> str:
    """The offending input as it should appear in a message: quoted, escaped, not too long."""
    if not isinstance(value, str):
        return repr(value)
    shown = json.dumps(value, ensure_ascii=False)
    return shown if len(shown) <= 60 else shown[:56] + '..."'


def _from_int(value: int, kind: str, allow_negative: bool) -> int:
    if value < 0 and not allow_negative:
        raise QuantityError(f"{value} must not be negative")
    result = value * 10 ** _UNIT_EXP10[kind]
    if abs(result) > MAX_QUANTITY:
        raise _too_large(repr(value), kind)
    return result


def _parse_text(text: str, shown: str, kind: str, allow_negative: bool) -> int:
    for pos, char in enumerate(text):
        if char.isspace():
            raise QuantityError(f"{shown} is not a quantity: whitespace at position {pos} is not allowed")
    number = _NUMBER.match(text)
    assert number is not None  # every part of the pattern is optional
    sign, whole, frac = number.group(1), number.group(2), number.group(3) or ""
    if not whole and not frac:
        raise QuantityError(f"{shown} is not a quantity: {_EXPECTED}")
    exp10, exp2 = _suffix(text, number.end(), shown)
    return _to_units(sign == "-", whole, frac, exp10, exp2, kind, shown, allow_negative)


def _suffix(text: str, pos: int, shown: str) -> tuple[int, int]:
    """The suffix starting at `pos` as (power of ten, power of two)."""
    suffix = text[pos:]
    if suffix in _DECIMAL_SUFFIXES:
        return _DECIMAL_SUFFIXES[suffix], 0
    if suffix in _BINARY_SUFFIXES:
        return 0, _BINARY_SUFFIXES[suffix]
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is not None:
        digits = exponent.group(2).lstrip("0") or "0"
        if len(digits) > _MAX_EXPONENT_DIGITS:
            raise QuantityError(f"{shown} has an exponent that is out of range at position {pos}")
        return int(exponent.group(1) + digits), 0
    head = suffix[0]
    if head in "eE" and (len(suffix) == 1 or suffix[1] in "+-.0123456789"):
        raise QuantityError(
            f"{shown} has a malformed exponent {_show(suffix)} at position {pos}: "
            "expected e or E followed by a whole number, like e3 or E-3"
        )
    if head.isascii() and head.isalpha():
        raise QuantityError(f"{shown} has an unknown suffix {_show(suffix)} at position {pos}; {_SUFFIX_RULE}")
    raise QuantityError(f"{shown} is not a quantity: unexpected {_show(head)} at position {pos}; {_EXPECTED}")


def _to_units(
    negative: bool, whole: str, frac: str, exp10: int, exp2: int, kind: str, shown: str, allow_negative: bool
) -> int:
    """|value| = int(whole + frac) * 10**(exp10 - len(frac)) * 2**exp2, rounded up to the unit."""
    digits = (whole + frac).lstrip("0")
    if not digits:
        return 0  # "-0" is zero, not negative
    if negative and not allow_negative:
        raise QuantityError(f"{shown} must not be negative")
    significant = digits.rstrip("0")
    exp10 += _UNIT_EXP10[kind] - len(frac) + (len(digits) - len(significant))
    # The value (before the factor 2**exp2) lies in [10**(order-1), 10**order).
    order = len(significant) + exp10
    if order - 1 >= _HUGE_DIGITS:
        raise _too_large(shown, kind)
    if order < _TINY_DIGITS:
        magnitude, exact = 1, False  # non-zero but far below one unit: rounds up to 1
    else:
        scaled = _digits_to_int(significant) << exp2
        if exp10 >= 0:
            magnitude, remainder = scaled * 10**exp10, 0
        else:
            magnitude, remainder = divmod(scaled, 10**-exp10)
        exact = remainder == 0
        magnitude += not exact
    if kind == "count" and not exact:
        raise QuantityError(f"{shown} is not a whole count: counts (pods, devices...) must be whole numbers")
    if magnitude > MAX_QUANTITY:
        raise _too_large(shown, kind)
    return -magnitude if negative else magnitude


def _digits_to_int(digits: str) -> int:
    if len(digits) <= _CHUNK:
        return int(digits)
    value = 0
    for start in range(0, len(digits), _CHUNK):
        chunk = digits[start : start + _CHUNK]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def _too_large(shown: str, kind: str) -> QuantityError:
    unit = f" {_UNIT_NAME[kind]}" if _UNIT_NAME[kind] else ""
    return QuantityError(f"{shown} is too large: the maximum is {MAX_QUANTITY}{unit} (a 64-bit integer)")
