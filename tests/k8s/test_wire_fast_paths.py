"""The extender's reply writers and name-list reuse answer byte for byte what the plain encoder does."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from finesched.k8s import wire

NAMES = st.lists(st.text(min_size=1, max_size=12), max_size=30, unique=True)
REASONS = st.dictionaries(st.text(max_size=8), st.text(max_size=20), max_size=4)


@given(names=NAMES, data=st.data(), failed=REASONS, unresolvable=REASONS, error=st.text(max_size=10))
def test_filter_reply_is_what_encode_writes(
    names: list[str], data: st.DataObject, failed: dict[str, str], unresolvable: dict[str, str], error: str
) -> None:
    args = wire.ExtenderArgs({"metadata": {}}, names, None)
    every = data.draw(st.booleans())
    passed = range(len(names)) if every else sorted(data.draw(st.sets(st.integers(0, max(len(names) - 1, 0)))))
    passed = [p for p in passed if p < len(names)] if not every else passed
    doc = wire.filter_result(args, passed, failed, unresolvable, error)
    assert wire.encode_filter_result(args, doc) == wire.encode(doc)
    assert wire.encode_filter_result(args, doc) == wire.encode(doc)  # the kept list JSON again


def test_filter_reply_with_node_objects_or_an_error_is_what_encode_writes() -> None:
    items = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    full = wire.ExtenderArgs({}, ["a", "b"], items)
    for doc in (
        wire.filter_result(full, [1], {"a": "no"}, {}),
        wire.filter_error(full, "bad"),
        wire.filter_error(None, "x"),
    ):
        assert wire.encode_filter_result(full, doc) == wire.encode(doc)


def test_same_names_hands_back_the_earlier_list_only_when_equal() -> None:
    before = wire.extender_args(json.loads('{"Pod": {}, "NodeNames": ["a", "b"]}'))
    again = wire.same_names(wire.extender_args(json.loads('{"Pod": {"x": 1}, "NodeNames": ["a", "b"]}')), before)
    assert again.names is before.names and again.pod == {"x": 1}
    other = wire.extender_args(json.loads('{"Pod": {}, "NodeNames": ["b", "a"]}'))
    assert wire.same_names(other, before) is other
    full = wire.extender_args(
        {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}}
    )
    assert wire.same_names(full, before) is full


@given(names=NAMES, data=st.data())
def test_priorities_reply_is_what_encode_writes_for_the_same_list_again(names: list[str], data: st.DataObject) -> None:
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(names), max_size=len(names)))
    want = wire.encode(wire.host_priorities(names, scores))
    if all(n.isascii() for n in names):  # node names are ASCII (DNS subdomains)
        assert wire.encode_priorities(names, scores) == want
        assert wire.encode_priorities(names, scores) == want
