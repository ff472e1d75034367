"""CPUSet: Linux cpulist parsing/formatting (kubelet style), set algebra, pydantic field use."""

from __future__ import annotations

import copy
import pickle
import re

import numpy as np
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from finesched.cpuset import MAX_CPU_ID, CPUSet

PARSE_CASES = [
    pytest.param("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11", id="mixed"),
    pytest.param("", [], "", id="empty"),
    pytest.param("   ", [], "", id="blank"),
    pytest.param("5", [5], "5", id="single"),
    pytest.param("0,1", [0, 1], "0-1", id="run-of-two-is-a-range"),  # kubelet: any run of 2+ is a-b
    pytest.param("0-1,2", [0, 1, 2], "0-2", id="adjacent-items-merge"),
    pytest.param("5,3,4", [3, 4, 5], "3-5", id="unsorted"),
    pytest.param("1,1,1-2", [1, 2], "1-2", id="duplicates"),
    pytest.param("2-2", [2], "2", id="one-id-range"),
    pytest.param(" 1 , 2-3 \n", [1, 2, 3], "1-3", id="whitespace-and-newline"),  # sysfs ends with \n
    pytest.param("007", [7], "7", id="leading-zeros"),  # kubelet's strconv.Atoi accepts them
    pytest.param("0,2,4", [0, 2, 4], "0,2,4", id="no-runs"),
    pytest.param(f"{MAX_CPU_ID}", [MAX_CPU_ID], f"{MAX_CPU_ID}", id="max-id"),
]


@pytest.mark.parametrize(("text", "ids", "canonical"), PARSE_CASES)
def test_parse_and_format(text: str, ids: list[int], canonical: str) -> None:
    cpus = CPUSet.parse(text)
    assert cpus.sorted() == ids
    assert str(cpus) == cpus.format() == canonical
    assert CPUSet(text) == cpus  # the constructor parses strings too


ERROR_CASES = [
    # message: invalid cpulist "<text>" at position <character offset>: <rule>
    pytest.param("3-1", 0, "ends before it starts", id="reversed-range"),
    pytest.param("1,,2", 2, "empty item", id="empty-item"),  # "1," is 2 chars, the empty item starts at 2
    pytest.param("1,", 2, "empty item", id="trailing-comma"),
    pytest.param(",1", 0, "empty item", id="leading-comma"),
    pytest.param("a", 0, "'a' is not a CPU id", id="not-a-number"),
    pytest.param("0-3,x", 4, "'x' is not a CPU id", id="bad-second-item"),  # "0-3," is 4 chars
    pytest.param("-1", 0, "must not be negative", id="negative"),
    pytest.param("1-", 2, "has no end", id="open-range"),
    pytest.param("1-2-3", 3, "a range has one '-'", id="two-dashes"),  # second dash at offset 3
    pytest.param("0-7:2/4", 2, "'7:2/4' is not a CPU id", id="kernel-stride-form"),
    pytest.param("1 2", 0, "'1 2' is not a CPU id", id="inner-space"),
    pytest.param("+1", 0, "is not a CPU id", id="plus-sign"),
    pytest.param("0-4000000000", 2, f"above the maximum {MAX_CPU_ID}", id="huge-range"),  # no 4e9-id set
    pytest.param("0, 9" + "9" * 5000, 3, "above the maximum", id="huge-id"),  # beyond int()'s digit limit
]


@pytest.mark.parametrize(("text", "position", "rule"), ERROR_CASES)
def test_parse_errors(text: str, position: int, rule: str) -> None:
    with pytest.raises(ValueError) as info:
        CPUSet.parse(text)
    message = str(info.value)
    assert message.startswith(f'invalid cpulist "{text[:5]}')
    assert len(message) < 300  # a huge input is shortened, not echoed whole
    assert f"at position {position}: " in message
    assert rule in message


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="a cpulist is a string"):
        CPUSet.parse([1, 2])  # type: ignore[arg-type]


CONSTRUCTOR_ERRORS = [
    pytest.param([True], "index 0 is True (bool)", id="bool"),
    pytest.param([0, -1], "index 1 is -1; CPU ids must not be negative", id="negative"),
    pytest.param([1.0], "index 0 is 1.0 (float)", id="float"),
    pytest.param([MAX_CPU_ID + 1], f"the maximum is {MAX_CPU_ID}", id="too-large"),
]


@pytest.mark.parametrize(("ids", "message"), CONSTRUCTOR_ERRORS)
def test_constructor_validates_ids(ids: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CPUSet(ids)  # type: ignore[arg-type]


def test_constructor_forms() -> None:
    assert CPUSet() == CPUSet([]) == CPUSet("")
    assert CPUSet([3, 1, 2]) == CPUSet.from_ids(1, 2, 3) == CPUSet(range(1, 4)) == CPUSet("1-3")
    assert CPUSet(np.array([1, 2])) == CPUSet("1-2")  # numpy ints are ints
    assert CPUSet(CPUSet("4")) == CPUSet("4")
    assert CPUSet(c for c in (0, 1)) == CPUSet("0-1")


def test_container_protocol() -> None:
    cpus = CPUSet("8,0-2")
    assert list(cpus) == [0, 1, 2, 8]  # ascending
    assert len(cpus) == 4
    assert 8 in cpus and 3 not in cpus
    assert True not in CPUSet("1")  # True == 1, but a bool is not a CPU id
    assert bool(cpus) and not CPUSet()
    assert repr(cpus) == 'CPUSet("0-2,8")'
    assert repr(CPUSet()) == 'CPUSet("")'
    assert eval(repr(cpus)) == cpus


def test_equality_and_hashing() -> None:
    assert CPUSet("0-1") == CPUSet([1, 0])
    assert CPUSet("0-1") != CPUSet("0")
    assert CPUSet("0-1") != frozenset({0, 1})  # only CPUSets compare equal
    assert len({CPUSet("0-1"), CPUSet([0, 1]), CPUSet("2")}) == 2
    assert {CPUSet("0-1"): "a"}[CPUSet("1,0")] == "a"


def test_immutable() -> None:
    cpus = CPUSet("0-1")
    with pytest.raises(AttributeError):
        cpus._ids = frozenset()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cpus.extra = 1  # type: ignore[attr-defined]


def test_pickle_and_copy() -> None:
    cpus = CPUSet("0-3,8")
    assert pickle.loads(pickle.dumps(cpus)) == cpus
    assert copy.deepcopy(cpus) == cpus


ALGEBRA_CASES = [
    # a = {0,1,2,3}, b = {2,3,4,5}
    pytest.param("union", "0-5", id="union"),  # {0..3} ∪ {2..5} = {0..5}
    pytest.param("intersection", "2-3", id="intersection"),  # common: {2,3}
    pytest.param("difference", "0-1", id="difference"),  # {0..3} minus {2..5} = {0,1}
    pytest.param("symmetric_difference", "0-1,4-5", id="symmetric-difference"),  # {0,1} ∪ {4,5}
]


@pytest.mark.parametrize(("method", "expected"), ALGEBRA_CASES)
def test_algebra_methods(method: str, expected: str) -> None:
    a, b = CPUSet("0-3"), CPUSet("2-5")
    assert getattr(a, method)(b) == CPUSet(expected)
    assert getattr(a, method)([2, 3, 4, 5]) == CPUSet(expected)  # methods take any ids
    assert getattr(a, method)("2-5") == CPUSet(expected)


def test_operators() -> None:
    a, b = CPUSet("0-3"), CPUSet("2-5")
    assert a | b == CPUSet("0-5")
    assert a & b == CPUSet("2-3")
    assert a - b == CPUSet("0-1")
    assert a ^ b == CPUSet("0-1,4-5")
    assert isinstance(a | b, CPUSet)
    with pytest.raises(TypeError):
        _ = a | {1}  # type: ignore[operator]  # like frozenset | list: operators need the same type


def test_relations() -> None:
    assert CPUSet("1-2").is_subset(CPUSet("0-3")) and CPUSet("1-2").issubset([1, 2])
    assert not CPUSet("1-4").is_subset("0-3")
    assert CPUSet("0-3").is_superset("1") and CPUSet("0-3").issuperset([])
    assert CPUSet("0-1").is_disjoint("2-3") and not CPUSet("0-2").isdisjoint([2])
    assert CPUSet().is_subset(CPUSet()) and CPUSet().is_disjoint(CPUSet())


# --- pydantic -----------------------------------------------------------------------------------


class Pinned(pydantic.BaseModel):
    cpus: CPUSet
    reserved: CPUSet = pydantic.Field(default_factory=CPUSet)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("0-3,8", id="string"),
        pytest.param([8, 0, 1, 2, 3], id="list"),
        pytest.param((0, 1, 2, 3, 8), id="tuple"),
        pytest.param(CPUSet("0-3,8"), id="cpuset"),
    ],
)
def test_pydantic_accepts(value: object) -> None:
    model = Pinned(cpus=value)  # type: ignore[arg-type]
    assert model.cpus == CPUSet("0-3,8")
    assert model.reserved == CPUSet()
    assert model.model_dump() == {"cpus": "0-3,8", "reserved": ""}
    assert model.model_dump_json() == '{"cpus":"0-3,8","reserved":""}'
    assert Pinned.model_validate_json(model.model_dump_json()) == model


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("3-1", 'invalid cpulist "3-1" at position 0: range', id="reversed-range"),
        pytest.param("1,,2", "at position 2: empty item", id="empty-item"),
        pytest.param([0, -1], "CPU ids must not be negative", id="negative-in-list"),
        pytest.param(3, 'expected a cpulist string like "0-3,8", a list of CPU ids or a CPUSet, got int', id="int"),
        pytest.param({"a": 1}, "got dict", id="dict"),
    ],
)
def test_pydantic_errors_carry_the_message(value: object, message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Pinned(cpus=value)  # type: ignore[arg-type]
    (error,) = info.value.errors()
    assert error["loc"] == ("cpus",)
    assert message in error["msg"]


def test_pydantic_json_schema() -> None:
    schema = Pinned.model_json_schema()
    assert schema["properties"]["cpus"]["type"] == "string"


# --- properties ---------------------------------------------------------------------------------

# Dense small ids make runs and ranges; a few sparse large ids cover the whole id space.
dense = st.frozensets(st.integers(0, 200), max_size=60)
id_sets = dense | st.frozensets(st.integers(0, MAX_CPU_ID), max_size=8)


@given(ids=id_sets)
def test_format_parse_round_trip(ids: frozenset[int]) -> None:
    cpus = CPUSet(ids)
    assert CPUSet.parse(str(cpus)) == cpus
    assert cpus.sorted() == sorted(ids)
    assert list(cpus) == sorted(ids)
    assert len(cpus) == len(ids)


@given(ids=id_sets)
def test_format_is_canonical(ids: frozenset[int]) -> None:
    """Ascending items; a range exactly where a run of 2+ consecutive ids is."""
    text = str(CPUSet(ids))
    previous = -2
    for item in text.split(",") if text else []:
        lo, _, hi = item.partition("-")
        start, end = int(lo), int(hi or lo)
        assert start > previous + 1  # ascending, and runs are never split
        assert (hi != "") == (end > start)  # "a-b" only for 2+ ids
        previous = end


@given(a=id_sets, b=id_sets)
def test_algebra_matches_frozenset(a: frozenset[int], b: frozenset[int]) -> None:
    x, y = CPUSet(a), CPUSet(b)
    assert (x | y).sorted() == sorted(a | b)
    assert (x & y).sorted() == sorted(a & b)
    assert (x - y).sorted() == sorted(a - b)
    assert (x ^ y).sorted() == sorted(a ^ b)
    assert x.union(b) == x | y and x.intersection(b) == x & y and x.difference(b) == x - y
    assert x.is_subset(y) == (a <= b)
    assert x.is_superset(y) == (a >= b)
    assert x.is_disjoint(y) == a.isdisjoint(b)
    assert (x == y) == (a == b)
    if a == b:
        assert hash(x) == hash(y)


@given(text=st.text(alphabet="0123456789-, x", max_size=15))
def test_arbitrary_text_parses_or_raises_value_error(text: str) -> None:
    try:
        cpus = CPUSet.parse(text)
    except ValueError as exc:
        assert "at position" in str(exc)
    else:
        assert CPUSet.parse(str(cpus)) == cpus
