"""The dimension-reducing encoding of seed S0.2: one integer carries a whole device vector.

A two-dimensional resource class (Nf devices, each with its own amount Ns1..NsNf, e.g. the free
GPU memory of every card on a node) would otherwise need one scheduler dimension per device.
The patent packs it into ONE integer, with `b` bits per device, device 1 in the lowest bits::

    K = Ns1 << (0*b) | Ns2 << (1*b) | ... | NsNf << ((Nf-1)*b)
    Ns_i = (K >> ((i-1)*b)) & (2**b - 1)                         (device i, 1-based)

Nodes encode their usage and sync K to the scheduler; the scheduler decodes, usually for many
nodes at once (`decode_many`, vectorised with numpy).

Worked example, values [100, 50, 0, 100] with b = 7 (the largest value, 100, needs 7 bits)::

    K = 100 + 50<<7 + 0<<14 + 100<<21 = 100 + 6400 + 0 + 209715200 = 209721700

Every value must fit in `b` bits and K in count*b bits; anything else is a `CodecError`
naming the index and the rule, because a silently truncated K would decode to wrong devices.
`b` is capped at `MAX_BITS` so a typo cannot make us build a gigantic mask.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_BITS",
    "CodecError",
    "EncodedVector",
    "bits_for",
    "decode",
    "decode_many",
    "encode",
    "encode_vector",
]

#: Widest per-device field we accept. Device amounts are small; this only stops runaway input.
MAX_BITS: Final = 1024

# A field this wide or narrower decodes into int64; wider ones may not fit and come out as objects.
_INT64_BITS: Final = 63
_LIMB: Final = 64


class CodecError(ValueError):
    """Values, K or parameters that do not fit the encoding; the message says which and why."""


def bits_for(max_value: int) -> int:
    """The smallest b >= 1 with max_value < 2**b: bits_for(0) == bits_for(1) == 1, bits_for(100) == 7."""
    value = _check_int(max_value, "max_value")
    if value < 0:
        raise CodecError(f"max_value must not be negative, got {value}")
    return max(1, value.bit_length())


def encode(values: Sequence[int], bits: int) -> int:
    """K = values[0] << 0 | values[1] << bits | ... (device i at bit (i-1)*bits)."""
    bits = _check_bits(bits)
    k = 0
    for index, value in enumerate(values):
        k |= _check_value(value, index, bits) << (index * bits)
    return k


def decode(k: int, count: int, bits: int) -> list[int]:
    """The `count` device values in K: device i (1-based) is ``(K >> ((i-1)*bits)) & (2**bits - 1)``."""
    bits = _check_bits(bits)
    count = _check_count(count)
    k = _check_k(k, count, bits, "k")
    mask = (1 << bits) - 1
    return [(k >> (index * bits)) & mask for index in range(count)]


def decode_many(ks: Sequence[int] | npt.NDArray[np.integer], count: int, bits: int) -> npt.NDArray[Any]:
    """Decode one K per node into an array of shape ``[len(ks), count]``.

    The dtype is int64, or object (Python ints) when ``bits > 63`` since then a value may not
    fit in int64. When ``count*bits <= 64`` each K is one uint64 and a single broadcast shift
    (one shift per device) decodes every node; wider K are split into 64-bit limbs, still
    vectorised, with fields that straddle two limbs stitched together. Row r always equals
    ``decode(ks[r], count, bits)``; the first bad K is reported by its index.
    """
    bits = _check_bits(bits)
    count = _check_count(count)
    width = count * bits
    if isinstance(ks, np.ndarray):
        if ks.ndim != 1:
            raise CodecError(f"ks must be one-dimensional, got shape {ks.shape}")
        if ks.dtype.kind in "iu":
            _check_k_array(ks, width)
            if bits <= _INT64_BITS:
                return _extract(_limbs_from_array(ks.astype(np.uint64), width), count, bits)
        elif ks.dtype.kind != "O":
            raise CodecError(f"ks must hold integers, got an array of dtype {ks.dtype}")
        ks = ks.tolist()
    values = [_check_k(k, count, bits, f"ks[{index}]") for index, k in enumerate(ks)]
    if bits > _INT64_BITS:
        rows = [[(k >> (i * bits)) & ((1 << bits) - 1) for i in range(count)] for k in values]
        return np.array(rows, dtype=object).reshape(len(values), count)
    return _extract(_limbs_from_ints(values, width), count, bits)


@dataclass(frozen=True, slots=True)
class EncodedVector:
    """A device vector on the wire: K plus the two numbers needed to read it back."""

    k: int
    count: int
    bits: int

    def __post_init__(self) -> None:
        bits = _check_bits(self.bits)
        count = _check_count(self.count)
        object.__setattr__(self, "bits", bits)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "k", _check_k(self.k, count, bits, "k"))

    @classmethod
    def encode_vector(cls, values: Sequence[int], bits: int | None = None) -> EncodedVector:
        """Encode `values`; `bits` defaults to the fewest that hold the largest value."""
        checked = [_check_value(value, index, MAX_BITS) for index, value in enumerate(values)]
        if bits is None:
            bits = bits_for(max(checked, default=0))
        return cls(encode(checked, bits), len(checked), bits)

    def decode(self) -> list[int]:
        """The device values, device 1 first."""
        return decode(self.k, self.count, self.bits)


encode_vector = EncodedVector.encode_vector


# Validation ------------------------------------------------------------------------------------


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise CodecError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _check_bits(bits: object) -> int:
    value = _check_int(bits, "bits")
    if not 1 <= value <= MAX_BITS:
        raise CodecError(f"bits must be between 1 and {MAX_BITS}, got {value}")
    return value


def _check_count(count: object) -> int:
    value = _check_int(count, "count")
    if value < 0:
        raise CodecError(f"count must not be negative, got {value}")
    return value


def _check_value(value: object, index: int, bits: int) -> int:
    number = _check_int(value, f"value at index {index}")
    if number < 0:
        raise CodecError(f"value {number} at index {index} is negative; device values are unsigned")
    if number.bit_length() > bits:
        limit = (1 << bits) - 1
        raise CodecError(f"value {number} at index {index} does not fit in {bits} bits (max {limit})")
    return number


def _check_k(k: object, count: int, bits: int, what: str) -> int:
    value = _check_int(k, what)
    if value < 0:
        raise CodecError(f"{what} = {value} is negative; an encoded vector is unsigned")
    if value.bit_length() > count * bits:
        raise CodecError(f"{what} needs {_bits(value.bit_length())} but count*bits = {count * bits}")
    return value


def _check_k_array(ks: npt.NDArray[np.integer], width: int) -> None:
    """Vectorised `_check_k` for an integer array, reporting the first bad index."""
    if ks.dtype.kind == "i":
        negative = ks < 0
        if negative.any():
            index = int(np.argmax(negative))
            raise CodecError(f"ks[{index}] = {int(ks[index])} is negative; an encoded vector is unsigned")
    if width >= _LIMB:
        return  # every uint64 (or non-negative int64) fits
    too_wide = (ks.astype(np.uint64) >> np.uint64(width)) != 0
    if too_wide.any():
        index = int(np.argmax(too_wide))
        k = int(ks[index])
        raise CodecError(f"ks[{index}] needs {_bits(k.bit_length())} but count*bits = {width}")


def _bits(n: int) -> str:
    return "1 bit" if n == 1 else f"{n} bits"


# Decoding ----------------------------------------------------------------------------------------


def _limb_count(width: int) -> int:
    return max(1, -(-width // _LIMB))


def _limbs_from_array(ks: npt.NDArray[np.uint64], width: int) -> npt.NDArray[np.uint64]:
    """[n] uint64 -> [n, limbs]; a uint64 is already the lowest limb, the rest are zero."""
    limbs = np.zeros((len(ks), _limb_count(width)), dtype=np.uint64)
    limbs[:, 0] = ks
    return limbs


def _limbs_from_ints(ks: list[int], width: int) -> npt.NDArray[np.uint64]:
    """Validated Python ints -> [n, limbs] uint64, least significant limb first."""
    nlimbs = _limb_count(width)
    if nlimbs == 1:
        return np.array(ks, dtype=np.uint64).reshape(len(ks), 1)
    raw = b"".join(k.to_bytes(nlimbs * 8, "little") for k in ks)
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64).reshape(len(ks), nlimbs)


def _extract(limbs: npt.NDArray[np.uint64], count: int, bits: int) -> npt.NDArray[np.int64]:
    """Fields of `bits` bits (bits <= 63) from little-endian 64-bit limbs, shape [n, count]."""
    mask = np.uint64((1 << bits) - 1)
    starts = np.arange(count, dtype=np.int64) * bits
    if limbs.shape[1] == 1:  # the common case: K is one uint64, one shift per device
        return ((limbs[:, :1] >> starts.astype(np.uint64)) & mask).astype(np.int64)
    limb = starts // _LIMB
    offset = starts % _LIMB
    fields = limbs[:, limb] >> offset.astype(np.uint64)
    straddles = offset + bits > _LIMB  # the field's high bits are in the next limb
    if straddles.any():
        upper = limbs[:, np.minimum(limb + 1, limbs.shape[1] - 1)]
        shift = np.where(straddles, _LIMB - offset, 0).astype(np.uint64)  # in 1..63 where used
        fields |= np.where(straddles, upper << shift, np.uint64(0))
    return (fields & mask).astype(np.int64)
