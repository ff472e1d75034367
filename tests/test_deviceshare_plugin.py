"""DeviceShare end to end through `Scheduler`: bindings, reasons, strategies, scoring, cooperation keys,
annotations and the CLI helpers."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

import finesched.plugins.deviceshare.plugin as plugin_module
from builders import make_node, make_workload
from finesched.commands.devices import encode_node, format_grants
from finesched.errors import ValidationError
from finesched.model.binding import Binding, DeviceGrant
from finesched.plugins.deviceshare import (
    DEVICE_ALLOCATED,
    DEVICE_OFFERS,
    DEVICE_REQUEST,
    AnnotationError,
    DeviceScore,
    DeviceShare,
    format_device_allocated,
    parse_device_allocated,
)
from finesched.plugins.shared_keys import DEVICE_CHOOSER, NUMA_AFFINITY, NUMAAffinity
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import SUCCESS
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry, no_args
from finesched.sched.scheduler import Scheduler, binding_amounts
from finesched.state.cluster import ClusterState
from finesched.state.devices import STRATEGY_LABEL

GI = 2**30
BASE = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}]


def scheduler(*builders, strategy=None, extra=(), scores=("LeastRequested", "MostBalanced"), plugins=None, **profile):
    state = ClusterState.from_nodes([b.obj() for b in builders])
    share = {"name": "DeviceShare", **({"args": {"strategy": strategy}} if strategy else {})}
    entries = [*BASE, *extra, share, *({"name": s} for s in scores)]
    profile = Profile.model_validate({"name": "t", "plugins": entries, **profile})
    registry = default_registry().with_plugins(
        {"DeviceShare": DeviceShare.from_args, "DeviceScore": DeviceScore.from_args, **(plugins or {})}
    )
    return Scheduler(state, profile=profile, registry=registry)


def gpu_node(name="n1", count=2, memory="16Gi", foreign=(), **kw):
    """`count` GPUs; `foreign` = [(minor, percent)] of core and memory used outside finesched."""
    allocs = [{"type": "gpu", "minor": m, "resources": {"gpu-core": p, "gpu-memory-ratio": p}} for m, p in foreign]
    builder = make_node(name).cpu("32").memory("128Gi").gpus(count, memory=memory, **kw)
    return builder.set(foreignAllocations=allocs)


def w(name="w", **requests):
    return make_workload(name).req(cpu="1", **requests)


def gpu_minors(binding, kind="gpu"):
    return [g.minor for g in binding.devices[kind]]


def test_issue_api_example():
    s = scheduler(gpu_node())
    binding = s.schedule_one(w(**{"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}).obj())
    # ratio 50 of a 16Gi card = 8Gi = 8589934592 bytes
    assert binding.devices == {
        "gpu": [DeviceGrant(minor=0, resources={"gpu-core": 50, "gpu-memory": 8589934592, "gpu-memory-ratio": 50})]
    }
    assert parse_device_allocated(binding.annotations[DEVICE_ALLOCATED]) == binding.devices
    assert binding.requests == {"cpu": 1000, "pods": 1}  # device names never reach the scalar accounts
    s.state.check_invariants()


def test_many_shares_never_overcommit_and_release_gives_back():
    s = scheduler(gpu_node(count=2))
    placed = [s.schedule_one(w(f"w{i}", gpu=25).obj()) for i in range(8)]
    # LeastAllocated balances: 0, 1, 0, 1, ...
    assert [gpu_minors(b)[0] for b in placed] == [0, 1, 0, 1, 0, 1, 0, 1]
    with pytest.raises(FitError, match="insufficient gpu-core on any single GPU"):
        s.schedule_one(w("full", gpu=25).obj())
    s.release(placed[0])
    assert gpu_minors(s.schedule_one(w("again", gpu=25).obj())) == [0]
    s.state.check_invariants()


def test_multi_gpu_and_rdma():
    s = scheduler(gpu_node(count=4).device("rdma", 0).device("rdma", 1))
    binding = s.schedule_one(w(**{"nvidia.com/gpu": 2, "koordinator.sh/rdma": 100}).obj())
    assert gpu_minors(binding) == [0, 1] and gpu_minors(binding, "rdma") == [0]
    assert binding_amounts(binding)["gpu-core"] == 200 and binding_amounts(binding)["rdma"] == 100


def test_fit_error_reasons_per_node():
    s = scheduler(
        make_node("cpu").cpu("32").memory("64Gi"),
        gpu_node("half", count=1, memory="8Gi", foreign=[(0, 50)]),
        gpu_node("sick", count=2, healthy=False),
        gpu_node("nomem", count=1, memory=None),
    )
    with pytest.raises(FitError) as exc:
        s.schedule_one(w(**{"gpu-core": 50, "gpu-memory-ratio": 60}).obj())
    assert exc.value.reasons == {
        "node has no gpu": 1,
        "insufficient gpu-memory on any single GPU": 1,  # 50 free, 60 asked
        "gpu device unhealthy": 1,
        "GPUs report no gpu-memory (a gpu-memory-ratio share needs it)": 1,
    }
    assert not exc.value.unresolvable


def test_fit_error_when_memory_is_short_everywhere():
    s = scheduler(gpu_node("a", count=1, memory="8Gi"), gpu_node("b", count=2))
    with pytest.raises(FitError) as exc:
        s.schedule_one(w(**{"gpu-core": 10, "gpu-memory": "20Gi"}).obj())
    assert exc.value.reasons == {"insufficient gpu-memory on any single GPU": 2}
    assert exc.value.unresolvable  # no card has 20Gi at all


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        pytest.param({"gpu": 150}, "invalid resource unit koordinator.sh/gpu: 150", id="gpu-150"),
        pytest.param({"gpu-core": 50}, "invalid resource device requests: [koordinator.sh/gpu-core]", id="core-alone"),
    ],
)
def test_bad_requests_are_the_users_error(requests, message):
    s = scheduler(gpu_node())
    with pytest.raises(ValidationError) as exc:
        s.schedule_one(w(**requests).obj())
    assert message in str(exc.value) and "DeviceShare" in str(exc.value)


def test_negative_memory_is_refused_at_the_manifest():
    with pytest.raises(Exception, match="negative"):
        w(**{"gpu-core": 10, "gpu-memory": "-1Gi"}).obj()


def test_unknown_device_types():
    s = scheduler(gpu_node())
    with pytest.raises(FitError) as exc:
        s.schedule_one(w(fpga=100).obj())
    assert exc.value.reasons == {"node has no fpga": 1} and exc.value.unresolvable
    with pytest.raises(FitError, match="no node offers it"):
        s.schedule_one(w("x", **{"koordinator.sh/xpu": 100}).obj())
    # a type the manifests define is a device type (S1.4): no code change
    s2 = scheduler(gpu_node().device("xpu", 0).device("xpu", 1))
    assert gpu_minors(s2.schedule_one(w(**{"koordinator.sh/xpu": 200}).obj()), "xpu") == [0, 1]


def test_ratio_on_cards_without_memory_figure():
    s = scheduler(gpu_node(memory=None))
    with pytest.raises(FitError, match="GPUs report no gpu-memory"):
        s.schedule_one(w(gpu=50).obj())
    assert s.schedule_one(w("whole", **{"nvidia.com/gpu": 1}).obj()).devices["gpu"][0].resources == {
        "gpu-core": 100,
        "gpu-memory-ratio": 100,
    }


# Strategy precedence: workload > node (policies, label) > plugin arg ------------------------------------


@pytest.mark.parametrize(
    ("plugin_arg", "node_fields", "workload_strategy", "want"),
    [
        pytest.param(None, {}, None, 1, id="default-least"),
        pytest.param("MostAllocated", {}, None, 0, id="plugin-arg"),
        pytest.param(
            "MostAllocated", {"policies": {"deviceAllocateStrategy": "LeastAllocated"}}, None, 1, id="node-policy"
        ),
        pytest.param(None, {"labels": {STRATEGY_LABEL: "MostAllocated"}}, None, 0, id="node-label"),
        pytest.param(
            None, {"policies": {"deviceAllocateStrategy": "LeastAllocated"}}, "MostAllocated", 0, id="workload"
        ),
    ],
)
def test_strategy_precedence(plugin_arg, node_fields, workload_strategy, want):
    s = scheduler(gpu_node(foreign=[(0, 50)]).set(**node_fields), strategy=plugin_arg)
    workload = w(gpu=25)
    if workload_strategy:
        workload = workload.set(deviceAllocateStrategy=workload_strategy)
    assert gpu_minors(s.schedule_one(workload.obj())) == [want]


# Node-level scoring ----------------------------------------------------------------------------------------


def busy_and_idle():
    return gpu_node("busy", count=8, foreign=[(m, 100) for m in range(4)]), gpu_node("idle", count=8)


def test_least_requested_includes_device_shares():
    # Same cpu and memory everywhere; only GPU use differs, so the device shares decide: idle wins.
    assert scheduler(*busy_and_idle()).schedule_one(w(gpu=50).obj()).node == "idle"


def test_device_score_packs_independently_of_card_choice():
    # busy: core share (400+50)/800 = 0.5625 -> 56; idle: 50/800 -> 6. Weight 3 outvotes the spread scorers.
    s = scheduler(*busy_and_idle(), scores=("LeastRequested",), extra=[{"name": "DeviceScore", "weight": 3}])
    binding = s.schedule_one(w(gpu=50).obj())
    assert binding.node == "busy" and gpu_minors(binding) == [4]  # card level still LeastAllocated


def test_args_are_validated():
    with pytest.raises(ValidationError, match="must be one of"):
        DeviceShare.from_args({"strategy": "Spread"})
    with pytest.raises(ValidationError, match="unknown args"):
        DeviceShare.from_args({"strategy": "MostAllocated", "x": 1})
    with pytest.raises(ValidationError, match="must be one of"):
        DeviceScore.from_args({"strategy": "Binpack"})
    assert DeviceShare.from_args({}).strategy == "LeastAllocated"


def test_owns_device_names_only():
    s = scheduler(gpu_node().device("xpu", 0))
    share = next(p for p in s.framework.plugins if isinstance(p, DeviceShare))
    assert [share.owns(n) for n in ("gpu-core", "nvidia.com/gpu", "rdma", "xpu", "cpu", "memory")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]


# Cooperation through the cycle state --------------------------------------------------------------------


class PinNUMA:
    """Test double for NUMAAlign: requires NUMA node 1 on whichever node is reserved."""

    NAME: ClassVar[str] = "PinNUMA"

    def reserve(self, cycle, request, node):
        cycle.write(NUMA_AFFINITY, NUMAAffinity(node=node, numa=frozenset({1})))
        return SUCCESS

    def unreserve(self, cycle, request, node):
        cycle.delete(NUMA_AFFINITY)


class PickLast:
    """Test double for a fragmentation-aware DeviceChooser."""

    NAME: ClassVar[str] = "PickLast"
    seen: ClassVar[list] = []

    def pre_score(self, cycle, request, nodes):
        cycle.write(DEVICE_CHOOSER, self)
        return SUCCESS

    def choose(self, node, device_type, fitting, count):
        PickLast.seen.append((node, device_type, tuple(fitting), count))
        return fitting[-count:]


def test_reserve_honours_numa_affinity():
    node = gpu_node(count=4, numa=[0, 1]).numa(2)
    s = scheduler(node, extra=[{"name": "PinNUMA"}], plugins={"PinNUMA": no_args(PinNUMA)})
    assert gpu_minors(s.schedule_one(w(gpu=100).obj())) == [1]
    assert gpu_minors(s.schedule_one(w("b", gpu=100).obj())) == [3]
    with pytest.raises(FitError, match=r"on NUMA node\(s\) \[1\]"):
        s.schedule_one(w("c", gpu=100).obj())


def test_reserve_asks_the_device_chooser():
    PickLast.seen.clear()
    s = scheduler(gpu_node(count=4), extra=[{"name": "PickLast"}], plugins={"PickLast": no_args(PickLast)})
    assert gpu_minors(s.schedule_one(w(gpu=50).obj())) == [3]
    assert PickLast.seen == [(0, "gpu", (0, 1, 2, 3), 1)]


def test_offer_is_computed_once_and_published(monkeypatch):
    calls = []
    real = plugin_module.allocate_devices

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(plugin_module, "allocate_devices", counting)
    s = scheduler(gpu_node())
    seen = {}
    original = s.framework.run_pre_bind

    def spy(cycle, request, node, binding):
        seen["request"], seen["offers"] = cycle.read(DEVICE_REQUEST), cycle.read(DEVICE_OFFERS)
        return original(cycle, request, node, binding)

    s.framework.run_pre_bind = spy
    binding = s.schedule_one(w(gpu=50).obj())
    assert len(calls) == 1
    assert seen["request"].types["gpu"].count == 1
    assert seen["offers"].by_node[0].binding_devices() == binding.devices


def joint_cluster(rdma_pcie):
    devices = [
        {
            "type": "gpu",
            "minor": m,
            "pcie": "a" if m < 2 else "b",
            "resources": {"gpu-core": 100, "gpu-memory-ratio": 100},
        }
        for m in range(4)
    ] + [{"type": "rdma", "minor": 0, "pcie": rdma_pcie}]
    return scheduler(make_node("n1").cpu("8").memory("8Gi").set(devices=devices))


def test_joint_allocation_end_to_end():
    workload = w(gpu=100, rdma=100).set(deviceJointAllocate={"deviceTypes": ["gpu", "rdma"]}).obj()
    binding = joint_cluster("b").schedule_one(workload)
    assert (gpu_minors(binding), gpu_minors(binding, "rdma")) == ([2], [0])
    with pytest.raises(FitError) as exc:
        joint_cluster("c").schedule_one(workload)
    assert exc.value.reasons == {"no free gpu shares a PCIe switch with enough free rdma": 1}


def test_rebuild_from_bindings_gives_identical_accounts():
    s = scheduler(gpu_node("a", count=4), gpu_node("b", count=2).device("rdma", 0))
    for i, req in enumerate([{"gpu": 30}, {"nvidia.com/gpu": 2}, {"gpu-core": 10, "gpu-memory": "3Gi"}, {"rdma": 100}]):
        s.schedule_one(w(f"w{i}", **req).obj())
    # the start-up rebuild (S1.6): nodes + bindings from the store, then the plugins attach
    state = ClusterState.from_nodes(list(s.state.nodes), s.state.bindings.values())
    registry = default_registry().with_plugins({"DeviceShare": DeviceShare.from_args})
    rebuilt = Scheduler(state, profile=s.profile, registry=registry)
    live, again = s.state.extras["devices"], rebuilt.state.extras["devices"]
    for kind, acc in live.types.items():
        other = again.types[kind]
        for field in ("total", "free", "foreign", "hfree", "htotal"):
            assert (getattr(acc, field)[:, :2] == getattr(other, field)[:, :2]).all(), (kind, field)
    assert again.violations() == []


# Annotations ------------------------------------------------------------------------------------------------


def test_annotation_matches_koordinator_format():
    devices = {"gpu": [DeviceGrant(minor=0, resources={"gpu-core": 50, "gpu-memory": "40Gi", "gpu-memory-ratio": 50})]}
    text = (
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50",'
        '"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}'
    )
    assert format_device_allocated(devices) == text
    assert parse_device_allocated(text) == devices
    assert format_device_allocated(parse_device_allocated(text)) == text


def test_annotation_accepts_numbers_deprecated_names_and_extra_fields():
    text = json.dumps(
        {"rdma": [{"minor": 1, "resources": {"kubernetes.io/rdma": 100}, "id": "0000:3b:00.0", "extension": {}}]}
    )
    assert parse_device_allocated(text) == {"rdma": [DeviceGrant(minor=1, resources={"rdma": 100})]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{", "not JSON", id="json"),
        pytest.param("[]", "object keyed by device type", id="not-object"),
        pytest.param('{"gpu": {}}', "expected a list", id="not-list"),
        pytest.param('{"gpu": [{"minor": -1}]}', "non-negative integer", id="minor"),
        pytest.param(
            '{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-memory": "lots"}}]}', "gpu-memory", id="qty"
        ),
    ],
)
def test_annotation_errors(text, message):
    with pytest.raises(AnnotationError, match=message):
        parse_device_allocated(text)


# CLI helpers ----------------------------------------------------------------------------------------------------


def test_format_grants():
    b = Binding(
        workload="default/w",
        node="n1",
        devices={
            "gpu": [DeviceGrant(minor=0, resources={"gpu-core": 50, "gpu-memory": "20Gi", "gpu-memory-ratio": 25})],
            "rdma": [DeviceGrant(minor=1, resources={"rdma": 100})],
        },
    )
    assert format_grants(b) == "gpu 0: 50% core, 20Gi; rdma 1: 100%"
    assert format_grants(Binding(workload="default/x", node="n1")) == ""


def test_encode_node(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text(
        "apiVersion: finesched.io/v1alpha1\nkind: Node\nmetadata: {name: t4}\nspec:\n  devices:\n"
        "    - {type: gpu, minor: 0, resources: {gpu-core: 100, gpu-memory-ratio: 100}}\n"
        "    - {type: gpu, minor: 1, resources: {gpu-core: 100, gpu-memory-ratio: 100}}\n"
        "  foreignAllocations: [{type: gpu, minor: 1, resources: {gpu-core: 20, gpu-memory-ratio: 25}}]\n"
    )
    # gpu-core free [100, 80] in 7 bits: 100 + 80<<7 = 10340
    assert encode_node(path).splitlines() == [
        "t4 gpu gpu-core k=10340 count=2 bits=7 free=100,80",
        "t4 gpu gpu-memory-ratio k=9700 count=2 bits=7 free=100,75",
    ]
    with pytest.raises(ValidationError, match="no Node named"):
        encode_node(path, node="other")


def test_agent_updates_reach_the_memoized_scheduler():
    """An encoded update (agent report) changes free amounts outside bindings; the per-shape memo
    must see it, or the same shape would be sent to a node whose GPUs are now taken."""
    from finesched.codec import encode
    from finesched.state.device_wire import apply_encoded_updates

    # one reserve attempt: a stale memo would send the second workload to the full node and fail
    names = "abcdefgh"  # enough nodes that one changed node is patched, not a full re-evaluation
    s = scheduler(*(gpu_node(x, count=1) for x in names), maxReserveAttempts=1)
    assert s.framework.node_local  # every filter and score plugin is NODE_LOCAL: results are memoized
    assert s.schedule_one(w("w1", gpu=50).obj()).node == "a"
    # b's agent reports its only GPU fully used by something else
    apply_encoded_updates(s.state, {"b": {"gpu": {"gpu-core": (encode([0], 7), 1, 7)}}})
    assert s.schedule_one(w("w2", gpu=50).obj()).node == "c"  # the same request shape as w1


# Review fixes ---------------------------------------------------------------------------------------------------


def test_npu_core_alone_is_the_users_error_not_a_scalar():
    s = scheduler(gpu_node().resource("huawei.com/npu-core", 100))  # even where a scalar would fit
    with pytest.raises(ValidationError, match=r"invalid resource device requests: \[huawei.com/npu-core\]"):
        s.schedule_one(w(**{"huawei.com/npu-core": 8}).obj())


def test_bytes_share_on_cards_without_memory_figure():
    s = scheduler(gpu_node(memory=None))
    with pytest.raises(FitError) as exc:
        s.schedule_one(w(**{"gpu-core": 10, "gpu-memory": "4Gi"}).obj())
    assert exc.value.reasons == {"GPUs report no gpu-memory (a gpu-memory share needs it)": 1}


def test_manifest_defined_type_round_trips_through_koordinators_prefixed_form():
    s = scheduler(gpu_node().device("xpu", 0).device("xpu", 1))
    placed = s.schedule_one(w(**{"koordinator.sh/xpu": 50}).obj())
    text = placed.annotations[DEVICE_ALLOCATED]
    assert text == '{"xpu":[{"minor":0,"resources":{"xpu":"50"}}]}'  # written bare, as finesched names it
    koord = text.replace('"xpu":"50"', '"koordinator.sh/xpu":"50"')  # how Koordinator names it
    assert parse_device_allocated(koord) == parse_device_allocated(text) == placed.devices
    # a pod Koordinator placed: no devices on the binding, only the annotation; rebuilding takes the share
    record = placed.model_copy(update={"devices": {}, "annotations": {DEVICE_ALLOCATED: koord}})
    state = ClusterState.from_nodes(list(s.state.nodes), [record])
    rebuilt = Scheduler(
        state, profile=s.profile, registry=default_registry().with_plugins({"DeviceShare": DeviceShare.from_args})
    )
    live, again = s.state.extras["devices"], rebuilt.state.extras["devices"]
    assert (live.types["xpu"].free[:, :1] == again.types["xpu"].free[:, :1]).all()
    assert again.violations() == []
