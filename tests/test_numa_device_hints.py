"""NUMAAlign's device hints see a workload's deviceAllocateHint (selector, exclusivity, ApplyForAll, scope).

Source: Koordinator pkg/scheduler/plugins/deviceshare/topology_hint.go, `generateTopologyHints`: a set of NUMA
nodes is a device hint when the device allocator (which applies the hint) can allocate within it, and it
is preferred when no smaller set can. finesched counts with the allocator's own hint functions
(plugins/deviceshare/hints.py via plugins/numa_devices.py), so the NUMA node NUMAAlign picks is one where
DeviceShare finds the devices, and the SingleNUMANode filter passes no node whose reserve must fail.

Node: 2 sockets, one NUMA node each (4 cores x 2 threads), 32Gi per NUMA node; four GPUs: 0, 1 on NUMA 0
labelled model=a, 2, 3 on NUMA 1 labelled model=b; PCIe switches as each case says.
"""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched.cpuset import CPUSet
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DEVICE_REQUEST
from finesched.plugins.numa import NUMAAlign, TopologyHint
from finesched.plugins.numa_devices import device_request
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.profile import Profile
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GPU = {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "80Gi"}
MODELS = ("a", "a", "b", "b")


def node(pcie: tuple[str, ...] = ("p0", "p1", "p2", "p3"), models: tuple[str, ...] = MODELS, policy: str = ""):
    builder = make_node("n1").topology(2, 1, 4, 2).memory("64Gi").numa(2, memory="32Gi")
    for minor, (switch, model) in enumerate(zip(pcie, models, strict=True)):
        builder.device("gpu", minor, resources=GPU, labels={"model": model}, pcie=switch, numa=minor // 2)
    if policy:
        builder.set(policies={"numaTopologyPolicy": policy})
    return builder.obj()


def scheduler(*nodes) -> Scheduler:
    plugins = [{"name": n} for n in ("ResourcesFit", "NUMAAlign", "CPUOrchestration", "DeviceShare")]
    return Scheduler(ClusterState.from_nodes(list(nodes)), Profile.model_validate({"plugins": plugins}))


def workload(name: str = "w", cpu: int = 1, gpus: int = 1, hint: dict | None = None, policy: str = "") -> Workload:
    w = make_workload(name).req(cpu=str(cpu), memory="1Gi").lim(cpu=str(cpu), memory="1Gi").qos("LSR")
    w = w.request("nvidia.com/gpu", gpus)
    fields: dict[str, object] = {"deviceAllocateHint": {"gpu": hint}} if hint else {}
    if policy:
        fields["numaTopologyPolicy"] = policy
    return w.set(**fields).obj()


def H(*numa: int, preferred: bool = True) -> TopologyHint:
    return TopologyHint(frozenset(numa), preferred)


B = {"selector": {"matchLabels": {"model": "b"}}}

HINTS = [
    # no hint: one GPU fits on either NUMA node -> {0}, {1} preferred; {0, 1} holds too, not preferred
    pytest.param(node(), 1, None, [H(0), H(1), H(0, 1, preferred=False)], id="no-hint"),
    # selector model=b: only GPUs 2, 3 (NUMA 1) may be taken -> {1} preferred, {0, 1} not
    pytest.param(node(), 1, B, [H(1), H(0, 1, preferred=False)], id="selector"),
    # two GPUs in one PCIe switch: NUMA 0's GPUs share p0, NUMA 1's sit on p2 and p3 -> only {0} holds two
    # on one switch alone; {0, 1} holds them too (via p0), not preferred
    pytest.param(
        node(pcie=("p0", "p0", "p2", "p3")),
        2,
        {"requiredTopologyScope": "PCIe"},
        [H(0), H(0, 1, preferred=False)],
        id="pcie-scope",
    ),
    # the same without the scope: two GPUs per NUMA node either way
    pytest.param(node(pcie=("p0", "p0", "p2", "p3")), 2, None, [H(0), H(1), H(0, 1, preferred=False)], id="no-scope"),
    # ApplyForAll with selector model=b: every matching GPU (2 and 3, NUMA 1) -> {1}
    pytest.param(node(), 1, {**B, "allocateStrategy": "ApplyForAll"}, [H(1), H(0, 1, preferred=False)], id="apply-all"),
    # ApplyForAll over GPUs labelled b on both NUMA nodes (1 and 2): only the pair of NUMA nodes holds all of
    # them, and no single node could -> {0, 1} preferred
    pytest.param(
        node(models=("a", "b", "b", "a")),
        1,
        {**B, "allocateStrategy": "ApplyForAll"},
        [H(0, 1)],
        id="apply-all-across-numa",
    ),
]


@pytest.mark.parametrize(("built", "gpus", "hint", "want"), HINTS)
def test_device_hints(built, gpus: int, hint: dict | None, want: list[TopologyHint]) -> None:
    s = scheduler(built)
    w = workload(gpus=gpus, hint=hint)
    request = s._compiler.compile(w, request_shape(w))
    cycle = CycleState()
    s.framework.run_pre_filter(cycle, request, NodeBatch(s.state))
    numa = next(p for p in s.framework.plugins if isinstance(p, NUMAAlign))
    assert numa.device_hints(cycle, 0) == {"gpu": want}
    assert numa.device_hints(cycle, 0, single_only=True) == {"gpu": [h for h in want if len(h.affinity) == 1]}


def test_exclusive_device_level_counts_only_unused_gpus() -> None:
    # GPU 2 (model b) holds a 50 % share: DeviceLevel exclusivity leaves only GPU 3, still NUMA 1
    s = scheduler(node())
    share = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    s.schedule_one(make_workload("x").req(cpu="1", **share).set(deviceAllocateHint={"gpu": B}).obj())
    w = workload(hint={**B, "exclusivePolicy": "DeviceLevel"}, policy="SingleNUMANode")
    binding = s.schedule_one(w)
    assert binding.device_minors("gpu") == [3] and [g.numa for g in binding.numa] == [1]


@pytest.mark.parametrize("policy", ["SingleNUMANode", "Restricted"])
def test_aligned_on_the_numa_node_of_the_admitted_gpus(policy: str) -> None:
    # Without the hint in the providers, both NUMA nodes hint for one GPU and the lower id (0) wins the
    # merge; DeviceShare then finds no model=b GPU on NUMA 0 and the node fails at reserve. With it: NUMA 1.
    s = scheduler(node())
    binding = s.schedule_one(workload(hint=B, policy=policy))
    assert binding.device_minors("gpu") == [2] and [g.numa for g in binding.numa] == [1]
    assert binding.cpuset.is_subset(CPUSet("4-7,12-15"))  # socket 1 = NUMA 1: cores 4-7 and their siblings


def test_single_numa_filter_counts_only_admitted_gpus() -> None:
    # "a" (8 CPUs, a model=b GPU, SingleNUMANode) takes all of NUMA 1's CPUs with GPU 2. Then "b" wants
    # 2 CPUs and a model=b GPU on one NUMA node: NUMA 1 has GPU 3 but no CPU, NUMA 0 has CPUs but only
    # model=a GPUs. Counting every GPU, NUMA 0 would pass the filter and fail at reserve; counting the
    # admitted ones, the filter rejects the node with its reason.
    s = scheduler(node())
    first = s.schedule_one(workload("a", cpu=8, hint=B, policy="SingleNUMANode"))
    assert [g.numa for g in first.numa] == [1]
    with pytest.raises(FitError, match="cannot fit the request on a single NUMA node"):
        s.schedule_one(workload("b", cpu=2, hint=B, policy="SingleNUMANode"))


def test_device_request_reads_the_cycle() -> None:
    s = scheduler(node())
    cycle = CycleState()
    assert device_request(cycle, s.state) is None
    w = workload(hint=B)
    s.framework.run_pre_filter(cycle, s._compiler.compile(w, request_shape(w)), NodeBatch(s.state))
    found = device_request(cycle, s.state)
    assert found is not None and found[0] is cycle.get(DEVICE_REQUEST)
