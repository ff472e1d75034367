"""CPUOrchestration end to end: Scheduler + profile + registry, over nodes from the manifest builder.

Builder numbering (Linux style): topology(2, 1, 4, 2) has cores 0-7 with threads k and k+8;
NUMA/socket 0 = CPUs 0-3 and 8-11, NUMA/socket 1 = 4-7 and 12-15.
"""

from __future__ import annotations

import json

import pydantic
import pytest

from builders import make_node, make_workload
from finesched.cpuset import CPUSet
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.node import CPUTopology
from finesched.plugins.cpu_orchestration import CPUOrchestration
from finesched.plugins.numa import NUMAAlign
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

REGISTRY = default_registry().with_plugins(
    {"CPUOrchestration": CPUOrchestration.from_args, "NUMAAlign": NUMAAlign.from_args}
)
BIND_LABEL = "node.koordinator.sh/cpu-bind-policy"
STRATEGY_LABEL = "node.koordinator.sh/numa-allocate-strategy"
NUMA_POLICY_LABEL = "node.koordinator.sh/numa-topology-policy"


def scheduler(*nodes, args=None, scorer="MostAllocated") -> Scheduler:
    plugins = [
        {"name": "ResourcesFit"},
        {"name": "NUMAAlign"},
        {"name": "CPUOrchestration", "args": args or {}},
    ]
    if scorer:
        plugins.append({"name": scorer})
    profile = Profile.model_validate({"plugins": plugins})
    state = ClusterState.from_nodes([n.obj() for n in nodes])
    return Scheduler(state, profile=profile, registry=REGISTRY)


def node(name="n1", cores=4, labels=None):
    builder = make_node(name).topology(2, 1, cores, 2).memory("64Gi")
    for key, value in (labels or {}).items():
        builder.label(key, value)
    return builder


def lse(name, cpus, qos="LSE", **spec):
    w = make_workload(name).req(cpu=str(cpus), memory="1Gi").lim(cpu=str(cpus), memory="1Gi").qos(qos)
    return w.set(**spec).obj() if spec else w.obj()


def status(binding) -> dict:
    return json.loads(binding.annotations[ANNOTATION_RESOURCE_STATUS])


def test_lse_gets_whole_cores_and_the_binding_records_everything():
    s = scheduler(node())
    b = s.schedule_one(lse("a", 4))
    # FullPCPUs (default), LeastAllocated (default): node 0 and 1 tie at 8 -> node 0: cores 0, 1 = 0-1, 8-9
    assert b.cpuset == CPUSet("0-1,8-9")
    assert b.cpu_exclusive_policy == "None"
    assert [(g.numa, dict(g.resources)) for g in b.numa] == [(0, {"cpu": 4000})]
    assert status(b) == {"cpuset": "0-1,8-9", "numaNodeResources": [{"node": 0, "resources": {"cpu": "4"}}]}
    s.state.check_invariants()


def test_lsr_and_pools():
    s = scheduler(node())
    s.schedule_one(lse("a", 2))
    s.schedule_one(lse("b", 2, qos="LSR"))
    acc = s.state.extras["cpus"]
    pools = acc.pools(0)
    assert len(pools.shared) == 12 and len(pools.be) == 14  # LSR CPUs stay in the BE pool
    # LS and BE workloads get no cpuset
    assert s.schedule_one(make_workload("ls").req(cpu="1").obj()).cpuset == CPUSet()
    assert s.schedule_one(make_workload("be").obj()).cpuset == CPUSet()


@pytest.mark.parametrize(
    ("labels", "args", "spec", "want"),
    [
        # the node label makes SpreadByPCPUs required: one CPU per core -> first threads 0-3
        pytest.param({BIND_LABEL: "SpreadByPCPUs"}, {}, {}, "0-3", id="node-required-spread"),
        # preferred SpreadByPCPUs on a plain node: node 0's free CPUs round-robin over cores
        pytest.param(
            {}, {}, {"resourceSpec": {"preferredCPUBindPolicy": "SpreadByPCPUs"}}, "0-3", id="preferred-spread"
        ),
        # a FullPCPUsOnly node overrides the workload's preferred SpreadByPCPUs
        pytest.param(
            {BIND_LABEL: "FullPCPUsOnly"}, {}, {"resourceSpec": {"preferredCPUBindPolicy": "SpreadByPCPUs"}},
            "0-1,8-9", id="node-overrides-preferred",
        ),
        # profile default bind policy
        pytest.param({}, {"defaultBindPolicy": "SpreadByPCPUs"}, {}, "0-3", id="profile-default"),
        # DistributeEvenly (node label): the kubelet's distributed algorithm, groups of 2 under FullPCPUs;
        # 4 CPUs fit one NUMA node, which it picks by balance -> node 1 (4-5, 12-13)? both tie -> first
        pytest.param({STRATEGY_LABEL: "DistributeEvenly"}, {}, {}, "0-1,8-9", id="distribute-evenly-small"),
    ],
)  # fmt: skip
def test_bind_policy_resolution(labels, args, spec, want):
    s = scheduler(node(labels=labels), args=args)
    assert s.schedule_one(lse("a", 4, **spec)).cpuset == CPUSet(want)


def test_distribute_evenly_spreads_across_numa_when_needed():
    s = scheduler(node(labels={STRATEGY_LABEL: "DistributeEvenly"}))
    # 12 CPUs > 8 per NUMA node: 6 per node, whole cores (groups of 2)
    b = s.schedule_one(lse("a", 12))
    assert len(b.cpuset & CPUSet("0-3,8-11")) == 6 and len(b.cpuset & CPUSet("4-7,12-15")) == 6


@pytest.mark.parametrize(
    ("strategy", "want"),
    [
        # node 0 holds core 0 (0, 8): MostAllocated packs onto it (cores 1, 2), LeastAllocated goes to node 1
        pytest.param("MostAllocated", "1-2,9-10", id="most"),
        pytest.param("LeastAllocated", "4-5,12-13", id="least"),
    ],
)
def test_numa_allocate_strategy_label(strategy, want):
    s = scheduler(node(labels={"node.koordinator.sh/numa-allocate-strategy": strategy}))
    s.schedule_one(lse("a", 2))
    assert s.schedule_one(lse("b", 4)).cpuset == CPUSet(want)


def test_exclusive_policy_pcpu_level_avoids_shared_cores():
    s = scheduler(node(), args={"defaultBindPolicy": "SpreadByPCPUs"})
    spec = {"resourceSpec": {"preferredCPUBindPolicy": "SpreadByPCPUs", "preferredCPUExclusivePolicy": "PCPULevel"}}
    a = s.schedule_one(lse("a", 2, **spec))
    b = s.schedule_one(lse("b", 2, **spec))
    cores = {c % 8 for c in a.cpuset} & {c % 8 for c in b.cpuset}
    assert not cores and b.cpu_exclusive_policy == "PCPULevel"


def test_smt_alignment_filters_nodes_the_kubelet_would_refuse():
    s = scheduler(node(labels={"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"}))
    with pytest.raises(FitError) as info:
        s.schedule_one(lse("a", 3))
    assert "SMT Alignment Error" in str(info.value)


def test_required_policy_conflict_filters_the_node():
    s = scheduler(node(labels={BIND_LABEL: "FullPCPUsOnly"}))
    with pytest.raises(FitError, match="conflicts with the workload's required cpu bind policy"):
        s.schedule_one(lse("a", 2, resourceSpec={"requiredCPUBindPolicy": "SpreadByPCPUs"}))


def test_insufficient_cpus_reason():
    # 8 CPUs, 2 reserved for the system: the node's cpu fits 8 but only 6 can be pinned
    s = scheduler(node(cores=2).set(kubelet={"reservedCPUs": "0,4"}))
    with pytest.raises(FitError, match="1 insufficient CPUs for an exclusive cpuset"):
        s.schedule_one(lse("b", 8))
    assert len(s.schedule_one(lse("c", 6)).cpuset) == 6


def test_kubelet_static_with_options_uses_the_kubelet_functions():
    kubelet = {"cpuManagerPolicy": "static", "options": {"full-pcpus-only": "true"}, "reservedCPUs": "0,8"}
    s = scheduler(node().set(kubelet=kubelet))
    # a Guaranteed LS workload with whole CPUs gets an exclusive cpuset on a static node (S3.8) ...
    g = make_workload("g").req(cpu="4", memory="1Gi").lim(cpu="4", memory="1Gi").obj()
    b = s.schedule_one(g)
    # packed: NUMA 0 has 6 free (reserved core 0) < NUMA 1's 8 -> NUMA 0 first: whole cores 1, 2
    assert b.cpuset == CPUSet("1-2,9-10") and b.qos == "LS"
    # ... and odd requests are refused as the kubelet would (SMT alignment)
    with pytest.raises(FitError, match="SMT Alignment Error"):
        s.schedule_one(make_workload("odd").req(cpu="3", memory="1Gi").lim(cpu="3", memory="1Gi").obj())
    # a Burstable workload stays in the shared pool
    assert s.schedule_one(make_workload("burst").req(cpu="2").obj()).cpuset == CPUSet()
    assert 0 in s.state.extras["cpus"].pools(0).shared


def test_guaranteed_on_a_plain_node_stays_shared():
    s = scheduler(node())
    g = make_workload("g").req(cpu="4", memory="1Gi").lim(cpu="4", memory="1Gi").obj()
    assert s.schedule_one(g).cpuset == CPUSet()


def test_constrained_burst_binds_one_numa_shared_pool():
    s = scheduler(node())
    s.schedule_one(lse("a", 6))  # NUMA 0: 2 shared CPUs left; NUMA 1: 8
    w = make_workload("ls").req(cpu="1").lim(cpu="4").set(resourceSpec={"preferredCPUBindPolicy": "ConstrainedBurst"})
    b = s.schedule_one(w.obj())
    # limit 4 CPUs: only NUMA 1 (socket 1) has a shared pool that big
    assert status(b) == {"cpuSharedPools": [{"socket": 1, "node": 1}]}
    s.schedule_one(lse("b", 6))  # NUMA 1 now has 2 shared
    with pytest.raises(FitError, match="shared pool big enough for ConstrainedBurst"):
        s.schedule_one(w.set(name="ls2").obj())


def test_reserve_failure_tries_the_next_node():
    # n1 (Restricted) has 4 free CPUs on each NUMA node: 6 fit only across both, which Restricted refuses
    # (an idle NUMA node could hold 6, so the preferred hint size is 1) -> reserve fails on n1, n2 is used.
    s = scheduler(node("n1", labels={NUMA_POLICY_LABEL: "Restricted"}), node("n2", cores=8), scorer="")
    for name, cpus in (("x", "0-1,8-9"), ("y", "4-5,12-13")):
        s.state.assume(Binding(workload=f"default/{name}", node="n1", qos="LSE", requests={"cpu": "4"}, cpuset=cpus))
    b = s.schedule_one(lse("b", 6))
    assert b.node == "n2"


# Bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(
            lambda: make_workload("w").req(cpu="1500m").lim(cpu="1500m").qos("LSE").obj(),
            "LSE needs whole CPUs", id="lse-fractional-cpu",
        ),
        pytest.param(
            lambda: make_workload("w").req(cpu="2").lim(cpu="4").qos("LSR").obj(),
            "LSR needs limit == request", id="request-not-limit",
        ),
        pytest.param(
            lambda: make_workload("w").req(cpu="2").set(resourceSpec={"preferredCPUBindPolicy": "Packed"}).obj(),
            "'Default', 'FullPCPUs', 'SpreadByPCPUs' or 'ConstrainedBurst'", id="unknown-bind-policy",
        ),
        pytest.param(
            lambda: CPUTopology.from_list(
                [{"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 0, "core": 1, "socket": 0, "numa": 0}]
            ),
            "duplicate CPU id", id="cpu-in-two-cores",
        ),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_the_models(build, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        build()


def test_unknown_policy_in_an_annotation_is_the_users_error():
    bad = {"scheduling.koordinator.sh/resource-spec": '{"preferredCPUExclusivePolicy": "X"}'}
    with pytest.raises(pydantic.ValidationError, match="is not one of Default, None, PCPULevel, NUMANodeLevel"):
        lse("w", 2, annotations=bad)  # refused when the workload is loaded
    # A workload built without validation (model_construct) is still refused when scheduled.
    s = scheduler(node())
    w = lse("w", 2).model_copy(update={"annotations": bad})
    with pytest.raises(ValidationError, match="valid: Default, None, PCPULevel, NUMANodeLevel"):
        s.schedule_one(w)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"defaultBindPolicy": "Packed"}, "valid: FullPCPUs, SpreadByPCPUs", id="bind"),
        pytest.param(
            {"numaAllocateStrategy": "Random"}, "valid: MostAllocated, LeastAllocated, DistributeEvenly", id="strategy"
        ),
        pytest.param({"maxRefs": 2}, "valid: defaultBindPolicy, defaultExclusivePolicy", id="unknown-arg"),
        pytest.param({"maxRefCount": 0}, "maxRefCount must be an int >= 1", id="max-ref"),
    ],
)
def test_plugin_args_are_validated(args, message):
    with pytest.raises(ValidationError, match=message):
        scheduler(node(), args=args)


class _Unchecked:
    """A node builder whose labels are set after validation (as a node that skipped it would be)."""

    def __init__(self, builder, labels):
        self.builder, self.labels = builder, labels

    def obj(self):
        built = self.builder.obj()
        return built.model_copy(update={"labels": {**built.labels, **self.labels}})


def test_invalid_node_label_filters_exclusive_workloads_with_the_valid_values():
    with pytest.raises(pydantic.ValidationError, match="is not one of None, FullPCPUsOnly, SpreadByPCPUs"):
        node(labels={BIND_LABEL: "Packed"}).obj()  # refused when the node is loaded
    s = scheduler(_Unchecked(node(), {BIND_LABEL: "Packed"}))  # and filtered if it skipped validation
    with pytest.raises(FitError, match="invalid CPU/NUMA policy label"):
        s.schedule_one(lse("a", 2))
    assert s.schedule_one(make_workload("ls").req(cpu="1").obj()).node == "n1"
    assert "None, FullPCPUsOnly, SpreadByPCPUs" in s.state.extras["cpus"].config[0].problems[0]


def test_max_ref_count_comes_from_cpu_orchestration_even_when_numa_align_is_listed_first():
    # A restart: the state already holds two bindings sharing CPUs 0-1 (allowed by maxRefCount 2).
    shared = [
        Binding(workload=f"default/{name}", node="n1", qos="LSR", requests={"cpu": "2"}, cpuset="0-1")
        for name in ("a", "b")
    ]
    state = ClusterState.from_nodes([node().obj()], shared)
    profile = Profile.model_validate(
        {"plugins": [{"name": "NUMAAlign"}, {"name": "CPUOrchestration", "args": {"maxRefCount": 2}}]}
    )
    s = Scheduler(state, profile=profile, registry=REGISTRY)
    assert state.extras["cpus"].max_ref_count == 2
    state.check_invariants()
    # the shared CPUs rank after idle ones (lower ref-count first)
    assert s.schedule_one(lse("c", 2)).cpuset.isdisjoint(CPUSet("0-1"))
