"""Topology manifests and a gang's topology request: shapes accepted, every bad input named."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_node
from finesched import parse_manifest
from finesched.errors import ValidationError
from finesched.model.manifest import to_manifest
from finesched.model.topology import GangTopology, Topology, label_key_problem
from finesched.model.workload import Workload
from finesched.state.cluster import ClusterState
from finesched.state.topology import DomainIndexCache, build_index, domain_capacities

BLOCK, RACK, HOST = "topology.finesched.io/block", "topology.finesched.io/rack", "kubernetes.io/hostname"


def topology_doc(*labels: str, name: str = "dc") -> dict[str, Any]:
    return {
        "apiVersion": "finesched.io/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in labels]},
    }


def gang_doc(**topology: Any) -> dict[str, Any]:
    return {
        "apiVersion": "finesched.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "w-0"},
        "spec": {"requests": {"cpu": "1"}, "gang": {"name": "g", "minMember": 4, "topology": topology}},
    }


def test_a_topology_manifest_round_trips() -> None:
    topology = parse_manifest(topology_doc(BLOCK, RACK, HOST))
    assert isinstance(topology, Topology) and topology.labels == (BLOCK, RACK, HOST)
    assert topology.depth_of(RACK) == 1 and topology.depth_of("zone") is None
    assert parse_manifest(to_manifest(topology)) == topology


def test_a_gang_topology_round_trips_with_its_slice() -> None:
    workload = parse_manifest(gang_doc(name="dc", required=RACK, slice={"size": 2, "required": HOST}))
    assert isinstance(workload, Workload) and workload.gang is not None
    asked = workload.gang.topology
    assert asked is not None and asked.level == RACK and asked.slice is not None and asked.slice.size == 2
    assert parse_manifest(to_manifest(workload)) == workload


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        (topology_doc(), "spec.levels", "1 to 16 levels"),
        (topology_doc(*[f"l{i}" for i in range(17)]), "spec.levels", "1 to 16 levels"),
        (topology_doc(RACK, RACK), "spec.levels[1].nodeLabel", "given twice"),
        (topology_doc(HOST, RACK), "spec.levels[0].nodeLabel", "only be the last"),
        (topology_doc("Bad Label"), "spec.levels[0].nodeLabel", "must be a label key"),
        (topology_doc("-x.io/rack"), "spec.levels[0].nodeLabel", "must be a label key"),
        (topology_doc(RACK, name="Not_A_Name"), "metadata.name", ""),
        (gang_doc(name="dc"), "spec.gang.topology", "exactly one of required and preferred"),
        (gang_doc(name="dc", required=RACK, preferred=BLOCK), "spec.gang.topology", "exactly one"),
        (gang_doc(name="dc", required="a b"), "spec.gang.topology.required", "label key"),
        (
            gang_doc(name="dc", required=RACK, slice={"size": 3, "required": HOST}),
            "spec.gang.topology.slice.size",
            "must divide minMember (4)",
        ),
        (gang_doc(name="dc", required=RACK, slice={"size": 0, "required": HOST}), "spec.gang.topology.slice.size", ""),
        (gang_doc(name="dc", required=RACK, slice={"size": 2}), "spec.gang.topology.slice.required", ""),
        (gang_doc(name="dc", required=RACK, zone="a"), "spec.gang.topology.zone", ""),
    ],
)
def test_bad_topology_input_names_the_field(doc: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc)
    assert any(e.path == path and message in e.message for e in info.value.errors), info.value.errors


def test_a_request_is_checked_against_its_topology() -> None:
    dc = Topology.model_validate({"name": "dc", "levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}]})
    fine = GangTopology(name="dc", required=BLOCK, slice={"size": 2, "required": RACK})
    assert fine.problems_in(dc) == []
    assert fine.problems_in(None) == [(("name",), "no such topology", "dc")]
    unknown = GangTopology(name="dc", preferred=HOST)
    assert [(loc, value) for loc, _, value in unknown.problems_in(dc)] == [(("preferred",), HOST)]
    coarser = GangTopology(name="dc", required=RACK, slice={"size": 2, "required": BLOCK})
    ((loc, rule, _),) = coarser.problems_in(dc)
    assert loc == ("slice", "required") and "same level as required" in rule


@given(st.text(max_size=80))
@settings(max_examples=200, deadline=None)
def test_label_keys_follow_kubernetes(key: str) -> None:
    """A key the rule accepts splits into an optional DNS prefix and a name of at most 63."""
    if label_key_problem(key) is None:
        prefix, _, name = key.rpartition("/")
        assert 1 <= len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
        assert all(c.isalnum() or c in "-_." for c in name) and name.isascii()
        assert prefix == "" or (prefix == prefix.lower() and prefix.isascii() and "/" not in prefix)


def rack_cluster(placements: list[tuple[str | None, str | None]]) -> ClusterState:
    state = ClusterState()
    for i, (block, rack) in enumerate(placements):
        node = make_node(f"n{i}").cpu("8").memory("8Gi").label(HOST, f"n{i}")
        if block:
            node = node.label(BLOCK, block)
        if rack:
            node = node.label(RACK, rack)
        state.add_node(node.obj())
    return state


DC = Topology.model_validate({"name": "dc", "levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]})


def test_domains_are_label_tuples_and_nodes_missing_a_level_are_outside() -> None:
    state = rack_cluster([("b2", "r1"), ("b1", "r2"), ("b1", "r1"), ("b2", "r1"), (None, "r1"), ("b1", None)])
    index = build_index(state, DC)
    assert index.values[0] == (("b1",), ("b2",))
    assert index.values[1] == (("b1", "r1"), ("b1", "r2"), ("b2", "r1"))  # b1/r1 is not b2/r1
    assert index.ids[1].tolist() == [2, 1, 0, 2, -1, -1]  # n4 has no block, n5 no rack
    assert index.ids[2].tolist()[4:] == [-1, -1]  # outside the levels above: outside the hosts too
    assert index.parents[1].tolist() == [0, 0, 1] and index.parents[0].tolist() == [-1, -1]
    assert index.sum(np.arange(6, dtype=np.int64), 1).tolist() == [2, 1, 3]
    assert index.name(1, 2) == "b2/r1" and index.find(1, "b2/r1") == 2 and index.find(1, "b3/r1") is None


def test_capacities_sum_exactly_and_follow_bindings() -> None:
    state = rack_cluster([("b1", "r1"), ("b1", "r1"), ("b1", "r2")])
    big = make_node("big").cpu("8").memory(str(2**60)).label(BLOCK, "b1").label(RACK, "r2").obj()
    state.add_node(big)
    rows = {(d.level, d.name): d for d in domain_capacities(state, build_index(state, DC))}
    assert rows[(RACK, "b1/r1")].nodes == 2 and rows[(RACK, "b1/r1")].allocatable["cpu"] == 16_000
    assert rows[(BLOCK, "b1")].allocatable["memory"] == 3 * 8 * 2**30 + 2**60  # beyond 2**53: exact
    assert (HOST, "b1/r2/big") not in rows  # no hostname label: outside the host level


def test_the_index_cache_follows_node_changes() -> None:
    state = rack_cluster([("b1", "r1")])
    cache = DomainIndexCache()
    first = cache.index(state, DC)
    assert cache.index(state, DC) is first
    state.add_node(make_node("n9").cpu("1").memory("1Gi").label(BLOCK, "b1").label(RACK, "r9").obj())
    again = cache.index(state, DC)
    assert again is not first and again.count(1) == 2


def test_the_scheduler_keeps_indexes_of_its_topologies_only() -> None:
    """One index cache per state (the Scheduler's), which views read too; replaced topologies' go."""
    from finesched.sched.scheduler import Scheduler

    s = Scheduler(rack_cluster([("b1", "r1")]), topologies=[DC])
    first = s.topology.domains(DC)
    assert s.topology.domains(DC) is first
    racks = Topology.model_validate({"name": "dc", "levels": [{"nodeLabel": RACK}]})
    s.set_topologies([racks])
    assert s.topology.domains(racks).count(0) == 1
    s.set_topologies([racks])
    assert s.topology.domains(DC) is not first  # DC's index was dropped with it, built anew on demand
