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
    priority: int = 0, tenant: str | None = None, requests: dict[str, str | int] | None = None,
    spec: dict[str, object] | None = None,
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
        b = make_workload(f"{name}-{i}").priority(priority)
        for resource, amount in (requests or {"cpu": "1"}).items():
            b = b.request(resource, amount)
        if spec:
            b = b.set(**spec)
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


def test_slices_keep_consecutive_members_on_one_node() -> None:
    # one rack: n1 and n2 take 3 members each, n3 takes 2; slices of 2 on hostname: one per node
    nodes = [placed_node("b1-r1-n1", make_node("b1-r1-n1").cpu("3").memory("8Gi"))]
    nodes.append(placed_node("b1-r1-n2", make_node("b1-r1-n2").cpu("3").memory("8Gi")))
    nodes.append(placed_node("b1-r1-n3", make_node("b1-r1-n3").cpu("2").memory("8Gi")))
    s = scheduler(nodes)
    bound = s.schedule_gang(gang("sl", 6, required=RACK_LABEL, slice_={"size": 2, "required": HOSTNAME_LABEL}))
    pairs = [{bound[i].node, bound[i + 1].node} for i in range(0, 6, 2)]
    assert all(len(p) == 1 for p in pairs)  # each slice on one node
    assert len(set().union(*pairs)) == 3  # three nodes, one slice each
    s.state.check_invariants()


def test_a_slice_that_no_node_holds_waits() -> None:
    nodes = [placed_node(f"b1-r1-n{i}", make_node(f"b1-r1-n{i}").cpu("3").memory("8Gi")) for i in (1, 2)]
    s = scheduler(nodes)  # 6 members fit the rack, but slices of 4 fit no node
    with pytest.raises(FitError) as info:
        s.schedule_gang(gang("sl", 4, required=RACK_LABEL, slice_={"size": 4, "required": HOSTNAME_LABEL}))
    assert info.value.message == (
        f"gang sl: topology dc: best {RACK_LABEL} b1/r1 holds 0 of 1 slices of 4 ({HOSTNAME_LABEL}): "
        f"4 need room for 4 on one {HOSTNAME_LABEL}"
    )
    assert not s.state.bindings


def half_gpu(name: str, node: str) -> Workload:
    amounts = {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}
    return (
        make_workload(name)
        .req(cpu="100m", **{k.replace("/", "__"): v for k, v in amounts.items()})
        .set(nodeSelector={HOSTNAME_LABEL: node})
        .obj()
    )


def test_gpu_shares_a_scalar_estimate_misses_send_whole_gpu_members_to_the_other_rack() -> None:
    """Rack r1: 2 nodes of 4 GPUs, every card half used (4 GPUs of scalar room, no whole card);
    rack r2: 2 nodes of 2 free cards (4 whole GPUs, more cpu). By scalar totals r1 is the tighter
    fit for 4 one-GPU members; only r2 holds them."""
    nodes = [placed_node(f"b1-r1-n{i}", make_node(f"b1-r1-n{i}").cpu("4").memory("64Gi").gpus(4)) for i in (1, 2)]
    nodes += [placed_node(f"b1-r2-n{i}", make_node(f"b1-r2-n{i}").cpu("16").memory("64Gi").gpus(2)) for i in (1, 2)]
    s = scheduler(nodes)
    for i in (1, 2):
        for k in range(4):
            s.schedule_one(half_gpu(f"share-{i}-{k}", f"b1-r1-n{i}"))
    bound = s.schedule_gang(gang("train", 4, required=RACK_LABEL, requests={"cpu": "1", "nvidia.com/gpu": "1"}))
    assert racks_of(bound) == {"b1-r2"}
    s.state.check_invariants()


def test_exclusive_cpusets_a_scalar_estimate_misses_send_full_core_members_to_the_other_rack() -> None:
    """Rack r1: one 8-CPU node (4 cores x 2 threads) with one thread of every core taken: 4 CPUs
    free by scalar, no whole core. Rack r2: a 16-CPU node. Two members of 2 CPUs on whole cores
    (FullPCPUs) fit r1 by scalar (the tighter fit) but only r2 in truth."""
    r1 = make_node("b1-r1-n1").topology(1, 1, 4, 2).memory("64Gi")
    r2 = make_node("b1-r2-n1").topology(1, 1, 8, 2).memory("64Gi")
    s = scheduler([placed_node("b1-r1-n1", r1), placed_node("b1-r2-n1", r2)])
    spread = {"requiredCPUBindPolicy": "SpreadByPCPUs"}
    filler = make_workload("filler").req(cpu="4", memory="1Gi").lim(cpu="4", memory="1Gi").qos("LSE")
    bound_filler = s.schedule_one(filler.set(resourceSpec=spread, nodeSelector={RACK_LABEL: "r1"}).obj())
    assert len(bound_filler.cpuset) == 4  # one thread of each of the 4 cores
    two = {"cpu": "2", "memory": "1Gi"}
    full = {"resourceSpec": {"requiredCPUBindPolicy": "FullPCPUs"}, "qos": "LSE", "limits": two}
    members = gang("cores", 2, required=RACK_LABEL, requests=two, spec=full)
    bound = s.schedule_gang(members)
    assert racks_of(bound) == {"b1-r2"}
    s.state.check_invariants()


def test_preemption_evicts_inside_one_domain_only() -> None:
    nodes = [placed_node(n, make_node(n).cpu("4").memory("8Gi")) for n in ("b1-r1-n1", "b1-r2-n1")]
    s = scheduler(nodes)
    low_a = make_workload("low-a").req(cpu="3").selector(**{RACK_LABEL: "r1"}).obj()
    low_b = make_workload("low-b").req(cpu="2").selector(**{RACK_LABEL: "r2"}).obj()
    s.schedule_one(low_a)
    s.schedule_one(low_b)
    # 4 members of 1 cpu at priority 10: no rack holds them (r1 has 1 free, r2 has 2); anywhere
    # they would fit with one eviction spread over both racks; inside r2 evicting low-b does it
    s.submit(gang("hi", 4, required=RACK_LABEL, priority=10))
    results = s.run()
    assert all(isinstance(r, Binding) for r in results)
    assert racks_of(results) == {"b1-r2"}  # type: ignore[arg-type]
    victims = [v.workload for p in s.take_preemptions() for v in p.victims]
    assert victims == ["default/low-b"] and "default/low-a" in s.state.bindings
    s.state.check_invariants()


def test_a_topology_gang_over_its_tenant_quota_waits_whole() -> None:
    from finesched.model.tenant import Tenant
    from finesched.sched.diagnosis import QuotaWait

    s = scheduler([placed_node("b1-r1-n1")], tenants=[Tenant(name="t", quota={"cpu": "3"})])
    s.submit(gang("q", 4, required=RACK_LABEL, tenant="t"))
    results = s.run()
    assert len(results) == 4 and all(isinstance(r, QuotaWait) for r in results)
    assert not s.state.bindings


@pytest.mark.parametrize(("policy", "waiting"), [("BestFit", 1), ("KeepDomainsWhole", 0)])
def test_keep_domains_whole_leaves_room_for_the_gangs_still_waiting(policy: str, waiting: int) -> None:
    """r1 holds 6 members, r2 holds 8. A 2-member gang, then two 6-member gangs wait. BestFit takes
    r1 (the tightest) and leaves (4, 8): one 6-gang fits. KeepDomainsWhole scores r1: 6//6 - 4//6
    = 1 gang of 6 lost, r2: 8//6 - 6//6 = 0, so it takes r2 and leaves (6, 6): both fit."""
    nodes = [placed_node("b1-r1-n1", make_node("b1-r1-n1").cpu("6").memory("8Gi")), placed_node("b1-r2-n1")]
    profile = {"name": "p", "plugins": [{"name": "ResourcesFit"}, {"name": "LeastRequested"}], "topologyPolicy": policy}
    s = scheduler(nodes, profile)
    s.submit(gang("small", 2, required=RACK_LABEL, priority=5))
    s.submit(gang("six-a", 6, required=RACK_LABEL) + gang("six-b", 6, required=RACK_LABEL))
    results = s.run()
    assert sum(isinstance(r, FitError) for r in results) == 6 * waiting
    s.state.check_invariants()


@pytest.mark.parametrize(("policy", "waiting"), [("BestFit", 8), ("KeepDomainsWhole", 0)])
def test_keep_domains_whole_judges_a_rack_with_its_block(policy: str, waiting: int) -> None:
    """Block b1 = racks r1 (2 cpu) + r2 (6 cpu), block b2 = r3 (3) + r4 (3). A 2-member rack gang,
    then an 8-member gang that needs a whole block. BestFit takes r1, the tightest rack, and leaves b1
    with 6: the block gang waits. KeepDomainsWhole adds each rack's block to its loss: r1 costs b1's
    only gang of 8 (8//8 - 6//8 = 1), r3 costs nothing (6//8 - 4//8 = 0); it takes r3 and the
    block gang fits in b1."""
    sizes = {"b1-r1-n1": "2", "b1-r2-n1": "6", "b2-r3-n1": "3", "b2-r4-n1": "3"}
    nodes = [placed_node(name, make_node(name).cpu(cpu).memory("8Gi")) for name, cpu in sizes.items()]
    profile = {"name": "p", "plugins": [{"name": "ResourcesFit"}, {"name": "LeastRequested"}], "topologyPolicy": policy}
    s = scheduler(nodes, profile)
    s.submit(gang("small", 2, required=RACK_LABEL, priority=5))
    s.submit(gang("block", 8, required=BLOCK_LABEL))
    results = s.run()
    assert sum(isinstance(r, FitError) for r in results) == waiting
    s.state.check_invariants()


def test_profile_topology_policy_is_validated() -> None:
    from finesched.errors import ValidationError
    from finesched.sched.profile import Profile

    assert Profile.parse({"plugins": [{"name": "ResourcesFit"}]}).topology_policy == "BestFit"
    with pytest.raises(ValidationError, match="topologyPolicy"):
        Profile.parse({"plugins": [{"name": "ResourcesFit"}], "topologyPolicy": "Random"})


def test_whole_gpu_members_wait_naming_the_rack_that_holds_most_by_real_fit() -> None:
    """r1's 8 half-used cards hold no whole-GPU member (a scalar estimate would say 4); r2's node has
    2 free cards: r2 is the closest, and the rest need GPUs."""
    nodes = [placed_node(f"b1-r1-n{i}", make_node(f"b1-r1-n{i}").cpu("4").memory("64Gi").gpus(4)) for i in (1, 2)]
    nodes.append(placed_node("b1-r2-n1", make_node("b1-r2-n1").cpu("16").memory("64Gi").gpus(2)))
    s = scheduler(nodes)
    for i in (1, 2):
        for k in range(4):
            s.schedule_one(half_gpu(f"share-{i}-{k}", f"b1-r1-n{i}"))
    before = dict(s.state.bindings)
    with pytest.raises(FitError) as info:
        s.schedule_gang(gang("train", 4, required=RACK_LABEL, requests={"cpu": "1", "nvidia.com/gpu": "1"}))
    assert (
        info.value.message
        == f"gang train: topology dc: best {RACK_LABEL} b1/r2 holds 2 of 4 members: 2 need nvidia.com/gpu"
    )
    assert dict(s.state.bindings) == before


def test_full_core_members_wait_naming_the_exclusive_cpuset_they_need() -> None:
    r1 = make_node("b1-r1-n1").topology(1, 1, 4, 2).memory("64Gi")
    s = scheduler([placed_node("b1-r1-n1", r1)])
    filler = make_workload("filler").req(cpu="4", memory="1Gi").lim(cpu="4", memory="1Gi").qos("LSE")
    s.schedule_one(filler.set(resourceSpec={"requiredCPUBindPolicy": "SpreadByPCPUs"}).obj())
    two = {"cpu": "2", "memory": "1Gi"}
    full = {"resourceSpec": {"requiredCPUBindPolicy": "FullPCPUs"}, "qos": "LSE", "limits": two}
    with pytest.raises(FitError) as info:  # 4 CPUs free by scalar, but no whole core
        s.schedule_gang(gang("cores", 2, required=RACK_LABEL, requests=two, spec=full))
    assert info.value.message == (
        f"gang cores: topology dc: best {RACK_LABEL} b1/r1 holds 0 of 2 members: 2 need CPUs for an exclusive cpuset"
    )


def test_preferred_gang_preempts_in_one_domain_before_spilling() -> None:
    nodes = [placed_node(n, make_node(n).cpu("4").memory("8Gi")) for n in ("b1-r1-n1", "b1-r2-n1")]
    s = scheduler(nodes)
    s.schedule_one(make_workload("low-a").req(cpu="3").selector(**{RACK_LABEL: "r1"}).obj())
    s.schedule_one(make_workload("low-b").req(cpu="2").selector(**{RACK_LABEL: "r2"}).obj())
    s.submit(gang("hi", 4, preferred=RACK_LABEL, priority=10))
    results = s.run()
    assert racks_of(results) == {"b1-r2"}  # type: ignore[arg-type]
    assert [v.workload for p in s.take_preemptions() for v in p.victims] == ["default/low-b"]


@pytest.mark.parametrize("profile", ["default", "spread"])
def test_consecutive_members_share_a_node_inside_the_domain(profile: str) -> None:
    """Without slices, members go to the rack's nodes in index order, filling one node before the
    next (Kueue's descent), whatever the profile's node scores prefer: ranks 0-1 share a node,
    ranks 2-3 the other, and a third node of the rack stays free."""
    nodes = [placed_node(n) for n in ("b1-r1-n1", "b1-r1-n2", "b1-r1-n3")]
    nodes.append(placed_node("b1-r1-n0", make_node("b1-r1-n0").cpu("1").memory("32Gi")))  # room for one
    s = scheduler(nodes, profile)
    bound = s.schedule_gang(gang("g", 4, required=RACK_LABEL, requests={"cpu": "4"}))
    on = [b.node for b in bound]
    assert on[0] == on[1] and on[2] == on[3] and on[0] != on[2], on
    assert len(set(on)) == 2


def test_a_wait_names_what_the_closest_domain_lacks_not_what_other_nodes_lack() -> None:
    """Every GPU taken: the reason speaks of the racks' cards, not of a GPU-less node elsewhere
    (whose "node has no gpu" is the reason of the whole cluster, not of the closest rack)."""
    gpus = [placed_node(n, make_node(n).cpu("8").memory("32Gi").gpus(2, memory="16Gi"))
            for n in ("b1-r1-n1", "b1-r1-n2", "b1-r2-n1", "b1-r2-n2")]  # fmt: skip
    s = scheduler([*gpus, make_node("cpu-only").cpu("8").memory("32Gi").obj()])
    whole = {"cpu": "500m", "gpu-core": 100, "gpu-memory-ratio": 100}
    s.schedule_gang(gang("a", 4, required=RACK_LABEL, requests=whole))
    s.schedule_gang(gang("b", 4, required=RACK_LABEL, requests=whole))
    with pytest.raises(FitError) as info:
        s.schedule_gang(gang("c", 2, required=RACK_LABEL, requests=whole))
    assert info.value.message == (
        f"gang c: topology dc: best {RACK_LABEL} b1/r1 holds 0 of 2 members: 2 need gpu-core on any single GPU, "
        "gpu-memory on any single GPU"
    )
    assert "node has no gpu" not in info.value.reasons


def test_a_sliced_gang_preempts_inside_its_slices_domains() -> None:
    """Two hosts of 4 cpu in one rack, each holding a low-priority workload of 3 cpu: no host holds
    a slice of 2 members of 2 cpu now. A high-priority gang of 4 in slices of 2 per host evicts one
    workload per host and puts each slice on one host."""
    nodes = [placed_node(n, make_node(n).cpu("4").memory("8Gi")) for n in ("b1-r1-n1", "b1-r1-n2")]
    s = scheduler(nodes)
    for i, host in enumerate(("b1-r1-n1", "b1-r1-n2")):
        s.schedule_one(make_workload(f"low-{i}").req(cpu="3").selector(**{HOSTNAME_LABEL: host}).obj())
    two = {"cpu": "2"}
    s.submit(gang("hi", 4, required=RACK_LABEL, slice_={"size": 2, "required": HOSTNAME_LABEL}, priority=10,
                  requests=two))  # fmt: skip
    results = s.run()
    assert all(isinstance(r, Binding) for r in results), results
    on = {r.workload: r.node for r in results if isinstance(r, Binding)}
    assert on["default/hi-0"] == on["default/hi-1"] != on["default/hi-2"] == on["default/hi-3"]
    victims = sorted(v.workload for p in s.take_preemptions() for v in p.victims)
    assert victims == ["default/low-0", "default/low-1"]
    s.state.check_invariants()
