"""Topology-aware gangs (issue 28): required and preferred levels, member order, waits, slices.

Clusters here are blocks of racks of nodes: a node named ``b1-r2-n3`` is node 3 of rack r2 of
block b1 (labels ``topology.finesched.io/block=b1``, ``topology.finesched.io/rack=r2``,
``kubernetes.io/hostname=b1-r2-n3``), and topology ``dc`` has those three levels.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from builders import NodeBuilder, make_node, make_workload
from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL, Topology
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.sched.topology import member_order
from finesched.state.cluster import ClusterState

DC = Topology.model_validate(
    {"name": "dc", "levels": [{"nodeLabel": BLOCK_LABEL}, {"nodeLabel": RACK_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]}
)


def placed_node(name: str, builder: NodeBuilder | None = None) -> Node:
    """A node named ``b1-r2-n3`` labelled with its block, rack and hostname."""
    block, rack, _ = name.split("-")
    node = builder if builder is not None else make_node(name).cpu("8").memory("32Gi")
    return node.label(BLOCK_LABEL, block).label(RACK_LABEL, rack).label(HOSTNAME_LABEL, name).obj()


def scheduler(nodes: Iterable[Node], profile: str | dict[str, object] = "default", **kw: object) -> Scheduler:
    return Scheduler(ClusterState.from_nodes(list(nodes)), profile, topologies=[DC], **kw)  # type: ignore[arg-type]


def gang(
    name: str, size: int, *, required: str | None = None, preferred: str | None = None, slice_: dict | None = None,
    priority: int = 0, tenant: str | None = None, **req: str | int,
) -> list[Workload]:  # fmt: skip
    topology: dict[str, object] = {"name": "dc"}
    if required:
        topology["required"] = required
    if preferred:
        topology["preferred"] = preferred
    if slice_:
        topology["slice"] = slice_
    out = []
    for i in range(size):
        b = make_workload(f"{name}-{i}").req(**(req or {"cpu": "1"})).priority(priority)
        if tenant:
            b = b.tenant(tenant)
        b = b.set(gang={"name": name, "minMember": size, "topology": topology})
        out.append(b.obj())
    return out


def racks_of(bindings: Iterable[Binding]) -> set[str]:
    return {"-".join(b.node.split("-")[:2]) for b in bindings}


def test_members_are_ordered_by_name_with_numbers_as_numbers() -> None:
    ws = [make_workload(n).obj() for n in ("w-10", "w-2", "w-1", "a-3")]
    assert [w.name for w in member_order(ws)] == ["a-3", "w-1", "w-2", "w-10"]


def test_required_rack_goes_to_the_tightest_rack_that_holds_it() -> None:
    # r1: 2 nodes x 8 cpu (16 members of 1 cpu), r2: 1 node (8), r3: 1 node with 4 cpu (4).
    nodes = [placed_node(n) for n in ("b1-r1-n1", "b1-r1-n2", "b1-r2-n1")]
    nodes.append(placed_node("b1-r3-n1", make_node("b1-r3-n1").cpu("4").memory("32Gi")))
    s = scheduler(nodes)
    bound = s.schedule_gang(gang("g", 6, required=RACK_LABEL))
    assert racks_of(bound) == {"b1-r2"}  # the smallest count >= 6 is r2's 8
    assert [b.workload for b in bound] == [f"default/g-{i}" for i in range(6)]  # member index order
    # the next 6 no longer fit r2 (2 left): r1 (16) is the only rack that holds them
    assert racks_of(s.schedule_gang(gang("h", 6, required=RACK_LABEL))) == {"b1-r1"}


def test_required_level_that_no_domain_holds_waits_with_the_closest_shortfall() -> None:
    nodes = [placed_node(n) for n in ("b1-r1-n1", "b1-r2-n1", "b1-r2-n2")]
    s = scheduler(nodes)
    with pytest.raises(FitError) as info:
        s.schedule_gang(gang("big", 20, required=RACK_LABEL))
    assert info.value.message == f"gang big: topology dc: best {RACK_LABEL} b1/r2 holds 16 of 20 members: 4 need cpu"
    assert not s.state.bindings  # never spills
    # the block holds 24: required block places the same gang
    assert len(s.schedule_gang(gang("big", 20, required=BLOCK_LABEL))) == 20


def test_preferred_spills_one_level_up_then_anywhere() -> None:
    nodes = [placed_node(n) for n in ("b1-r1-n1", "b1-r2-n1", "b2-r1-n1")]
    s = scheduler(nodes)
    # 12 members: no rack (8) holds them, block b1 (16) does
    bound = s.schedule_gang(gang("p", 12, preferred=RACK_LABEL))
    assert {b.node.split("-")[0] for b in bound} == {"b1"}
    # 10 more: b1 has 4 left, b2 has 8: no block holds 10 -> anywhere
    bound = s.schedule_gang(gang("q", 10, preferred=RACK_LABEL))
    assert len(bound) == 10 and {b.node.split("-")[0] for b in bound} == {"b1", "b2"}


def test_a_missing_topology_waits_with_a_reason_then_places_after_set_topologies() -> None:
    s = scheduler([placed_node("b1-r1-n1")])
    s.set_topologies([])
    s.submit(gang("g", 2, required=RACK_LABEL))
    results = s.run()
    assert all(isinstance(r, FitError) for r in results)
    assert results[0].message == "gang g: topology dc: name: no such topology (dc)"
    s.set_topologies([DC])
    assert racks_of(b for b in s.run() if isinstance(b, Binding)) == {"b1-r1"}


def test_a_level_not_in_the_topology_waits_with_a_reason() -> None:
    s = scheduler([placed_node("b1-r1-n1")])
    with pytest.raises(FitError, match="required: is not a level of topology dc"):
        s.schedule_gang(gang("g", 2, required="example.com/zone"))


def test_nodes_without_the_level_label_are_outside_every_domain() -> None:
    bare = make_node("bare").cpu("64").memory("64Gi").obj()
    s = scheduler([bare, placed_node("b1-r1-n1")])
    assert racks_of(s.schedule_gang(gang("g", 8, required=RACK_LABEL))) == {"b1-r1"}  # not the big bare node
    with pytest.raises(FitError, match=r"best topology\.finesched\.io/rack b1/r1 holds 0 of 1 members"):
        s.schedule_gang(gang("h", 1, required=RACK_LABEL))
