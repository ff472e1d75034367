"""CPUAccounts (state/cpus.py): ownership, ref counts, reserved CPUs, per-NUMA arrays, pools, config.

Nodes come from the manifest builder: ``topology(sockets, numa_per_socket, cores_per_numa, threads)``
with Linux-style numbering (CPUs 0..C-1 are the first threads of cores 0..C-1, C..2C-1 the
second). So topology(2, 1, 4, 2) has cores 0-7, NUMA 0 = {0-3, 8-11}, NUMA 1 = {4-7, 12-15}.
"""

from __future__ import annotations

import tracemalloc

import pytest

from builders import make_node
from finesched.cpuset import CPUSet
from finesched.model.binding import Binding, NUMAGrant
from finesched.plugins.cpu_orchestration import AllocatedCPU
from finesched.state.cluster import ClusterState, StateError
from finesched.state.cpu_config import LABEL_NUMA_TOPOLOGY_POLICY_OLD, node_cpu_config
from finesched.state.cpus import CPUAccounts

GiB = 2**30


def node(name: str = "n1", **labels: str):
    builder = make_node(name).topology(2, 1, 4, 2).memory("64Gi").numa(2, memory="32Gi")
    for key, value in labels.items():
        builder.label(key, value)
    return builder


def binding(workload: str, cpuset: str = "", qos: str = "LSE", policy: str = "None", numa=(), node_name="n1"):
    cpus = CPUSet(cpuset)
    return Binding(
        workload=f"default/{workload}",
        node=node_name,
        qos=qos,
        requests={"cpu": str(len(cpus))} if cpus else {},
        cpuset=cpus,
        cpu_exclusive_policy=policy,
        numa=tuple(NUMAGrant(numa=n, resources=r) for n, r in numa),
    )


def attached(*nodes, max_ref_count: int = 1) -> tuple[ClusterState, CPUAccounts]:
    state = ClusterState.from_nodes([n.obj() for n in nodes])
    return state, state.attach(CPUAccounts(max_ref_count))


def test_idle_node_arrays():
    _, acc = attached(node())
    # 8 CPUs per NUMA node, all in whole free cores; 4 cores each; shared pool everything.
    assert acc.numa_avail[0, :2].tolist() == [8, 8]
    assert acc.numa_whole[0, :2].tolist() == [8, 8]
    assert acc.numa_cores_free[0, :2].tolist() == [4, 4]
    assert acc.numa_cpu_cap[0, :2].tolist() == [8000, 8000]
    assert acc.numa_mem_cap[0, :2].tolist() == [32 * GiB, 32 * GiB]
    assert acc.pools(0).shared == CPUSet("0-15") and acc.pools(0).be == CPUSet("0-15")
    assert acc.violations() == []


def test_assume_and_forget_are_inverse():
    state, acc = attached(node())
    before = {k: v.copy() for k, v in acc.arrays.items()}
    # CPUs 0 and 8 are core 0 (NUMA 0); CPU 1 is half of core 1.
    b = binding("w", "0-1,8", numa=[(0, {"cpu": "3", "memory": 4 * GiB})])
    state.assume(b)
    assert acc.numa_avail[0, :2].tolist() == [5, 8]
    assert acc.numa_whole[0, :2].tolist() == [4, 8]  # cores 2, 3 whole; core 1 lost CPU 1
    assert acc.numa_cores_free[0, :2].tolist() == [3, 4]  # core 1 still has CPU 9
    assert acc.numa_cpu_used[0, 0] == 3000 and acc.numa_mem_used[0, 0] == 4 * GiB
    assert acc.allocated(0) == (AllocatedCPU(0, "None", 1), AllocatedCPU(1, "None", 1), AllocatedCPU(8, "None", 1))
    assert acc.violations() == []
    state.forget(b.workload)
    assert all((acc.arrays[k] == v).all() for k, v in before.items())


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        pytest.param("0-1", "1-2", "already held exclusively", id="cpu-held-twice"),
        pytest.param("0", "99", "not in the node's topology", id="unknown-cpu"),
    ],
)
def test_conflicting_bindings_are_refused_and_change_nothing(first, second, message):
    state, acc = attached(node())
    state.assume(binding("a", first))
    snapshot = {k: v.copy() for k, v in acc.arrays.items()}
    with pytest.raises(StateError, match=message):
        state.assume(binding("b", second))
    assert all((acc.arrays[k] == v).all() for k, v in snapshot.items())
    assert state.check_invariants() is None


def test_reserved_cpus_are_never_held():
    n = node().set(kubelet={"cpuManagerPolicy": "static", "reservedCPUs": "0,8"})
    state, acc = attached(n)
    assert acc.reserved[0] == frozenset({0, 8})
    assert acc.numa_avail[0, 0] == 6 and acc.numa_cpu_cap[0, 0] == 6000
    assert 0 not in acc.available(0)
    with pytest.raises(StateError, match="reserved by the kubelet"):
        state.assume(binding("w", "0"))
    # the shared and BE pools include reserved CPUs (S3.2)
    assert 0 in acc.pools(0).shared and 0 in acc.pools(0).be


def test_automatic_kubelet_reservation():
    # static without reservedCPUs: capacity 16 CPUs, allocatable 14 -> packed(all, 2) = core 0 = {0, 8}
    n = node().cpu("14").set(kubelet={"cpuManagerPolicy": "static"})
    _, acc = attached(n)
    assert acc.reserved[0] == frozenset({0, 8})


def test_numa_memory_over_allocation_is_refused():
    state, _ = attached(node())
    state.assume(binding("a", numa=[(1, {"memory": 30 * GiB})]))
    with pytest.raises(StateError, match="NUMA node 1 has not"):
        state.assume(binding("b", numa=[(1, {"memory": 4 * GiB})]))
    with pytest.raises(StateError, match="NUMA node 7 is not on the node"):
        state.assume(binding("c", numa=[(7, {"memory": 1})]))


def test_max_ref_count_allows_sharing_up_to_the_limit():
    state, acc = attached(node(), max_ref_count=2)
    state.assume(binding("a", "0"))
    state.assume(binding("b", "0", policy="PCPULevel"))
    assert acc.allocated(0) == (AllocatedCPU(0, "None", 2), AllocatedCPU(0, "PCPULevel", 2))
    with pytest.raises(StateError, match="max_ref_count 2"):
        state.assume(binding("c", "0"))
    assert acc.violations() == []


def test_pools_follow_qos():
    state, acc = attached(node())
    state.assume(binding("lse", "0-1", qos="LSE"))
    state.assume(binding("lsr", "4-5", qos="LSR"))
    state.assume(binding("guaranteed", "2", qos="LS"))  # a kubelet-static Guaranteed workload: LSE-like
    pools = acc.pools(0)
    # shared = all CPUs not held by LSE/LSR (nor any cpuset); BE = all not held by LSE-like holders
    assert pools.shared == CPUSet("3,6-15")
    assert pools.be == CPUSet("3-15")
    assert pools.numa_shared == {0: CPUSet("3,8-11"), 1: CPUSet("6-7,12-15")}
    assert pools.exclusive == CPUSet("0-2,4-5")
    state.forget("default/lsr")
    assert acc.pools(0).shared == CPUSet("3-15")  # recomputed on every change
    assert acc.violations() == []


def test_node_moves_and_removal_keep_accounts_consistent():
    state, acc = attached(node("a"), node("b"), node("c"))
    state.assume(binding("w", "0-1", node_name="c"))
    state.remove_node("a")  # "c" moves into slot 0
    i = state.index["c"]
    assert acc.allocated(i)[0].cpu == 0 and acc.numa_avail[i, 0] == 6
    assert state.check_invariants() is None


def test_update_node_reassumes_bindings_and_snapshot_restores():
    state, acc = attached(node())
    state.assume(binding("w", "0-3"))
    snap = state.snapshot()
    state.update_node(node(**{"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"}).obj())
    assert acc.config[0].required_bind == "FullPCPUs" and acc.numa_avail[0, 0] == 4
    state.assume(binding("x", "4-5"))
    state.restore(snap)
    assert acc.config[0].required_bind == "" and acc.numa_avail[0, 1] == 8
    assert state.check_invariants() is None


def test_topologies_are_shared_and_memory_stays_light():
    state = ClusterState.from_nodes([make_node(f"n{k}").topology(2, 1, 32, 2).obj() for k in range(512)])
    tracemalloc.start()
    acc = state.attach(CPUAccounts())
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert all(t is acc.topo[0] for t in acc.topo[:512])  # one shared index for one shape
    assert used / 512 < 1536  # bytes per node of 128 CPUs (10,000 nodes: about 11 MB)


@pytest.mark.parametrize(
    ("labels", "policies", "kubelet", "want"),
    [
        pytest.param({}, {}, {}, {"required_bind": "", "numa_policy": "None", "kubelet_mode": False}, id="nothing"),
        pytest.param(
            {"node.koordinator.sh/cpu-bind-policy": "SpreadByPCPUs"}, {}, {},
            {"required_bind": "SpreadByPCPUs", "bind_set": True}, id="label-spread",
        ),
        # kubelet full-pcpus-only makes FullPCPUs required even over a SpreadByPCPUs label
        pytest.param(
            {"node.koordinator.sh/cpu-bind-policy": "SpreadByPCPUs"}, {},
            {"cpuManagerPolicy": "static", "options": {"full-pcpus-only": "true"}},
            {"required_bind": "FullPCPUs", "kubelet_mode": False}, id="kubelet-full-pcpus-wins",
        ),
        # static with options and no finesched policy: the kubelet's own functions
        pytest.param(
            {}, {}, {"cpuManagerPolicy": "static", "options": {"distribute-cpus-across-numa": "true"}},
            {"kubelet_mode": True, "numa_strategy": "DistributeEvenly", "strategy_set": False}, id="kubelet-mode",
        ),
        pytest.param(
            {"node.koordinator.sh/numa-allocate-strategy": "MostAllocated"}, {},
            {"cpuManagerPolicy": "static", "options": {"distribute-cpus-across-numa": "true"}},
            {"kubelet_mode": False, "numa_strategy": "MostAllocated"}, id="label-beats-kubelet-distribute",
        ),
        pytest.param(
            {LABEL_NUMA_TOPOLOGY_POLICY_OLD: "Restricted"}, {"numaTopologyPolicy": "BestEffort"}, {},
            {"numa_policy": "Restricted"}, id="older-label-name",
        ),
        pytest.param(
            {"node.koordinator.sh/numa-topology-policy": "SingleNUMANodePodLevel"}, {}, {},
            {"numa_policy": "SingleNUMANode"}, id="nrt-pod-level-form",
        ),
        pytest.param({}, {"cpuBindPolicy": "FullPCPUsOnly"}, {}, {"required_bind": "FullPCPUs"}, id="policies-field"),
    ],
)  # fmt: skip
def test_node_config(labels, policies, kubelet, want):
    builder = node(**labels).set(policies=policies, kubelet=kubelet)
    config = node_cpu_config(builder.obj())
    assert {k: getattr(config, k) for k in want} == want


class _Unchecked:
    """A node builder whose labels are set after validation (as a node that skipped it would be)."""

    def __init__(self, labels: dict[str, str]):
        self.labels = labels

    def obj(self):
        built = node().obj()
        return built.model_copy(update={"labels": {**built.labels, **self.labels}})


def test_bad_label_values_are_problems_listing_valid_values():
    # Manifests refuse these labels (tests/test_manifest.py); a node built unchecked is still caught.
    config = node_cpu_config(_Unchecked({"node.koordinator.sh/cpu-bind-policy": "Packed"}).obj())
    assert config.problems == (
        "node label node.koordinator.sh/cpu-bind-policy='Packed' is not one of None, FullPCPUsOnly, SpreadByPCPUs",
    )
    _, acc = attached(_Unchecked({"node.koordinator.sh/numa-topology-policy": "Strict"}))
    assert acc.bad_config[0] and "BestEffort, Restricted, SingleNUMANode" in acc.config[0].problems[0]


def test_memo_keys_hash_once_and_survive_pickling():
    """NodeView, NodeCPUConfig and CPURequest hash their fields once (finesched/hashed.py)."""
    import pickle

    _, acc = attached(node())
    view = acc.view(0)
    config = acc.config[0]
    for key in (view, config):
        copy = pickle.loads(pickle.dumps(key))
        assert copy == key and hash(copy) == hash(key) and {key: 1}[copy] == 1
    assert hash(config) == config._hash


def test_a_one_field_memo_key_survives_copying():
    import copy
    from dataclasses import dataclass, field

    from finesched.hashed import HashedOnce

    @dataclass(frozen=True)
    class One(HashedOnce):
        items: tuple[int, ...]
        _hash: int = field(default=0, init=False, repr=False, compare=False)
        __hash__ = HashedOnce.__hash__

    for key in (One(()), One((1,)), One((1, 2))):  # copy and deepcopy go through __reduce__, as pickle does
        for copied in (copy.copy(key), copy.deepcopy(key)):
            assert copied == key and hash(copied) == hash(key)
