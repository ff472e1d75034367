"""Preemption rules that must match kube-scheduler exactly, and the exact path for what the fast model cannot see.

Sources cited per case: kubernetes pkg/scheduler/framework/preemption/preemption.go (`pickOneNodeForPreemption`,
`DryRunPreemption`), plugins/defaultpreemption/default_preemption.go (`SelectVictimsOnNode`,
`filterPodsWithPDBViolation`). Nodes n1, n2, ... have 4 CPUs and 8Gi unless a case says otherwise, labelled
``node=<name>``; victims are pinned there and bound in the order listed (their start order).
"""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched.model.workload import Workload
from finesched.plugins.preemption_model import expresses
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


def cluster(*names: str, cpu: str = "4") -> Scheduler:
    nodes = [make_node(n).cpu(cpu).memory("8Gi").label("node", n).obj() for n in names]
    return Scheduler(ClusterState.from_nodes(nodes))


def pinned(name: str, node: str, cpu: int, priority: int, **fields: object) -> Workload:
    return make_workload(name).req(cpu=str(cpu)).priority(priority).selector(node=node).set(**fields).obj()


def budget(app: str, min_available: int) -> dict[str, object]:
    return {"labels": {"app": app}, "disruptionBudget": {"minAvailable": min_available, "selector": {"app": app}}}


# pickOneNodeForPreemption's sum and SelectVictimsOnNode's violation count ------------------------------
ORDER = [
    # pickOneNodeForPreemption, minSumPrioritiesScoreFunc: each victim's priority + MaxInt32 + 1. n1 evicts
    # {-100, 0, 0} (raw sum -100), n2 evicts {0, 0} (raw 0); tops are both 0. Offset sums: n1 3*2^31 - 100,
    # n2 2*2^31 -> n2 (raw sums would pick n1, three victims over two).
    pytest.param(
        [
            *(pinned("a1", "n1", 2, -100), pinned("a2", "n1", 1, 0), pinned("a3", "n1", 1, 0)),
            *(pinned("b1", "n2", 2, 0), pinned("b2", "n2", 2, 0)),
        ],
        ("n2", ["default/b1", "default/b2"], 0),
        id="offset-sum-more-victims-weigh-more",
    ),
    # The same with every priority negative: n1 {-5, -5, -5} raw -15 vs n2 {-5, -5} raw -10 -> n2.
    pytest.param(
        [
            *(pinned(f"a{i}", "n1", c, -5) for i, c in enumerate((2, 1, 1))),
            *(pinned(f"b{i}", "n2", 2, -5) for i in range(2)),
        ],
        ("n2", ["default/b0", "default/b1"], 0),
        id="offset-sum-negative-priorities",
    ),
    # SelectVictimsOnNode counts violating *victims* (numViolatingVictim), not budgets: n1's a1, a2 (prio 1)
    # are app=a with minAvailable 2 of 2 (0 disruptions allowed): both violate -> 2. n2's b (prio 5) is app=b
    # with minAvailable 1 of 1 -> 1. Fewest violations first: n2, although its victim has the higher priority
    # (counting budgets broken, 1 each, would tie and then pick n1 by priority).
    pytest.param(
        [
            *(pinned("a1", "n1", 2, 1, **budget("a", 2)), pinned("a2", "n1", 2, 1, **budget("a", 2))),
            pinned("b", "n2", 4, 5, **budget("b", 1)),
        ],
        ("n2", ["default/b"], 1),
        id="violations-count-victims",
    ),
    # filterPodsWithPDBViolation: the budget allows 1 disruption over {c1, c2}; in importance order c2 (prio 3)
    # takes it, c1 (prio 2) then violates: 1 violating victim on n1. n2's d (prio 4, no budget): 0 -> n2.
    pytest.param(
        [
            *(pinned("c1", "n1", 2, 2, **budget("c", 1)), pinned("c2", "n1", 2, 3, **budget("c", 1))),
            pinned("d", "n2", 4, 4),
        ],
        ("n2", ["default/d"], 0),
        id="first-victim-takes-the-allowed-disruption",
    ),
]


@pytest.mark.parametrize(("victims", "want"), ORDER)
def test_candidate_order(victims: list[Workload], want: tuple[str, list[str], int]) -> None:
    s = cluster("n1", "n2")
    for w in victims:
        s.schedule_one(w)
    p, why = s.find_preemption(make_workload("hi").req(cpu="4").priority(10).obj())
    assert p is not None, why
    assert (p.node, sorted(p.victim_keys), p.violations) == want


def test_violating_victims_counted_on_one_node() -> None:
    # kube-scheduler's own DryRun case "preemption with violation of same pdb", with three pods and no
    # disruption allowed: every victim violates -> 3 (counting budgets would say 1).
    s = cluster("n1", cpu="3")
    for i in range(3):
        s.schedule_one(pinned(f"e{i}", "n1", 1, 1, **budget("e", 3)))
    p, why = s.find_preemption(make_workload("hi").req(cpu="3").priority(10).obj())
    assert p is not None, why
    assert (len(p.victims), p.violations) == (3, 3)


# The exact path where the fast model cannot state a constraint -----------------------------------------
def lsr(name: str, cpu: int, priority: int, **fields: object) -> Workload:
    w = make_workload(name).req(cpu=str(cpu), memory="1Gi").lim(cpu=str(cpu), memory="1Gi").priority(priority)
    return w.set(qos="LSR", **fields).obj()


SPREAD = {"resourceSpec": {"preferredCPUBindPolicy": "SpreadByPCPUs"}}


def test_exclusive_full_pcpus_split_by_victims() -> None:
    # 1 socket, 4 cores x 2 threads (core c = CPUs c and c+4). v1, v2 (prio 1, 1 CPU, SpreadByPCPUs) pin CPU 0
    # (core 0) and CPU 1 (core 1); h (prio 20, 2 CPUs) takes core 2. The preemptor (prio 10) needs 4 CPUs as
    # whole cores (required FullPCPUs): 4 CPUs are free, but in one whole core (3). The fast model sees 4 free
    # and would evict nobody; the exact path evicts both, then reprieves v1 (older first): cores 1 and 3 are
    # whole -> fits, v1 stays; v2 back leaves one whole core -> v2 is the victim. Cpuset: cores 1 and 3.
    node = make_node("n1").cpu("8").memory("8Gi").topology(sockets=1, cores_per_numa=4, threads=2).obj()
    s = Scheduler(ClusterState.from_nodes([node]))
    placed = {
        n: s.schedule_one(lsr(n, c, p, **f))
        for n, c, p, f in [("v1", 1, 1, SPREAD), ("v2", 1, 1, SPREAD), ("h", 2, 20, {})]
    }
    assert [str(placed[n].cpuset) for n in ("v1", "v2", "h")] == ["0", "1", "2,6"]
    hi = lsr("hi", 4, 10, resourceSpec={"requiredCPUBindPolicy": "FullPCPUs"})
    p, why = s.find_preemption(hi)
    assert p is not None, why
    assert p.victim_keys == ["default/v2"] and str(p.binding.cpuset) == "1,3,5,7"
    s.apply_preemption(p)
    s.state.check_invariants()


def test_single_numa_node_with_enough_free_cpus_in_total() -> None:
    # 2 NUMA nodes of 2 CPUs; a (prio 0) on NUMA 0 and b (prio 0) on NUMA 1, 1 CPU each. A 2-CPU
    # SingleNUMANode preemptor: 2 CPUs are free, one per NUMA node; the model needs nobody evicted. Exact:
    # all out, a back (older first) -> NUMA 1 empty, fits, a stays; b back -> no NUMA node with 2 free -> b.
    node = make_node("n1").cpu("4").memory("8Gi").topology(sockets=1, numa_per_socket=2, cores_per_numa=2, threads=1)
    s = Scheduler(ClusterState.from_nodes([node.numa(2, memory="4Gi").obj()]))
    numa = {"numaTopologyPolicy": "SingleNUMANode"}
    for name in ("a", "b"):
        s.schedule_one(lsr(name, 1, 0, **numa))
    p, why = s.find_preemption(lsr("hi", 2, 10, **numa))
    assert p is not None, why
    assert p.victim_keys == ["default/b"] and [g.numa for g in p.binding.numa] == [1]


def gpu_node():
    """GPU 0 (model=a) and NIC 0 on PCIe switch p0, GPU 1 (model=b) and NIC 1 on p1."""
    node = make_node("n1").cpu("8").memory("8Gi")
    for minor, model in enumerate("ab"):
        node.device(
            "gpu",
            minor,
            resources={"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"},
            labels={"model": model},
            pcie=f"p{minor}",
        )
        node.device("rdma", minor, resources={"rdma": 100}, labels={"nic": str(minor)}, pcie=f"p{minor}")
    return node.obj()


HALF = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}


def test_device_hint_selector() -> None:
    # GPU 0 (model=a) holds h's half (prio 20), GPU 1 (model=b) holds v's whole GPU (prio 1). The preemptor
    # wants half a model=b GPU. The model sees GPU 0's free half and evicts nobody; exact: v must go.
    s = Scheduler(ClusterState.from_nodes([gpu_node()]))
    s.schedule_one(
        make_workload("h")
        .req(cpu="1", **HALF)
        .priority(20)
        .set(deviceAllocateHint={"gpu": {"selector": {"matchLabels": {"model": "a"}}}})
        .obj()
    )
    s.schedule_one(make_workload("v").req(cpu="1").request("nvidia.com/gpu", "1").priority(1).obj())
    hint = {"gpu": {"selector": {"matchLabels": {"model": "b"}}}}
    p, why = s.find_preemption(make_workload("hi").req(cpu="1", **HALF).priority(10).set(deviceAllocateHint=hint).obj())
    assert p is not None, why
    assert p.victim_keys == ["default/v"] and [g.minor for g in p.binding.devices["gpu"]] == [1]


def test_joint_allocation_same_pcie() -> None:
    # h (prio 20) holds GPU 0 (switch p0); v (prio 1) holds RDMA 1 (switch p1). GPU 1 and RDMA 0 are free,
    # one of each type, but on different switches: the joint SamePCIe request needs v's NIC.
    s = Scheduler(ClusterState.from_nodes([gpu_node()]))
    s.schedule_one(
        make_workload("h")
        .req(cpu="1")
        .request("nvidia.com/gpu", "1")
        .priority(20)
        .set(deviceAllocateHint={"gpu": {"selector": {"matchLabels": {"model": "a"}}}})
        .obj()
    )
    s.schedule_one(
        make_workload("v")
        .req(cpu="1")
        .request("koordinator.sh/rdma", "100")
        .priority(1)
        .set(deviceAllocateHint={"rdma": {"selector": {"matchLabels": {"nic": "1"}}}})
        .obj()
    )
    assert s.state.bindings["default/v"].devices["rdma"][0].minor == 1
    joint = {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}
    hi = make_workload("hi").req(cpu="1").request("nvidia.com/gpu", "1").request("koordinator.sh/rdma", "100")
    hi = hi.priority(10)
    p, why = s.find_preemption(hi.set(deviceJointAllocate=joint).obj())
    assert p is not None, why
    assert p.victim_keys == ["default/v"]
    assert {k: [g.minor for g in v] for k, v in p.binding.devices.items()} == {"gpu": [1], "rdma": [1]}


EXPRESSES = [
    # what the node model states (plugins/preemption_model.py): scalar amounts and per-device fit
    pytest.param({"requests": {"cpu": "2"}}, True, id="scalar"),
    pytest.param({"requests": {"cpu": "1", **HALF}}, True, id="gpu-share"),
    pytest.param({"requests": {"cpu": "1"}, "qos": "BE"}, True, id="best-effort"),
    pytest.param({"requests": {"cpu": "1"}, "numaTopologyPolicy": "BestEffort"}, True, id="numa-best-effort"),
    # what it does not
    pytest.param({"requests": {"cpu": "2"}, "limits": {"cpu": "2"}, "qos": "LSR"}, False, id="exclusive-cpuset"),
    pytest.param(
        {"requests": {"cpu": "1"}, "resourceSpec": {"preferredCPUBindPolicy": "ConstrainedBurst"}},
        False,
        id="constrained-burst",
    ),
    pytest.param({"requests": {"cpu": "1"}, "numaTopologyPolicy": "SingleNUMANode"}, False, id="single-numa"),
    pytest.param({"requests": {"cpu": "1"}, "numaTopologyPolicy": "Restricted"}, False, id="restricted"),
    pytest.param(
        {"requests": {"cpu": "1", **HALF}, "deviceAllocateHint": {"gpu": {"requiredTopologyScope": "PCIe"}}},
        False,
        id="device-hint",
    ),
    pytest.param(
        {
            "requests": {"cpu": "1", "nvidia.com/gpu": "1", "koordinator.sh/rdma": "100"},
            "deviceJointAllocate": {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"},
        },
        False,
        id="joint",
    ),
]


@pytest.mark.parametrize(("spec", "want"), EXPRESSES)
def test_model_expresses(spec: dict[str, object], want: bool) -> None:
    s = Scheduler(ClusterState.from_nodes([gpu_node()]))
    w = Workload.model_validate({"name": "w", **spec})
    request = s._compiler.compile(w, request_shape(w))
    cycle = CycleState()
    s.framework.run_pre_filter(cycle, request, NodeBatch(s.state))
    from finesched.plugins.deviceshare import DEVICE_REQUEST

    assert expresses(cycle, s.state, cycle.get(DEVICE_REQUEST), 0) is want


def test_node_policy_makes_the_plan_exact() -> None:
    # A node whose own policy is SingleNUMANode binds every workload to one NUMA node: the model cannot
    # say it, even for a workload without a policy (kube-scheduler's TopologyManager scope is the node's).
    node = make_node("n1").cpu("4").memory("8Gi").set(policies={"numaTopologyPolicy": "SingleNUMANode"})
    node = node.topology(sockets=1, numa_per_socket=2, cores_per_numa=2, threads=1).numa(2, memory="4Gi").obj()
    s = Scheduler(ClusterState.from_nodes([node]))
    w = make_workload("w").req(cpu="1").obj()
    request = s._compiler.compile(w, request_shape(w))
    cycle = CycleState()
    s.framework.run_pre_filter(cycle, request, NodeBatch(s.state))
    assert expresses(cycle, s.state, None, 0) is False


# Unresolvable nodes are not preemption candidates (kube-scheduler: UnschedulableAndUnresolvable) --------
def test_unresolvable_nodes_do_not_fill_the_candidate_list() -> None:
    # 20 nodes in zone b rank first (lowest index at the same priority level), each holding a prio-1 workload;
    # n20 (zone a) too. The preemptor selects zone a: the zone-b nodes could never take it (node selector), so
    # they are skipped rather than tried: the 16-candidate list is n20 alone, and n20's workload goes.
    names = [f"n{i:02d}" for i in range(21)]
    nodes = [
        make_node(n).cpu("4").memory("8Gi").label("node", n).label("zone", "a" if n == "n20" else "b").obj()
        for n in names
    ]
    s = Scheduler(ClusterState.from_nodes(nodes))
    for n in names:
        s.schedule_one(pinned(f"w-{n}", n, 4, 1))
    p, why = s.find_preemption(make_workload("hi").req(cpu="4").priority(10).selector(zone="a").obj())
    assert p is not None, why
    assert (p.node, p.victim_keys) == ("n20", ["default/w-n20"])


def test_no_candidate_when_every_node_is_unresolvable() -> None:
    s = cluster("n1", "n2", cpu="2")
    s.schedule_one(pinned("a", "n1", 2, 1))
    p, why = s.find_preemption(make_workload("hi").req(cpu="4").priority(10).obj())  # 4 > 2 allocatable everywhere
    assert p is None and why == "no node would fit even with every lower-priority workload evicted"
