"""NUMA alignment (S3.7): hint generation, the four merge policies, and NUMAAlign end to end."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.cpuset import CPUSet
from finesched.plugins.cpu_orchestration import CPUOrchestration
from finesched.plugins.numa import NUMAAlign, TopologyHint, generate_hints, merge_hints
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS, node_report
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GiB = 2**30
POLICY = "node.koordinator.sh/numa-topology-policy"
OLD_POLICY = "node.koordinator.sh/numa-topology-alignment-policy"
REGISTRY = default_registry().with_plugins(
    {"CPUOrchestration": CPUOrchestration.from_args, "NUMAAlign": NUMAAlign.from_args}
)


def H(*numa: int, preferred: bool = True) -> TopologyHint:
    return TopologyHint(frozenset(numa) if numa else None, preferred)


# Hints ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "available", "capacity", "want"),
    [
        # 2 nodes of 8: available {0: 2, 1: 6}, ask 4 -> {1} fits (preferred: size 1 = smallest that can hold 4);
        # {0, 1} fits but is wider
        pytest.param(4, {0: 2, 1: 6}, {0: 8, 1: 8}, [H(1), H(0, 1, preferred=False)], id="one-fits"),
        # ask 12 > any node's capacity: the smallest size is 2, so {0, 1} is preferred
        pytest.param(12, {0: 8, 1: 8}, {0: 8, 1: 8}, [H(0, 1)], id="needs-two"),
        # nothing fits: no hints (the provider cannot satisfy the request)
        pytest.param(4, {0: 1, 1: 1}, {0: 8, 1: 8}, [], id="none-fits"),
    ],
)
def test_generate_hints(request_, available, capacity, want):
    assert generate_hints([0, 1], request_, available, capacity) == want


@pytest.mark.parametrize(
    ("policy", "providers", "want", "admit"),
    [
        pytest.param("None", [{"cpu": [H(0, 1, preferred=False)]}], H(0, 1, preferred=False), True, id="none-admits"),
        # cpu prefers {1}, memory {0} or {1}: ANDed per combination; {1} & {1} is preferred and narrowest
        pytest.param(
            "BestEffort", [{"cpu": [H(1), H(0, 1, preferred=False)], "memory": [H(0), H(1)]}], H(1), True,
            id="best-effort-aligned",
        ),
        # BestEffort admits an unaligned best hint
        pytest.param(
            "BestEffort", [{"cpu": [H(0, 1, preferred=False)]}], H(0, 1, preferred=False), True, id="best-effort-any",
        ),
        pytest.param(
            "Restricted", [{"cpu": [H(0, 1, preferred=False)]}], H(0, 1, preferred=False), False,
            id="restricted-refuses-unpreferred",
        ),
        # needs two nodes and two is the smallest possible: preferred -> Restricted admits
        pytest.param("Restricted", [{"cpu": [H(0, 1)]}], H(0, 1), True, id="restricted-admits-preferred"),
        pytest.param(
            "SingleNUMANode", [{"cpu": [H(0), H(1)], "memory": [H(1), H(0, 1, preferred=False)]}], H(1), True,
            id="single-numa-node",
        ),
        # only a two-node hint: SingleNUMANode keeps single-node hints only -> nothing -> refused
        pytest.param("SingleNUMANode", [{"cpu": [H(0, 1)]}], H(preferred=False), False, id="single-refuses-two"),
        # a provider that cannot satisfy (no hints) spoils every combination
        pytest.param("SingleNUMANode", [{"cpu": [H(0)], "memory": []}], H(preferred=False), False, id="empty-hints"),
        # don't-care providers: any NUMA node, preferred -> admitted without a mask
        pytest.param("SingleNUMANode", [{"cpu": None}], H(), True, id="dont-care"),
        # equally good single nodes: the lower id wins (IsNarrowerThan)
        pytest.param("SingleNUMANode", [{"cpu": [H(1), H(0)]}], H(0), True, id="tie-lower-id"),
    ],
)  # fmt: skip
def test_merge_hints(policy, providers, want, admit):
    assert merge_hints(policy, [0, 1], providers) == (want, admit)


def test_unknown_merge_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid: None, BestEffort, Restricted, SingleNUMANode"):
        merge_hints("Strict", [0, 1], [])


# End to end -------------------------------------------------------------------------------------------------------


def scheduler(*nodes) -> Scheduler:
    profile = Profile.model_validate(
        {"plugins": [{"name": "ResourcesFit"}, {"name": "NUMAAlign"}, {"name": "CPUOrchestration"}]}
    )
    return Scheduler(ClusterState.from_nodes([n.obj() for n in nodes]), profile=profile, registry=REGISTRY)


def node(name="n1", policy=None, label=POLICY):
    builder = make_node(name).topology(2, 1, 4, 2).memory("64Gi").numa(2, memory="32Gi")
    return builder.label(label, policy) if policy else builder


def lse(name, cpus, memory="1Gi", **spec):
    w = make_workload(name).req(cpu=str(cpus), memory=memory).lim(cpu=str(cpus), memory=memory).qos("LSE")
    return w.set(**spec).obj()


def grants(binding) -> list[tuple[int, dict[str, int]]]:
    return [(g.numa, dict(g.resources)) for g in binding.numa]


def test_single_numa_node_aligns_cpus_and_memory():
    s = scheduler(node(policy="SingleNUMANode"))
    b = s.schedule_one(lse("a", 4, memory="24Gi"))
    assert b.cpuset.is_subset(CPUSet("0-3,8-11"))
    assert grants(b) == [(0, {"cpu": 4000, "memory": 24 * GiB})]
    # NUMA 0 has 8Gi left: 16Gi must come from NUMA 1, with its CPUs
    b2 = s.schedule_one(lse("b", 2, memory="16Gi"))
    assert b2.cpuset.is_subset(CPUSet("4-7,12-15")) and grants(b2) == [(1, {"cpu": 2000, "memory": 16 * GiB})]
    # 20Gi fits no single NUMA node any more (8Gi + 16Gi left): filtered out with the reason
    with pytest.raises(FitError, match="cannot fit the request on a single NUMA node"):
        s.schedule_one(lse("c", 1, memory="20Gi"))
    s.state.check_invariants()


def test_older_label_and_workload_policy():
    s = scheduler(node(policy="SingleNUMANode", label=OLD_POLICY))
    with pytest.raises(FitError, match="single NUMA node"):
        s.schedule_one(lse("big", 10))  # 10 CPUs > 8 per NUMA node
    # the workload's own policy applies on a node without one
    s2 = scheduler(node())
    with pytest.raises(FitError, match="single NUMA node"):
        s2.schedule_one(lse("big", 10, numaTopologyPolicy="SingleNUMANode"))
    assert len(s2.schedule_one(lse("ok", 10)).cpuset) == 10


def test_policy_mismatch_filters_the_node():
    s = scheduler(node(policy="Restricted"))
    with pytest.raises(FitError, match="NUMA Topology policy not match"):
        s.schedule_one(lse("a", 2, numaTopologyPolicy="SingleNUMANode"))


def test_restricted_allows_two_nodes_when_two_are_needed():
    s = scheduler(node(policy="Restricted"))
    b = s.schedule_one(lse("a", 12, memory="40Gi"))
    assert len(b.cpuset) == 12
    # split by ascending free: 6 CPUs and 20Gi on each node
    assert grants(b) == [(0, {"cpu": 6000, "memory": 20 * GiB}), (1, {"cpu": 6000, "memory": 20 * GiB})]


def test_best_effort_places_even_unaligned():
    s = scheduler(node(policy="BestEffort"))
    assert len(s.schedule_one(lse("a", 12)).cpuset) == 12


def test_ls_workload_with_single_numa_gets_a_shared_pool():
    s = scheduler(node(policy="SingleNUMANode"))
    b = s.schedule_one(make_workload("ls").req(cpu="2", memory="1Gi").obj())
    status = json.loads(b.annotations[ANNOTATION_RESOURCE_STATUS])
    assert status["cpuSharedPools"] == [{"socket": 0, "node": 0}]
    assert status["numaNodeResources"] == [{"node": 0, "resources": {"cpu": "2", "memory": "1Gi"}}]
    assert b.cpuset == CPUSet()


def test_be_workloads_are_not_aligned():
    s = scheduler(node(policy="SingleNUMANode"))
    b = s.schedule_one(make_workload("be").obj())
    assert b.numa == () and ANNOTATION_RESOURCE_STATUS not in b.annotations


def test_node_report_zones():
    s = scheduler(node(policy="SingleNUMANode"))
    s.schedule_one(lse("a", 4, memory="8Gi"))
    report = node_report(s.state, "n1")
    assert report["topologyPolicies"] == ["SingleNUMANode"]
    zone0 = report["zones"][0]
    assert zone0["name"] == "node-0"
    assert zone0["resources"] == [
        {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "4"},
        {"name": "memory", "capacity": "32Gi", "allocatable": "32Gi", "available": "24Gi"},
    ]
    assert report["podCPUAllocs"] == [{"namespace": "default", "name": "a", "cpuset": "0-1,8-9"}]
    assert report["cpuSharedPools"][0] == {"socket": 0, "node": 0, "cpuset": "2-3,10-11"}
    json.dumps(report)  # plain data


# Devices (with DeviceShare) ---------------------------------------------------------------------------------------


def gpu_scheduler(*nodes) -> Scheduler:
    from finesched.plugins.deviceshare.plugin import DeviceShare

    plugins = [{"name": n} for n in ("ResourcesFit", "NUMAAlign", "CPUOrchestration", "DeviceShare")]
    registry = REGISTRY.with_plugins({"DeviceShare": DeviceShare.from_args})
    state = ClusterState.from_nodes([n.obj() for n in nodes])
    return Scheduler(state, profile=Profile.model_validate({"plugins": plugins}), registry=registry)


def gpu_node(name="g1", policy="SingleNUMANode"):
    # 8 GPUs, 4 per NUMA node: minors 0-3 on NUMA 0, 4-7 on NUMA 1
    return node(name, policy=policy).gpus(8, numa=[0, 0, 0, 0, 1, 1, 1, 1])


def gpu_lse(name, cpus, gpus, memory="1Gi"):
    w = make_workload(name).req(cpu=str(cpus), memory=memory).lim(cpu=str(cpus), memory=memory).qos("LSE")
    return w.request("nvidia.com/gpu", gpus).obj()


def test_gpus_cpus_and_memory_come_from_one_numa_node():
    s = gpu_scheduler(gpu_node())
    b = s.schedule_one(gpu_lse("a", 4, 2, memory="8Gi"))
    assert b.device_minors("gpu") == [0, 1] and b.cpuset.is_subset(CPUSet("0-3,8-11"))
    assert grants(b) == [(0, {"cpu": 4000, "memory": 8 * GiB})]
    # NUMA 0 keeps 2 GPUs but only 4 CPUs: 3 GPUs + 2 CPUs must all come from NUMA 1
    b2 = s.schedule_one(gpu_lse("b", 2, 3))
    assert b2.device_minors("gpu") == [4, 5, 6] and b2.cpuset.is_subset(CPUSet("4-7,12-15"))
    s.state.check_invariants()


def test_no_single_numa_node_with_gpus_and_cpus_filters_the_node():
    s = gpu_scheduler(gpu_node())
    s.schedule_one(gpu_lse("a", 6, 1))  # NUMA 0: 3 GPUs, 2 CPUs left
    s.schedule_one(gpu_lse("b", 2, 4))  # 4 GPUs only on NUMA 1: 0 GPUs, 6 CPUs left there
    # 2 GPUs + 4 CPUs: NUMA 0 lacks CPUs, NUMA 1 lacks GPUs -> filtered out with the reason
    with pytest.raises(FitError, match="cannot fit the request on a single NUMA node"):
        s.schedule_one(gpu_lse("c", 4, 2))
    # BestEffort places it anyway
    s2 = gpu_scheduler(gpu_node(policy="BestEffort"))
    s2.schedule_one(gpu_lse("a", 6, 1))
    s2.schedule_one(gpu_lse("b", 2, 4))
    assert len(s2.schedule_one(gpu_lse("c", 4, 2)).device_minors("gpu")) == 2


def test_restricted_merges_gpu_hints_like_the_kubelet():
    s = gpu_scheduler(gpu_node(policy="Restricted"))
    # 6 GPUs need both NUMA nodes, but 2 CPUs and 1Gi prefer one: no combination is preferred by every
    # provider, so Restricted refuses (the kubelet Topology Manager's answer too)
    with pytest.raises(FitError, match="cannot align cpu, memory, gpu under NUMA policy Restricted"):
        s.schedule_one(gpu_lse("small", 2, 6))
    # 12 CPUs and 40Gi need both nodes as well: every provider prefers {0, 1} -> admitted
    b = s.schedule_one(gpu_lse("big", 12, 6, memory="40Gi"))
    assert len(b.device_minors("gpu")) == 6 and len(b.cpuset) == 12


@given(
    st.lists(st.integers(0, 16), min_size=1, max_size=4),
    st.lists(st.integers(0, 16), min_size=4, max_size=4),
    st.integers(1, 40),
)
def test_single_only_hints_are_the_single_node_hints(available, extra, request):
    ids = list(range(len(available)))
    free = dict(enumerate(available))
    capacity = {n: available[n] + extra[n] for n in ids}
    full = [h for h in generate_hints(ids, request, free, capacity) if h.affinity and len(h.affinity) == 1]
    assert generate_hints(ids, request, free, capacity, single_only=True) == full


def test_render_node_reports_shows_zones_pools_and_pinned_workloads():
    from rich.console import Console

    from finesched.commands.plan import node_reports_table
    from finesched.plugins.resource_status import node_report

    s = scheduler(node(policy="SingleNUMANode"))
    s.schedule_one(lse("a", 4, memory="8Gi"))
    console = Console(record=True, width=200)
    console.print(node_reports_table([node_report(s.state, n) for n in s.state.names]))
    text = console.export_text()
    assert "24Gi/32Gi" in text and "default/a 0-1,8-9" in text and "2-3,10-11" in text
