"""state/pools.py: the S3.2 pools and each workload's place, and that the node agent's computation
agrees with the scheduler's CPUAccounts for any set of holders."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_node
from finesched.cpuset import CPUSet
from finesched.model.binding import Binding
from finesched.state.cluster import ClusterState
from finesched.state.cpus import CPUAccounts
from finesched.state.pools import Holder, node_pools, placement, pools_report

# topology(2, 1, 4, 2): NUMA 0 = {0-3, 8-11}, NUMA 1 = {4-7, 12-15}
NUMA = {0: CPUSet("0-3,8-11"), 1: CPUSet("4-7,12-15")}
ALL = CPUSet("0-15")


def test_lse_lsr_and_pinned_holders_shape_the_pools() -> None:
    holders = [Holder("t/lse", CPUSet("0-1"), "LSE"), Holder("t/lsr", CPUSet("4-5"), "LSR"),
               Holder("t/pinned", CPUSet("2"), "LS"), Holder("t/free", CPUSet(), "LS")]  # fmt: skip
    pools = node_pools(ALL, NUMA, holders)
    assert pools.shared == CPUSet("3,6-15")  # no cpuset's CPUs
    assert pools.be == CPUSet("3-15")  # LSR CPUs are shared with BE only
    assert pools.exclusive == CPUSet("0-2,4-5")
    assert [h.workload for h in pools.holders] == ["t/lse", "t/lsr", "t/pinned"]
    assert placement("LS", CPUSet(), (), pools).cpus == pools.shared
    assert placement("BE", CPUSet(), (), pools).cpus == pools.be
    assert placement("LSR", CPUSet("4-5"), (), pools).cpus == CPUSet("4-5")  # its own cpuset, whatever the pools
    burst = placement("LS", CPUSet(), (1,), pools)  # ConstrainedBurst: NUMA 1's shared pool
    assert (burst.cpus, burst.pool) == (CPUSet("6-7,12-15"), "shared pool of NUMA node 1")


def test_an_empty_pool_falls_back_to_every_cpu_and_says_so() -> None:
    pools = node_pools(CPUSet("0-1"), {0: CPUSet("0-1")}, [Holder("t/a", CPUSet("0-1"), "LSE")])
    where = placement("BE", CPUSet(), (), pools)
    assert where.cpus == CPUSet("0-1") and where.pool == "BE pool is empty: every CPU"


def test_report_is_koordlets_shape() -> None:
    pools = node_pools(ALL, NUMA, [Holder("t/lsr", CPUSet("4-5"), "LSR")])
    report = pools_report(pools, {0: 0, 1: 1})
    assert report["cpuSharedPools"] == [
        {"socket": 0, "node": 0, "cpuset": "0-3,8-11"},
        {"socket": 1, "node": 1, "cpuset": "6-7,12-15"},
    ]
    assert report["beCPUSharedPools"][1] == {"socket": 1, "node": 1, "cpuset": "4-7,12-15"}
    assert report["podCPUAllocs"] == [{"namespace": "t", "name": "lsr", "cpuset": "4-5", "qos": "LSR"}]


held = st.lists(
    st.tuples(st.sampled_from(["LSE", "LSR", "LS"]), st.sets(st.integers(0, 15), min_size=1, max_size=3)),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(held)
def test_the_agent_and_the_scheduler_compute_the_same_pools(holds: list[tuple[str, set[int]]]) -> None:
    state = ClusterState.from_nodes([make_node("n1").topology(2, 1, 4, 2).obj()])
    accounts = state.attach(CPUAccounts())
    taken: set[int] = set()
    holders = []
    for i, (qos, cpus) in enumerate(holds):
        if cpus & taken:
            continue  # the scheduler never holds a CPU twice
        taken |= cpus
        state.assume(Binding(workload=f"t/w{i}", node="n1", qos=qos, cpuset=CPUSet(cpus)))
        holders.append(Holder(f"t/w{i}", CPUSet(cpus), qos))
    scheduler, agent = accounts.pools(0), node_pools(ALL, NUMA, holders)
    assert (agent.shared, agent.be, agent.exclusive) == (scheduler.shared, scheduler.be, scheduler.exclusive)
    assert {n: agent.numa_shared(n) for n in NUMA} == scheduler.numa_shared
