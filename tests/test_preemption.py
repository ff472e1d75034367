"""DefaultPreemption: victim choice, every kube-scheduler tie-break, reprieve, Never, gangs, device precision.

Every cluster here has nodes n1, n2 (4 CPUs, 8Gi unless a row says otherwise) labelled
``node=<name>``; victims are pinned with a node selector and bound in the order listed (that
order is their start order). The preemptor asks 4 CPUs at priority 10 unless a row says otherwise.
"""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GPU1 = {"nvidia.com/gpu": "1"}


def cluster(*nodes: str, cpu: str = "4", gpus: int = 0) -> Scheduler:
    built = []
    for name in nodes:
        node = make_node(name).cpu(cpu).memory("8Gi").label("node", name)
        built.append((node.gpus(gpus) if gpus else node).obj())
    return Scheduler(ClusterState.from_nodes(built))


def pinned(name: str, node: str, cpu: int, priority: int, **fields: object) -> Workload:
    return make_workload(name).req(cpu=str(cpu)).priority(priority).selector(node=node).set(**fields).obj()


def bind(s: Scheduler, *workloads: Workload) -> None:
    for w in workloads:
        s.schedule_one(w)


def preemptor(cpu: int = 4, priority: int = 10, **fields: object) -> Workload:
    return make_workload("hi").req(cpu=str(cpu)).priority(priority).set(**fields).obj()


BUDGET_1 = {"disruptionBudget": {"minAvailable": 1}}

TIE_BREAKS = [
    # 1. fewest budget violations first: n1's only victim (priority 1) has a budget of
    #    minAvailable 1 for itself -> 1 violation; n2's (priority 2) has none -> 0 violations. n2 wins
    #    although its victim has the higher priority.
    pytest.param(
        [pinned("a", "n1", 4, 1, **BUDGET_1), pinned("b", "n2", 4, 2)], "n2", ["default/b"], id="fewest-violations"
    ),
    # 2. lowest highest-victim priority: n1 evicts {a: 5} -> 5, n2 evicts {b: 3} -> 3. n2.
    pytest.param([pinned("a", "n1", 4, 5), pinned("b", "n2", 4, 3)], "n2", ["default/b"], id="lowest-top-priority"),
    # 3. smallest sum of victim priorities at equal top priority: n1 {2, 2} -> 4, n2 {2, 1} -> 3. n2.
    pytest.param(
        [pinned("a1", "n1", 2, 2), pinned("a2", "n1", 2, 2), pinned("b1", "n2", 2, 2), pinned("b2", "n2", 2, 1)],
        "n2",
        ["default/b1", "default/b2"],
        id="smallest-priority-sum",
    ),
    # 4. fewest victims at equal top (1) and sum (2): n1 {1, 1, 0} -> 3 victims, n2 {1, 1} -> 2. n2.
    pytest.param(
        [
            pinned("a1", "n1", 2, 1),
            pinned("a2", "n1", 1, 1),
            pinned("a3", "n1", 1, 0),
            pinned("b1", "n2", 2, 1),
            pinned("b2", "n2", 2, 1),
        ],
        "n2",
        ["default/b1", "default/b2"],
        id="fewest-victims",
    ),
    # 5. latest-started victims at equal everything else: a (n1) started first, b (n2) later. n2.
    pytest.param([pinned("a", "n1", 4, 1), pinned("b", "n2", 4, 1)], "n2", ["default/b"], id="latest-started"),
    # 5'. the same with the start order swapped: b (n2) first, a (n1) later. n1 — the rule, not the node order.
    pytest.param([pinned("b", "n2", 4, 1), pinned("a", "n1", 4, 1)], "n1", ["default/a"], id="latest-started-swapped"),
]


@pytest.mark.parametrize(("victims", "node", "evicted"), TIE_BREAKS)
def test_tie_breaks(victims: list[Workload], node: str, evicted: list[str]) -> None:
    s = cluster("n1", "n2")
    bind(s, *victims)
    p, why = s.find_preemption(preemptor())
    assert p is not None, why
    assert (p.node, sorted(p.victim_keys)) == (node, evicted)
    assert p.binding.node == node


def test_reprieve_keeps_what_is_not_needed() -> None:
    # n1 (4 CPUs) holds a (1 CPU, prio 0), b (1 CPU, prio 3), c (2 CPUs, prio 1); the preemptor asks 2.
    # Evict all -> 4 free. Reprieve by priority, high first: b back -> 3 free >= 2, kept; c back -> 1
    # free < 2, a victim; a back -> 2 free >= 2, kept. Victims: only c (not the lowest-priority a).
    s = cluster("n1")
    bind(s, pinned("a", "n1", 1, 0), pinned("b", "n1", 1, 3), pinned("c", "n1", 2, 1))
    p, _ = s.find_preemption(preemptor(cpu=2))
    assert p is not None and p.victim_keys == ["default/c"]
    assert p.reasons == {"default/c": "priority 1 < 10"}


def test_never_policy_and_equal_priority_preempt_nothing() -> None:
    s = cluster("n1")
    bind(s, pinned("a", "n1", 4, 1))
    p, why = s.find_preemption(preemptor(preemptionPolicy="Never"))
    assert p is None and why == "preemptionPolicy is Never"
    # equal priority (1 = 1) without quota reclaim: not a victim
    p, why = s.find_preemption(preemptor(priority=1))
    assert p is None, why


def test_run_preempts_and_reports() -> None:
    s = cluster("n1", "n2")
    bind(s, pinned("a", "n1", 4, 5), pinned("b", "n2", 4, 3))
    s.submit([preemptor()])
    results = s.run()
    assert [r.node for r in results] == ["n2"]
    assert "default/b" not in s.state.bindings and "default/a" in s.state.bindings
    (p,) = s.take_preemptions()
    assert (p.preemptor, p.node, p.victim_keys) == ("default/hi", "n2", ["default/b"])
    s.state.check_invariants()


def test_no_preemption_flag_keeps_everything() -> None:
    s = cluster("n1")
    s.preemption = False
    bind(s, pinned("a", "n1", 4, 1))
    s.submit([preemptor()])
    (result,) = s.run()
    assert isinstance(result, FitError)
    assert "default/a" in s.state.bindings and not s.preemptions


def test_gang_victim_goes_with_its_whole_gang() -> None:
    # g1 on n1 and g2 on n2 form gang g (prio 1); c on n2 has prio 2. The preemptor (4 CPUs) could
    # evict g1 from n1 (top priority 1) — but g1 takes g2 along: victims {g1, g2}, top 1, sum 2 —
    # versus c + g2 on n2 (top 2). Top priority decides: n1 with the whole gang.
    s = cluster("n1", "n2")
    gang = {"gang": {"name": "g", "minMember": 2}}
    s.submit([pinned("g1", "n1", 4, 1, **gang), pinned("g2", "n2", 2, 1, **gang)])
    s.run()
    bind(s, pinned("c", "n2", 2, 2))
    p, _ = s.find_preemption(preemptor())
    assert p is not None and (p.node, sorted(p.victim_keys)) == ("n1", ["default/g1", "default/g2"])


def test_gang_preemptor_all_or_nothing() -> None:
    # Two members of 4 CPUs each at prio 10. n1 holds a low (prio 1) workload; n2 a prio-20 one.
    # Member 1 can preempt on n1, member 2 cannot go anywhere: nothing is evicted, nothing placed.
    s = cluster("n1", "n2")
    bind(s, pinned("low", "n1", 4, 1), pinned("top", "n2", 4, 20))
    gang = {"gang": {"name": "p", "minMember": 2}}
    members = [make_workload(f"m{i}").req(cpu="4").priority(10).set(**gang).obj() for i in range(2)]
    s.submit(members)
    results = s.run()
    assert all(isinstance(r, FitError) for r in results)
    assert set(s.state.bindings) == {"default/low", "default/top"} and not s.preemptions
    s.state.check_invariants()
    # With a third node holding another low workload, both members preempt.
    s2 = cluster("n1", "n2", "n3")
    bind(s2, pinned("low", "n1", 4, 1), pinned("top", "n2", 4, 20), pinned("low3", "n3", 4, 1))
    s2.submit(members)
    placed = s2.run()
    assert sorted(b.node for b in placed) == ["n1", "n3"]
    assert set(s2.state.bindings) == {"default/top", "default/m0", "default/m1"}


def test_victims_free_the_exact_gpu() -> None:
    # n1 (2 GPUs): each GPU holds a prio-0 and a prio-20 half: evicting the prio-0 halves frees
    # 100 gpu-core in total but no whole GPU. n2 (2 GPUs): GPU 0 holds two prio-0 halves, GPU 1 a
    # prio-20 whole GPU. A whole-GPU preemptor must go to n2, evicting both halves of GPU 0.
    s = cluster("n1", "n2", cpu="8", gpus=2)
    half = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    for name, node, prio, req in [
        ("l1", "n1", 0, half),
        ("h1", "n1", 20, half),
        ("l2", "n1", 0, half),
        ("h2", "n1", 20, half),
        ("l3", "n2", 0, half),
        ("l4", "n2", 0, half),
        ("h3", "n2", 20, GPU1),
    ]:
        w = make_workload(name).req(cpu="1", **req).priority(prio).selector(node=node)
        w = (
            w.set(deviceAllocateStrategy="MostAllocated")
            if node == "n2"
            else w.set(deviceAllocateStrategy="LeastAllocated")
        )
        s.schedule_one(w.obj())
    p, why = s.find_preemption(make_workload("hi").req(cpu="1", **GPU1).priority(10).obj())
    assert p is not None, why
    assert (p.node, sorted(p.victim_keys)) == ("n2", ["default/l3", "default/l4"])
    freed = {g.minor for v in p.victims for g in v.devices["gpu"]}
    assert [g.minor for g in p.binding.devices["gpu"]] == sorted(freed)
    s.apply_preemption(p)
    s.state.check_invariants()


def test_exclusive_cpuset_victims() -> None:
    # n1: 4 CPUs, all taken by two LSR workloads with exclusive cpusets (prio 1 and 2). An LSR
    # preemptor of 2 CPUs evicts the prio-1 one and gets exactly its CPUs.
    node = (
        make_node("n1")
        .cpu("4")
        .memory("8Gi")
        .label("node", "n1")
        .topology(sockets=1, cores_per_numa=4, threads=1)
        .obj()
    )
    s = Scheduler(ClusterState.from_nodes([node]))
    lsr = {"qos": "LSR"}
    for name, prio in [("a", 1), ("b", 2)]:
        s.schedule_one(
            make_workload(name).req(cpu="2", memory="1Gi").lim(cpu="2", memory="1Gi").priority(prio).set(**lsr).obj()
        )
    hi = make_workload("hi").req(cpu="2", memory="1Gi").lim(cpu="2", memory="1Gi").priority(10).set(**lsr).obj()
    p, why = s.find_preemption(hi)
    assert p is not None, why
    assert p.victim_keys == ["default/a"]
    assert p.binding.cpuset == p.victims[0].cpuset
    s.apply_preemption(p)
    s.state.check_invariants()


def test_undo_restores_everything() -> None:
    s = cluster("n1")
    s.auto_commit = False
    bind(s, pinned("a", "n1", 4, 1))
    s.state.commit("default/a")
    p, _ = s.find_preemption(preemptor())
    assert p is not None
    s.apply_preemption(p)
    assert s.nominated == {"default/hi": "n1"} and not s.state.is_committed("default/hi")
    s.undo_preemption(p)
    assert set(s.state.bindings) == {"default/a"} and s.state.is_committed("default/a") and not s.nominated
    s.apply_preemption(p)
    s.confirm_preemption("default/hi")
    assert s.state.is_committed("default/hi") and not s.nominated


@pytest.mark.parametrize(
    ("others", "node"),
    [
        # web1 (n1, prio 1) is the only bound app=web workload; its budget (minAvailable 1 of
        # app=web) breaks if it goes: 1 violation on n1, 0 on n2 (batch, prio 2). n2.
        pytest.param([], "n2", id="label-group-at-its-minimum"),
        # web0 on n3 (prio 20, not evictable) is also app=web: evicting web1 leaves 1 >= 1, no
        # violation; then the lower top priority (1 < 2) picks n1.
        pytest.param([pinned("web0", "n3", 4, 20, labels={"app": "web"})], "n1", id="label-group-above-minimum"),
    ],
)
def test_label_group_budget(others: list[Workload], node: str) -> None:
    s = cluster("n1", "n2", "n3")
    budget = {"disruptionBudget": {"minAvailable": 1, "selector": {"app": "web"}}, "labels": {"app": "web"}}
    bind(s, *others, pinned("web1", "n1", 4, 1, **budget), pinned("batch", "n2", 4, 2))
    if not others:
        bind(s, pinned("top", "n3", 4, 20))
    p, why = s.find_preemption(preemptor())
    assert p is not None, why
    assert p.node == node and p.violations == 0


def test_numa_alignment_victims_from_one_numa_node() -> None:
    # 4 CPUs in 2 NUMA nodes of 2. LSR 1-CPU workloads, SingleNUMANode: a (prio 0) and c (prio 5)
    # land on NUMA 0, b (prio 0) and d (prio 5) on NUMA 1. The preemptor (prio 10) needs 2 CPUs
    # on one NUMA node.
    # Node model (counts only): evict all, reprieve c, d (prio 5, older first) -> 2 free; a back ->
    # 1 free < 2: a is a victim; b likewise: victims {a, b} — but they free 1 CPU on each NUMA
    # node, and the real NUMAAlign filter refuses. So the node is retried exactly: all four out,
    # then c back (NUMA 1 empty: fits, kept), d back (no NUMA node with 2 free: victim), a back
    # (NUMA 1 still empty: kept), b back (fails: victim). Victims {b, d}: all of NUMA 1.
    node = make_node("n1").cpu("4").memory("8Gi").topology(sockets=1, numa_per_socket=2, cores_per_numa=2, threads=1)
    s = Scheduler(ClusterState.from_nodes([node.numa(2, memory="4Gi").obj()]))

    def lsr(name: str, priority: int, cpu: int = 1) -> Workload:
        w = make_workload(name).req(cpu=str(cpu), memory="512Mi").lim(cpu=str(cpu), memory="512Mi")
        return w.priority(priority).set(qos="LSR", numaTopologyPolicy="SingleNUMANode").obj()

    placed = {name: s.schedule_one(lsr(name, prio)) for name, prio in [("a", 0), ("c", 5), ("b", 0), ("d", 5)]}
    assert [placed[n].numa[0].numa for n in "acbd"] == [0, 0, 1, 1]
    p, why = s.find_preemption(lsr("hi", 10, cpu=2))
    assert p is not None, why
    assert sorted(p.victim_keys) == ["default/b", "default/d"]
    assert [g.numa for g in p.binding.numa] == [1] and str(p.binding.cpuset) == "2-3"


def test_nomination_ends_when_the_driver_commits_directly() -> None:
    s = cluster("n1")
    s.auto_commit = False
    bind(s, pinned("a", "n1", 4, 1))
    s.state.commit("default/a")
    p, _ = s.find_preemption(preemptor())
    assert p is not None
    s.apply_preemption(p)
    assert s.nominated == {"default/hi": "n1"}
    s.state.commit("default/hi")
    assert s.nominated == {}


def test_gang_budget_without_selector() -> None:
    # Gang g (g1 on n1, g2 on n2, prio 1) declares minAvailable 2 for its own gang (0 disruptions
    # allowed): evicting g1 takes g2 too (the whole gang), and each breaks the budget -> 2 violating
    # victims (kube-scheduler's SelectVictimsOnNode counts victims, not budgets). n3 holds x
    # (prio 3, no budget): 0 violations wins over the lower priority.
    s = cluster("n1", "n2", "n3")
    gang = {"gang": {"name": "g", "minMember": 2}, "disruptionBudget": {"minAvailable": 2}}
    s.submit([pinned("g1", "n1", 4, 1, **gang), pinned("g2", "n2", 4, 1, **gang)])
    s.run()
    bind(s, pinned("x", "n3", 4, 3))
    p, why = s.find_preemption(preemptor())
    assert p is not None, why
    assert (p.node, p.victim_keys, p.violations) == ("n3", ["default/x"], 0)
    # With x at priority 10 (not evictable), only the gang can go: both members, 2 violating victims.
    s2 = cluster("n1", "n2", "n3")
    s2.submit([pinned("g1", "n1", 4, 1, **gang), pinned("g2", "n2", 4, 1, **gang)])
    s2.run()
    bind(s2, pinned("x", "n3", 4, 10))
    p, why = s2.find_preemption(preemptor())
    assert p is not None, why
    assert (sorted(p.victim_keys), p.violations) == (["default/g1", "default/g2"], 2)


def test_in_flight_bindings_are_not_victims() -> None:
    # a is assumed but not committed (its driver has not written it yet): it is not evicted.
    s = cluster("n1")
    s.auto_commit = False
    bind(s, pinned("a", "n1", 4, 1))
    p, _ = s.find_preemption(preemptor())
    assert p is None
    s.state.commit("default/a")
    p, _ = s.find_preemption(preemptor())
    assert p is not None and p.victim_keys == ["default/a"]


def test_preempt_places_directly_or_preempts() -> None:
    s = cluster("n1", "n2")
    bind(s, pinned("a", "n1", 4, 1))
    assert s.preempt(preemptor()).node == "n2" and not s.preemptions  # fits: no eviction
    binding = s.preempt(make_workload("hi2").req(cpu="4").priority(10).obj())
    assert binding.node == "n1" and "default/a" not in s.state.bindings
    assert [p.victim_keys for p in s.take_preemptions()] == [["default/a"]]
    with pytest.raises(FitError):  # nothing left to evict (equal priority, no quota reclaim)
        s.preempt(make_workload("hi3").req(cpu="4").priority(10).obj())
    assert s.preemption_misses["default/hi3"] == "no node would fit even with every lower-priority workload evicted"
