"""Kubernetes quantities: parsing to exact integers, shortest formatting, and clear errors."""

from __future__ import annotations

import contextlib
import math
import time
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from finesched.quantity import KINDS, MAX_QUANTITY, QuantityError, format_quantity, parse_quantity

# Every value must also round-trip for this kind, so the table below doubles as a spec.
PARSE_CASES = [
    # --- cpu: millicores; anything below 1m rounds up, as Kubernetes' MilliValue() does.
    pytest.param("500m", "cpu", 500, id="cpu-milli"),  # 500 * 10^-3 cores = 500m
    pytest.param("1", "cpu", 1000, id="cpu-one-core"),  # 1 core = 1000m
    pytest.param("1.5", "cpu", 1500, id="cpu-fraction"),  # 1.5 * 1000 = 1500m
    pytest.param(".5", "cpu", 500, id="cpu-leading-dot"),  # 0.5 * 1000 = 500m
    pytest.param("5.", "cpu", 5000, id="cpu-trailing-dot"),  # 5 * 1000 = 5000m
    pytest.param("+2", "cpu", 2000, id="cpu-plus-sign"),  # a leading + is allowed
    pytest.param("0", "cpu", 0, id="cpu-zero"),
    pytest.param("-0", "cpu", 0, id="cpu-minus-zero"),  # zero is not negative
    pytest.param("0.0001", "cpu", 1, id="cpu-round-up"),  # 0.1m -> ceil -> 1m
    pytest.param("1n", "cpu", 1, id="cpu-nano-round-up"),  # 10^-9 cores = 10^-6 m -> 1m
    pytest.param("1500000n", "cpu", 2, id="cpu-nano-ceil"),  # 1.5e6 * 10^-9 * 1000 = 1.5m -> 2m
    pytest.param("250u", "cpu", 1, id="cpu-micro"),  # 250 * 10^-6 * 1000 = 0.25m -> 1m
    pytest.param("1E-3", "cpu", 1, id="cpu-exponent-negative"),  # 10^-3 cores = 1m exactly
    pytest.param("1e-3", "cpu", 1, id="cpu-exponent-lower"),
    pytest.param("2.5e2", "cpu", 250000, id="cpu-exponent-fraction"),  # 250 cores = 250000m
    pytest.param("1e+1", "cpu", 10000, id="cpu-exponent-plus"),  # 10 cores
    pytest.param("2k", "cpu", 2000000, id="cpu-kilo"),  # 2000 cores
    pytest.param("1e-1000000", "cpu", 1, id="cpu-tiny-exponent"),  # non-zero, so at least 1m
    pytest.param("0.0e1000000", "cpu", 0, id="cpu-zero-huge-exponent"),  # 0 * anything = 0
    pytest.param(4, "cpu", 4000, id="cpu-int"),  # YAML `cpu: 4`
    pytest.param(0.5, "cpu", 500, id="cpu-float"),  # YAML `cpu: 0.5`; repr "0.5" is exact
    pytest.param(0.1, "cpu", 100, id="cpu-float-repr"),  # repr "0.1", not 0.1000000000000000055...
    pytest.param(1e-05, "cpu", 1, id="cpu-float-exponent"),  # repr "1e-05" = 0.01m -> 1m
    # --- bytes: fractional bytes round up (Value()).
    pytest.param("16Gi", "bytes", 17179869184, id="bytes-gi"),  # 16 * 2^30
    pytest.param("1.5Gi", "bytes", 1610612736, id="bytes-fractional-gi"),  # 1.5 * 1073741824
    pytest.param("2k", "bytes", 2000, id="bytes-kilo"),  # 2 * 10^3
    pytest.param("1M", "bytes", 1000000, id="bytes-mega"),
    pytest.param("1Ki", "bytes", 1024, id="bytes-ki"),
    pytest.param("1Ei", "bytes", 1152921504606846976, id="bytes-ei"),  # 2^60
    pytest.param("1E", "bytes", 10**18, id="bytes-exa-not-exponent"),  # bare E is the exa suffix
    pytest.param("1e3", "bytes", 1000, id="bytes-exponent"),
    pytest.param("0.5", "bytes", 1, id="bytes-half-rounds-up"),  # 0.5 B -> 1 B
    pytest.param("1500m", "bytes", 2, id="bytes-milli-rounds-up"),  # 1.5 B -> 2 B
    pytest.param("0.001Ki", "bytes", 2, id="bytes-tiny-binary"),  # 1.024 B -> 2 B
    pytest.param("7.999999999999999999Ei", "bytes", 2**63 - 1, id="bytes-near-max"),
    # 7.999999999999999999 * 2^60 = 8*2^60 - 10^-18*2^60 = 2^63 - 1.1529... -> ceil = 2^63 - 1
    pytest.param("9223372036854775807", "bytes", MAX_QUANTITY, id="bytes-max"),
    # --- count: whole numbers only.
    pytest.param("100", "count", 100, id="count-plain"),
    pytest.param("1e3", "count", 1000, id="count-exponent"),  # 1 * 10^3
    pytest.param("1000m", "count", 1, id="count-whole-milli"),  # 1000 * 10^-3 = 1 exactly
    pytest.param("2.0", "count", 2, id="count-whole-fraction"),
    pytest.param("1k", "count", 1000, id="count-kilo"),
    pytest.param(8, "count", 8, id="count-int"),
    pytest.param(3.0, "count", 3, id="count-float-whole"),
]


@pytest.mark.parametrize(("text", "kind", "expected"), PARSE_CASES)
def test_parse(text: str | int | float, kind: str, expected: int) -> None:
    assert parse_quantity(text, kind) == expected


NEGATIVE_CASES = [
    pytest.param("-1", "cpu", -1000, id="cpu"),
    pytest.param("-0.0001", "cpu", -1, id="cpu-rounds-away-from-zero"),  # -0.1m -> -1m
    pytest.param("-1Ki", "bytes", -1024, id="bytes"),
    pytest.param(-3, "count", -3, id="count-int"),
    pytest.param(-0.5, "cpu", -500, id="cpu-float"),
]


@pytest.mark.parametrize(("text", "kind", "expected"), NEGATIVE_CASES)
def test_negative_allowed_when_asked(text: str | int | float, kind: str, expected: int) -> None:
    assert parse_quantity(text, kind, allow_negative=True) == expected
    with pytest.raises(QuantityError, match="must not be negative"):
        parse_quantity(text, kind)


ERROR_CASES = [
    pytest.param("abc", "cpu", r'^"abc" is not a quantity: expected a number with an optional suffix', id="word"),
    pytest.param("", "cpu", r'^"" is not a quantity', id="empty"),
    pytest.param(".", "cpu", r'^"\." is not a quantity', id="dot-only"),  # ParseQuantity would say 0
    pytest.param("-", "cpu", r'^"-" is not a quantity', id="sign-only"),
    pytest.param("Gi", "bytes", r'^"Gi" is not a quantity', id="suffix-only"),
    pytest.param("-1", "cpu", r'^"-1" must not be negative$', id="negative"),
    pytest.param("-1e-9", "cpu", r"must not be negative", id="negative-tiny"),
    pytest.param("1.5", "count", r'^"1\.5" is not a whole count', id="fractional-count"),
    pytest.param("500m", "count", r'^"500m" is not a whole count: counts .* must be whole', id="milli-count"),
    pytest.param("1e-1000000", "count", r"not a whole count", id="tiny-count"),
    pytest.param("1Zi", "bytes", r'^"1Zi" has an unknown suffix "Zi" at position 1; expected one of', id="zi"),
    pytest.param("1ki", "bytes", r'unknown suffix "ki" at position 1', id="lower-ki"),
    pytest.param("1K", "bytes", r'unknown suffix "K" at position 1', id="upper-k"),
    pytest.param("1Ki3", "bytes", r'unknown suffix "Ki3"', id="suffix-then-digits"),
    pytest.param("1 Gi", "bytes", r"whitespace at position 1 is not allowed", id="inner-space"),
    pytest.param(" 1", "cpu", r"whitespace at position 0", id="leading-space"),
    pytest.param("1\n", "cpu", r"whitespace at position 1", id="trailing-newline"),
    pytest.param("1.2.3", "cpu", r'unexpected "\." at position 3', id="two-dots"),
    pytest.param("5%", "cpu", r'unexpected "%" at position 1', id="percent"),
    pytest.param("1e", "cpu", r'malformed exponent "e" at position 1', id="exponent-without-digits"),
    pytest.param("1e1.5", "cpu", r'malformed exponent "e1\.5"', id="fractional-exponent"),
    pytest.param("1e+", "cpu", r'malformed exponent "e\+"', id="exponent-sign-only"),
    pytest.param("1e99999999999999999999", "cpu", r"exponent that is out of range", id="exponent-beyond-int64"),
    pytest.param(
        "1e1000000",
        "cpu",
        r'^"1e1000000" is too large: the maximum is 9223372036854775807 millicores',
        id="huge-exponent",
    ),
    # (2^63 - 1) cores = (2^63 - 1) * 1000 millicores, far above the int64 limit.
    pytest.param("9223372036854775807", "cpu", r"too large", id="cpu-int64-cores"),
    pytest.param("8Ei", "bytes", r"too large", id="bytes-2-pow-63"),  # 8 * 2^60 = 2^63 > 2^63 - 1
    pytest.param("9223372036854775808", "bytes", r"too large", id="bytes-max-plus-one"),
    pytest.param(2**63, "count", r"too large", id="int-too-large"),
    pytest.param(True, "cpu", r"not a boolean", id="bool"),
    pytest.param(float("nan"), "cpu", r"finite", id="nan"),
    pytest.param(float("inf"), "bytes", r"finite", id="inf"),
    pytest.param(None, "cpu", r"expected a string or a number, got NoneType", id="none"),
    pytest.param([1], "cpu", r"got list", id="list"),
]


@pytest.mark.parametrize(("text", "kind", "message"), ERROR_CASES)
def test_parse_errors(text: object, kind: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        parse_quantity(text, kind)  # type: ignore[arg-type]


def test_quantity_error_is_a_plain_value_error() -> None:
    assert QuantityError.__mro__[1] is ValueError


def test_long_text_is_shortened_in_the_message() -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity("x" * 500, "cpu")
    assert len(str(info.value)) < 200


def test_unknown_kind_lists_valid_kinds() -> None:
    assert KINDS == ("cpu", "bytes", "count")
    with pytest.raises(ValueError, match="unknown quantity kind 'memory': expected one of cpu, bytes, count"):
        parse_quantity("1", "memory")
    with pytest.raises(ValueError, match="expected one of cpu, bytes, count"):
        format_quantity(1, "memory")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("1e1000000", id="huge-exponent"),
        pytest.param("1e-999999999999999999", id="tiny-exponent"),
        pytest.param("0." + "0" * 20000 + "1", id="many-fraction-digits"),  # beyond int()'s 4300 digits
    ],
)
def test_extreme_input_is_fast(text: str) -> None:
    start = time.perf_counter()
    with contextlib.suppress(QuantityError):
        parse_quantity(text, "cpu")
    assert time.perf_counter() - start < 0.5


def test_many_fraction_digits_round_up() -> None:
    # 0.000...01 (20001 fraction digits) cores is far below 1m but non-zero -> 1m.
    assert parse_quantity("0." + "0" * 20000 + "1", "cpu") == 1
    # 1.000...01 cores = 1000.000...01m -> 1001m.
    assert parse_quantity("1." + "0" * 5000 + "1", "cpu") == 1001


FORMAT_CASES = [
    pytest.param(0, "cpu", "0", id="cpu-zero"),  # "0" beats "0m"
    pytest.param(500, "cpu", "500m", id="cpu-milli"),
    pytest.param(1000, "cpu", "1", id="cpu-core"),  # "1" (1 char) beats "1000m" (5)
    pytest.param(1500, "cpu", "1500m", id="cpu-no-fractions"),  # canonical form never writes "1.5"
    pytest.param(64000, "cpu", "64", id="cpu-cores"),
    pytest.param(2000000, "cpu", "2k", id="cpu-kilo-cores"),  # 2000 cores: "2k" beats "2000"
    pytest.param(-500, "cpu", "-500m", id="cpu-negative"),
    pytest.param(0, "bytes", "0", id="bytes-zero"),
    pytest.param(17179869184, "bytes", "16Gi", id="bytes-gi"),  # 16 * 2^30
    pytest.param(1000000, "bytes", "1M", id="bytes-mega"),  # 10^6 is not a multiple of 1024
    pytest.param(1024, "bytes", "1Ki", id="bytes-ki"),  # "1Ki" (3) beats "1024" (4)
    pytest.param(1536, "bytes", "1536", id="bytes-plain"),  # "1536" (4) beats "1.5Ki" (not allowed)
    pytest.param(1610612736, "bytes", "1536Mi", id="bytes-1.5gi"),  # 1.5 * 2^30 = 1536 * 2^20
    pytest.param(1024000, "bytes", "1024k", id="bytes-shorter-decimal"),  # "1024k" (5) vs "1000Ki" (6)
    # Tie: 10112000 = 9875 * 1024 = 10112 * 1000; "9875Ki" and "10112k" are both 6 chars: binary wins.
    pytest.param(10112000, "bytes", "9875Ki", id="bytes-tie-prefers-binary"),
    pytest.param(MAX_QUANTITY, "bytes", "9223372036854775807", id="bytes-max"),  # odd: no suffix divides it
    pytest.param(110, "count", "110", id="count-plain"),
    pytest.param(1000, "count", "1k", id="count-kilo"),
    pytest.param(1024, "count", "1024", id="count-no-binary"),  # counts never get Ki
    pytest.param(5 * 10**18, "count", "5E", id="count-exa"),
]


@pytest.mark.parametrize(("value", "kind", "expected"), FORMAT_CASES)
def test_format(value: int, kind: str, expected: str) -> None:
    assert format_quantity(value, kind) == expected
    assert parse_quantity(expected, kind, allow_negative=True) == value


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param(True, TypeError, id="bool"),
        pytest.param(1.5, TypeError, id="float"),
        pytest.param(MAX_QUANTITY + 1, QuantityError, id="too-large"),
    ],
)
def test_format_errors(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        format_quantity(value, "cpu")  # type: ignore[arg-type]


# --- properties ---------------------------------------------------------------------------------

amounts = st.integers(min_value=0, max_value=MAX_QUANTITY)
# Values with structure (multiples of powers of 1000 and 1024) exercise the suffixes.
structured = st.builds(
    lambda m, e, b: min(m * 10**e * 2**b, MAX_QUANTITY),
    st.integers(0, 10**6),
    st.integers(0, 12),
    st.integers(0, 40),
)


@given(value=st.one_of(amounts, structured), kind=st.sampled_from(KINDS))
def test_format_round_trips(value: int, kind: str) -> None:
    text = format_quantity(value, kind)
    assert parse_quantity(text, kind) == value
    assert "." not in text and "e" not in text  # canonical: integer mantissa, no exponent
    assert len(text) <= len(str(value)) + (kind == "cpu")  # never longer than the plain form


@given(value=st.one_of(amounts, structured), kind=st.sampled_from(KINDS))
def test_negative_format_round_trips(value: int, kind: str) -> None:
    assert parse_quantity(format_quantity(-value, kind), kind, allow_negative=True) == -value


SCALE = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "e2": Fraction(100),
    "e-4": Fraction(1, 10**4),
}


@given(
    whole=st.text("0123456789", max_size=6),
    frac=st.none() | st.text("0123456789", max_size=6),
    suffix=st.sampled_from(sorted(SCALE)),
    kind=st.sampled_from(("cpu", "bytes")),
)
def test_parse_matches_exact_reference(whole: str, frac: str | None, suffix: str, kind: str) -> None:
    """Against an independent Fraction model: value * unit, rounded up."""
    assume(whole or frac)
    text = whole + ("" if frac is None else "." + frac) + suffix
    exact = Fraction(int(whole or "0")) + Fraction(int(frac or "0"), 10 ** len(frac or ""))
    units = exact * SCALE[suffix] * (1000 if kind == "cpu" else 1)
    assert parse_quantity(text, kind) == math.ceil(units)


@given(value=st.integers(0, 10**9), kind=st.sampled_from(KINDS))
def test_ints_and_strings_agree(value: int, kind: str) -> None:
    assert parse_quantity(value, kind) == parse_quantity(str(value), kind)


@given(value=st.floats(min_value=0, max_value=1e9, allow_nan=False), kind=st.sampled_from(("cpu", "bytes")))
def test_floats_read_as_their_repr(value: float, kind: str) -> None:
    # Fraction(repr(x)) is the decimal the user wrote, not the binary float's exact value.
    units = Fraction(repr(value)) * (1000 if kind == "cpu" else 1)
    assert parse_quantity(value, kind) == math.ceil(units)


@given(text=st.text(max_size=12))
def test_arbitrary_text_parses_or_raises_quantity_error(text: str) -> None:
    for kind in KINDS:
        try:
            result = parse_quantity(text, kind, allow_negative=True)
        except QuantityError:
            continue
        assert isinstance(result, int) and abs(result) <= MAX_QUANTITY
        assert not any(c.isspace() for c in text)
