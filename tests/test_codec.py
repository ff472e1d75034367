"""The S0.2 device-vector encoding: encode/decode, the vectorised decode_many, and its errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from finesched.codec import (
    MAX_BITS,
    CodecError,
    EncodedVector,
    bits_for,
    decode,
    decode_many,
    encode,
    encode_vector,
)

ENCODE_CASES = [
    # The worked example: 100 needs 7 bits, so b = 7.
    # K = 100 + 50<<7 + 0<<14 + 100<<21 = 100 + 6400 + 0 + 209715200 = 209721700
    pytest.param([100, 50, 0, 100], 7, 209721700, id="worked-example"),
    pytest.param([], 7, 0, id="no-devices"),
    pytest.param([5], 3, 5, id="one-device"),  # 5<<0
    pytest.param([1, 1], 1, 3, id="one-bit"),  # 1 + 1<<1 = 3
    pytest.param([0, 0, 1], 8, 65536, id="last-device-high-bits"),  # 1<<16
    pytest.param([127, 127], 7, 16383, id="all-ones"),  # 127 + 127<<7 = 127 + 16256 = 2^14 - 1
    pytest.param([255] * 8, 8, 2**64 - 1, id="exactly-64-bits"),  # eight full bytes
    pytest.param([1, 2**64 - 1], 64, 1 + ((2**64 - 1) << 64), id="wide-fields"),
]


@pytest.mark.parametrize(("values", "bits", "k"), ENCODE_CASES)
def test_encode_and_decode(values: list[int], bits: int, k: int) -> None:
    assert encode(values, bits) == k
    assert decode(k, len(values), bits) == values


def test_decode_is_the_patent_formula() -> None:
    # device i (1-based) = (K >> ((i-1)*b)) & (2^b - 1), for K = 209721700, b = 7
    k, b = 209721700, 7
    assert [(k >> ((i - 1) * b)) & (2**b - 1) for i in range(1, 5)] == decode(k, 4, b) == [100, 50, 0, 100]


BITS_FOR_CASES = [
    pytest.param(0, 1, id="zero"),  # b >= 1 even though 0 needs no bits
    pytest.param(1, 1, id="one"),  # 1 < 2^1
    pytest.param(2, 2, id="two"),  # 2 < 2^2
    pytest.param(100, 7, id="hundred"),  # 2^6 = 64 <= 100 < 128 = 2^7
    pytest.param(127, 7, id="max-of-7"),
    pytest.param(128, 8, id="128"),  # 128 = 2^7 needs an 8th bit
    pytest.param(2**63, 64, id="beyond-int64"),
]


@pytest.mark.parametrize(("max_value", "bits"), BITS_FOR_CASES)
def test_bits_for(max_value: int, bits: int) -> None:
    assert bits_for(max_value) == bits
    assert max_value < 2**bits


ERROR_CASES = [
    pytest.param(
        lambda: encode([100, 50, 130], 7),
        "value 130 at index 2 does not fit in 7 bits (max 127)",
        id="value-too-wide",
    ),
    pytest.param(lambda: encode([1, -1], 7), "value -1 at index 1 is negative", id="negative-value"),
    pytest.param(lambda: encode([1, True], 7), "value at index 1 must be an int, got bool True", id="bool-value"),
    pytest.param(lambda: encode([1.0], 7), "value at index 0 must be an int, got float 1.0", id="float-value"),
    pytest.param(lambda: encode([1], 0), f"bits must be between 1 and {MAX_BITS}, got 0", id="zero-bits"),
    pytest.param(lambda: encode([1], MAX_BITS + 1), "bits must be between", id="too-many-bits"),
    pytest.param(lambda: encode([1], True), "bits must be an int, got bool", id="bool-bits"),
    # 2^29 has bit_length 30; 4 devices * 7 bits = 28.
    pytest.param(lambda: decode(2**29, 4, 7), "k needs 30 bits but count*bits = 28", id="k-too-wide"),
    pytest.param(lambda: decode(-1, 4, 7), "k = -1 is negative", id="negative-k"),
    pytest.param(lambda: decode(1, 0, 7), "k needs 1 bit but count*bits = 0", id="no-devices-nonzero-k"),
    pytest.param(lambda: decode(1, -1, 7), "count must not be negative, got -1", id="negative-count"),
    pytest.param(lambda: decode(1, 1.5, 7), "count must be an int, got float 1.5", id="float-count"),
    pytest.param(lambda: decode(False, 1, 7), "k must be an int, got bool False", id="bool-k"),
    pytest.param(lambda: bits_for(-1), "max_value must not be negative, got -1", id="negative-max"),
    pytest.param(lambda: bits_for(True), "max_value must be an int", id="bool-max"),
    pytest.param(
        lambda: decode_many([1, 2, 2**40], 4, 7),
        "ks[2] needs 41 bits but count*bits = 28",
        id="many-too-wide",
    ),
    pytest.param(lambda: decode_many([0, -3], 4, 7), "ks[1] = -3 is negative", id="many-negative"),
    pytest.param(lambda: decode_many([0, 1, True], 4, 7), "ks[2] must be an int, got bool True", id="many-bool"),
    pytest.param(lambda: decode_many(np.array([1, 5, -2]), 4, 7), "ks[2] = -2 is negative", id="array-negative"),
    pytest.param(
        lambda: decode_many(np.array([0, 2**28], dtype=np.uint64), 4, 7),
        "ks[1] needs 29 bits but count*bits = 28",
        id="array-too-wide",
    ),
    pytest.param(
        lambda: decode_many(np.array([1.0]), 1, 7),
        "ks must hold integers, got an array of dtype float64",
        id="array-float",
    ),
    pytest.param(lambda: decode_many(np.array([True]), 1, 7), "got an array of dtype bool", id="array-bool"),
    pytest.param(
        lambda: decode_many(np.zeros((2, 2), dtype=np.int64), 1, 7),
        "one-dimensional, got shape (2, 2)",
        id="array-2d",
    ),
    pytest.param(
        lambda: decode_many(np.array([1, 2**70], dtype=object), 1, 64),
        "ks[1] needs 71 bits but count*bits = 64",
        id="object-array-too-wide",
    ),
    pytest.param(lambda: EncodedVector(2**29, 4, 7), "k needs 30 bits but count*bits = 28", id="vector-too-wide"),
    pytest.param(lambda: encode_vector([1, -1]), "value -1 at index 1 is negative", id="vector-negative"),
    pytest.param(
        lambda: encode_vector([200], bits=7),
        "value 200 at index 0 does not fit in 7 bits",
        id="vector-explicit-bits",
    ),
]


@pytest.mark.parametrize(("call", "message"), ERROR_CASES)
def test_errors(call: object, message: str) -> None:
    with pytest.raises(CodecError, match=re.escape(message)):
        call()  # type: ignore[operator]


def test_codec_error_is_a_value_error() -> None:
    assert issubclass(CodecError, ValueError)


# --- decode_many --------------------------------------------------------------------------------


def test_decode_many_worked_example() -> None:
    out = decode_many([209721700, 0, 127], 4, 7)
    assert out.dtype == np.int64
    assert out.tolist() == [[100, 50, 0, 100], [0, 0, 0, 0], [127, 0, 0, 0]]


DECODE_MANY_SHAPES = [
    # (count, bits): which path, and why
    pytest.param(4, 7, np.int64, id="one-limb"),  # 4*7 = 28 <= 64: one uint64 per node
    pytest.param(8, 8, np.int64, id="exactly-one-limb"),  # 64 bits, no shift reaches 64
    pytest.param(1, 63, np.int64, id="widest-int64-field"),  # values < 2^63 still fit int64
    pytest.param(5, 13, np.int64, id="straddling-limbs"),  # 65 bits: device 5 spans bits 52..64
    pytest.param(10, 30, np.int64, id="many-limbs"),  # 300 bits = 5 limbs, fields cross 64 and 128...
    pytest.param(3, 63, np.int64, id="widest-straddling"),  # offsets 0, 63, 126
    pytest.param(2, 64, object, id="uint64-fields"),  # 2^64 - 1 does not fit int64 -> Python ints
    pytest.param(3, 100, object, id="big-fields"),
    pytest.param(0, 5, np.int64, id="no-devices"),
]


@pytest.mark.parametrize(("count", "bits", "dtype"), DECODE_MANY_SHAPES)
def test_decode_many_paths(count: int, bits: int, dtype: type) -> None:
    top = (1 << (count * bits)) - 1
    # All ones, zero, and alternating bit patterns catch off-by-one shifts and masks.
    ks = [top, 0, top // 3, top // 5, top - (top // 3)] if count else [0, 0]
    out = decode_many(ks, count, bits)
    assert out.shape == (len(ks), count)
    assert out.dtype == np.dtype(dtype)
    assert out.tolist() == [decode(k, count, bits) for k in ks]


def test_decode_many_accepts_integer_arrays() -> None:
    for dtype in (np.uint64, np.int64, np.uint32, np.int32):
        ks = np.array([209721700, 0], dtype=dtype)
        assert decode_many(ks, 4, 7).tolist() == [[100, 50, 0, 100], [0, 0, 0, 0]]
    # A uint64 array also feeds the multi-limb and the big-int paths.
    ks = np.array([2**64 - 1], dtype=np.uint64)
    assert decode_many(ks, 5, 13).tolist() == [decode(2**64 - 1, 5, 13)]
    assert decode_many(ks, 1, 64).tolist() == [[2**64 - 1]]


def test_decode_many_empty() -> None:
    assert decode_many([], 4, 7).shape == (0, 4)
    assert decode_many(np.array([], dtype=np.uint64), 4, 7).shape == (0, 4)
    assert decode_many([], 2, 100).shape == (0, 2)


def test_big_fields_are_python_ints() -> None:
    out = decode_many([encode([2**99, 1], 100)], 2, 100)
    assert type(out[0, 0]) is int and out[0, 0] == 2**99


# --- EncodedVector ------------------------------------------------------------------------------


def test_encoded_vector() -> None:
    vector = encode_vector([100, 50, 0, 100])  # bits default to bits_for(100) = 7
    assert vector == EncodedVector(k=209721700, count=4, bits=7)
    assert vector.decode() == [100, 50, 0, 100]
    assert EncodedVector.encode_vector([3], bits=4) == EncodedVector(3, 1, 4)
    assert encode_vector([]) == EncodedVector(0, 0, 1)  # bits_for(0) = 1
    assert hash(vector) == hash(EncodedVector(209721700, 4, 7))
    with pytest.raises(AttributeError):
        vector.k = 1  # type: ignore[misc]


def test_encoded_vector_normalises_numpy_ints() -> None:
    vector = encode_vector(np.array([1, 2, 3]))
    assert type(vector.k) is int and vector == EncodedVector(1 + (2 << 2) + (3 << 4), 3, 2)


# --- properties ---------------------------------------------------------------------------------


@st.composite
def vectors(draw: st.DrawFn, max_bits: int = 80) -> tuple[list[int], int]:
    bits = draw(st.integers(1, max_bits))
    values = draw(st.lists(st.integers(0, 2**bits - 1), max_size=12))
    return values, bits


@given(vectors())
def test_decode_inverts_encode(case: tuple[list[int], int]) -> None:
    values, bits = case
    k = encode(values, bits)
    assert k.bit_length() <= len(values) * bits
    assert decode(k, len(values), bits) == values


@given(st.integers(1, 24), st.integers(0, 6), st.data())
def test_encode_is_injective(bits: int, count: int, data: st.DataObject) -> None:
    field = st.integers(0, 2**bits - 1)
    a = data.draw(st.lists(field, min_size=count, max_size=count))
    b = data.draw(st.lists(field, min_size=count, max_size=count))
    assert (encode(a, bits) == encode(b, bits)) == (a == b)


@given(st.integers(0, 2**70))
def test_bits_for_is_minimal(value: int) -> None:
    bits = bits_for(value)
    assert value < 2**bits
    assert bits == 1 or value >= 2 ** (bits - 1)


@st.composite
def batches(draw: st.DrawFn, max_width: int) -> tuple[list[int], int, int]:
    bits = draw(st.integers(1, 100))
    count = draw(st.integers(0, max(0, max_width // bits)))
    ks = draw(st.lists(st.integers(0, 2 ** (count * bits) - 1), max_size=20))
    return ks, count, bits


@given(batches(max_width=64))
def test_decode_many_matches_decode_uint64_path(case: tuple[list[int], int, int]) -> None:
    ks, count, bits = case
    expected = [decode(k, count, bits) for k in ks]
    assert decode_many(ks, count, bits).tolist() == expected
    assert decode_many(np.array(ks, dtype=np.uint64), count, bits).tolist() == expected


@given(batches(max_width=400))
def test_decode_many_matches_decode_big_path(case: tuple[list[int], int, int]) -> None:
    ks, count, bits = case
    out = decode_many(ks, count, bits)
    assert out.shape == (len(ks), count)
    assert out.tolist() == [decode(k, count, bits) for k in ks]
