"""The cache of validated CPU topologies (model/node.py): a node parsed with a topology seen before
is the node parsed afresh, bad input is refused with the same text, and the shared value cannot be
changed by whoever holds it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from finesched import parse_manifest
from finesched.errors import ValidationError
from finesched.model import node as node_model
from finesched.model.node import CPUTopology, Node

# Small ranges, so duplicate ids and cores split over two sockets or NUMA nodes come up often.
_ids = st.integers(0, 7)
_odd = st.one_of(st.booleans(), st.text(max_size=2), st.integers(-2, -1), st.just(10**9), st.floats(0, 2), st.none())
_cpu = st.fixed_dictionaries({"id": _ids, "core": st.integers(0, 3), "socket": st.integers(0, 1), "numa": _ids})
_odd_cpu = st.one_of(
    _cpu,
    st.dictionaries(st.sampled_from(["id", "core", "socket", "numa", "thread"]), st.one_of(_ids, _odd), max_size=5),
    _odd,
)
_listed = st.fixed_dictionaries({"cpus": st.lists(st.one_of(_cpu, _cpu, _odd_cpu), max_size=10)})
_shape = st.dictionaries(
    st.sampled_from(["sockets", "numaPerSocket", "coresPerNuma", "threadsPerCore", "cores_per_numa", "cores"]),
    st.one_of(st.integers(-1, 4), st.just(10**6), _odd),
    max_size=4,
)
topologies = st.one_of(_listed, _shape, _odd)


def node_doc(topology: Any, name: str = "n1") -> dict[str, Any]:
    return {
        "apiVersion": "finesched.io/v1alpha1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"allocatable": {"memory": "16Gi"}, "cpuTopology": topology},
    }


def outcome(doc: dict[str, Any]) -> Node | str:
    """The node, or the text of the error that refused it."""
    try:
        node = parse_manifest(doc)
    except ValidationError as exc:
        return str(exc)
    assert isinstance(node, Node)
    return node


def equal_ints(value: Any) -> Any:
    """`value` with every number that equals an int (True, 2.0) made that int: the same key to a
    dict, so a cache keyed carelessly would hand the ints' topology to the look-alike."""
    if isinstance(value, dict):
        return {k: equal_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [equal_ints(v) for v in value]
    if isinstance(value, (bool, float)) and value == int(value):
        return int(value)
    return value


def comparable(result: Node | str) -> Any:
    return result if isinstance(result, str) else result.model_dump()


@settings(max_examples=300)
@given(topology=topologies)
def test_a_cached_topology_gives_what_a_fresh_validation_gives(topology: Any) -> None:
    node_model._TOPOLOGIES.clear()
    fresh = outcome(node_doc(topology))  # a miss: validated as without a cache
    node_model._TOPOLOGIES.clear()
    outcome(node_doc(equal_ints(topology)))  # the cache now holds its look-alike, if valid
    again = outcome(node_doc(topology))
    other = outcome(node_doc(topology, name="n2"))
    assert comparable(again) == comparable(fresh)
    if isinstance(fresh, str):
        assert other == fresh
        return
    assert isinstance(again, Node) and isinstance(other, Node)
    if node_model._topology_key(topology) is not None:  # plain ints: kept, and shared by both nodes
        assert again.cpu_topology is other.cpu_topology
    # Whatever mode validates it (Python, lax), a topology that the cache holds comes out the same.
    if isinstance(topology, dict):
        assert CPUTopology.model_validate(topology) == fresh.cpu_topology


@given(topology=topologies)
def test_a_refused_topology_is_not_kept(topology: Any) -> None:
    node_model._TOPOLOGIES.clear()
    if isinstance(outcome(node_doc(topology)), str) and node_model._TOPOLOGIES:
        CPUTopology.model_validate(topology)  # kept only if the topology itself is valid (the node was not)


def test_lax_input_is_not_taken_from_the_cache_of_strict_input() -> None:
    """A string where a number belongs is refused in a manifest (validated strictly) even right after
    the same topology, with numbers, was validated and kept."""
    cpus = [{"id": 1, "core": 1, "socket": 0, "numa": 0}]
    assert isinstance(outcome(node_doc({"cpus": cpus})), Node)
    for look_alike in ("1", True, 1.0):
        assert "cpus[0].id" in str(outcome(node_doc({"cpus": [{**cpus[0], "id": look_alike}]})))


def test_the_shared_topology_cannot_be_changed_by_a_caller() -> None:
    topology = {"sockets": 2, "coresPerNuma": 2, "threadsPerCore": 2}
    first = parse_manifest(node_doc(topology))
    assert isinstance(first, Node) and first.cpu_topology is not None
    shared = first.cpu_topology
    before = shared.model_dump()
    with pytest.raises(ValueError):  # pydantic's "Instance is frozen"
        shared.cpus = ()  # type: ignore[misc]
    with pytest.raises(ValueError):
        shared.cpus[0].numa = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        shared.cpus.append(shared.cpus[0])  # type: ignore[attr-defined]
    with pytest.raises((AttributeError, TypeError)):
        shared.all_cpus._ids.add(99)  # type: ignore[attr-defined]
    changed = shared.model_copy(update={"cpus": shared.cpus[:1]})  # a new object; the shared one stays
    assert changed is not shared
    second = parse_manifest(node_doc(dict(topology), name="n2"))
    assert isinstance(second, Node) and second.cpu_topology is shared
    assert shared.model_dump() == before and len(shared.cpus) == 8


def test_the_cache_stays_bounded_and_right_when_full() -> None:
    node_model._TOPOLOGIES.clear()
    kept = node_model._TOPOLOGIES_KEPT
    for cores in range(1, kept + 20):
        node = parse_manifest(node_doc({"sockets": 1, "coresPerNuma": cores}))
        assert isinstance(node, Node) and node.cpu_topology is not None and len(node.cpu_topology.cpus) == cores
    assert len(node_model._TOPOLOGIES) == kept
