"""deviceAllocateHint end to end through `Scheduler`: selector, allocateStrategy, requiredTopologyScope,
exclusivePolicy, validation (errors naming the field path), and filter/allocator agreement."""

from __future__ import annotations

import pytest
from pydantic import ValidationError as PydanticError

from builders import make_node, make_workload
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import InvalidDeviceRequest, normalize_device_request
from finesched.plugins.deviceshare.plugin import DeviceShare
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

BASE = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}, {"name": "DeviceShare"}, {"name": "LeastRequested"}]


def scheduler(*builders):
    state = ClusterState.from_nodes([b.obj() for b in builders])
    profile = Profile.model_validate({"name": "t", "plugins": BASE})
    registry = default_registry().with_plugins({"DeviceShare": DeviceShare.from_args})
    return Scheduler(state, profile=profile, registry=registry)


def base(name="n1"):
    return make_node(name).cpu("32").memory("128Gi")


def nics(builder, roles, pcie=None, numa=None):
    """rdma devices 0..n-1 with label role=roles[i]; pcie/numa per device when given."""
    for i, role in enumerate(roles):
        extra = {}
        if pcie is not None:
            extra["pcie"] = pcie[i]
        if numa is not None:
            extra["numa"] = numa[i]
        builder = builder.device("rdma", i, labels={"role": role}, **extra)
    return builder


def w(name="w", hint=None, **requests):
    builder = make_workload(name).req(cpu="1", **requests)
    if hint is not None:
        builder = builder.set(deviceAllocateHint=hint)
    return builder.obj()


def minors(binding, kind="rdma"):
    return [g.minor for g in binding.devices[kind]]


RDMA = "koordinator.sh/rdma"


# Selector -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"matchLabels": {"role": "storage"}}, [1]),
        ({"matchExpressions": [{"key": "role", "operator": "In", "values": ["storage", "compute"]}]}, [0]),
        ({"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["compute"]}]}, [1]),
        ({"matchExpressions": [{"key": "role", "operator": "Exists"}]}, [0]),
        ({"matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}, [2]),
    ],
)
def test_selector_picks_only_matching_devices(selector, expected):
    node = base().device("rdma", 0, labels={"role": "compute"}).device("rdma", 1, labels={"role": "storage"})
    s = scheduler(node.device("rdma", 2))
    binding = s.schedule_one(w(hint={"rdma": {"selector": selector}}, **{RDMA: 100}))
    assert minors(binding) == expected
    s.state.check_invariants()


def test_selector_no_match_rejects_node_with_reason_naming_the_hint():
    s = scheduler(nics(base("a"), ["compute", "compute"]), nics(base("b"), ["storage"]))
    hint = {"rdma": {"selector": {"matchLabels": {"role": "storage"}}}}
    assert s.schedule_one(w(hint=hint, **{RDMA: 100})).node == "b"
    with pytest.raises(FitError) as exc:
        s.schedule_one(w("w2", hint=hint, **{RDMA: 100}))
    assert exc.value.reasons == {
        "deviceAllocateHint rdma: no healthy rdma device matches the selector": 1,  # node a
        "insufficient free rdma devices": 1,  # node b: its one matching NIC is taken
    }


def test_selector_matching_devices_full_rejects_node():
    s = scheduler(nics(base(), ["storage", "compute"]))
    hint = {"rdma": {"selector": {"matchLabels": {"role": "storage"}}}}
    s.schedule_one(w("a", hint=hint, **{RDMA: 100}))
    with pytest.raises(FitError) as exc:
        s.schedule_one(w("b", hint=hint, **{RDMA: 100}))
    assert exc.value.reasons == {"deviceAllocateHint rdma: 0 matching free rdma devices, needs 1": 1}
    # without the hint the other NIC is still free
    assert minors(s.schedule_one(w("c", **{RDMA: 100}))) == [1]


# allocateStrategy ---------------------------------------------------------------------------------


def test_requests_as_count_takes_whole_devices():
    s = scheduler(nics(base(), ["a", "a", "a"]))
    binding = s.schedule_one(w(hint={"rdma": {"allocateStrategy": "RequestsAsCount"}}, **{RDMA: 2}))
    assert minors(binding) == [0, 1]
    assert all(g.resources == {"rdma": 100} for g in binding.devices["rdma"])
    with pytest.raises(FitError, match="insufficient"):
        s.schedule_one(w("w2", hint={"rdma": {"allocateStrategy": "RequestsAsCount"}}, **{RDMA: 2}))


def test_requests_as_count_for_gpu_shortcut_and_rejected_for_shares():
    hint = {"gpu": {"allocateStrategy": "RequestsAsCount"}}
    req = normalize_device_request(
        {"koordinator.sh/gpu": 3},
        hints=Workload.model_validate({"name": "x", "deviceAllocateHint": hint}).device_allocate_hint,
    )
    assert req.types["gpu"].count == 3 and req.types["gpu"].per_device == {"gpu-core": 100, "gpu-memory-ratio": 100}
    with pytest.raises(InvalidDeviceRequest, match=r"deviceAllocateHint\.gpu\.allocateStrategy RequestsAsCount"):
        normalize_device_request(
            {"gpu-core": 50, "gpu-memory-ratio": 50},
            hints=Workload.model_validate({"name": "x", "deviceAllocateHint": hint}).device_allocate_hint,
        )


def test_apply_for_all_takes_every_matching_device():
    s = scheduler(nics(base(), ["x", "x", "y"]))
    hint = {"rdma": {"allocateStrategy": "ApplyForAll", "selector": {"matchLabels": {"role": "x"}}}}
    binding = s.schedule_one(w(hint=hint, **{RDMA: 50}))
    assert minors(binding) == [0, 1]
    assert [g.resources["rdma"] for g in binding.devices["rdma"]] == [50, 50]
    s.schedule_one(w("fill", **{RDMA: 100}))  # takes minor 2, the only one with 100 free
    binding = s.schedule_one(w("again", hint=hint, **{RDMA: 50}))
    assert minors(binding) == [0, 1]
    with pytest.raises(FitError) as exc:
        s.schedule_one(w("third", hint=hint, **{RDMA: 50}))
    assert exc.value.reasons == {"insufficient free rdma devices": 1}  # minors 0, 1 have 0 free


def test_apply_for_all_needs_every_matching_device_free():
    s = scheduler(nics(base(), ["x", "x"]))
    s.schedule_one(w("one", hint={"rdma": {"selector": {"matchLabels": {"role": "x"}}}}, **{RDMA: 100}))
    with pytest.raises(FitError) as exc:
        s.schedule_one(w("all", hint={"rdma": {"allocateStrategy": "ApplyForAll"}}, **{RDMA: 50}))
    assert exc.value.reasons == {"deviceAllocateHint rdma: ApplyForAll needs all 2 matching rdma devices free": 1}


# requiredTopologyScope ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "field", "expected"),
    [
        ("PCIe", "pcie", [2, 3]),  # minors 0 and 1 are on different switches; 2, 3 share one
        ("NUMANode", "numa", [2, 3]),
    ],
)
def test_required_scope_keeps_devices_together(scope, field, expected):
    groups = ["p0", "p1", "p2", "p2"] if field == "pcie" else [0, 1, 0, 0]
    node = base().cpu("16").topology(sockets=1, numa_per_socket=2) if field == "numa" else base()
    node = nics(node, ["a"] * 4, **{field: groups})
    s = scheduler(node)
    s.schedule_one(w("blocker", **{RDMA: 100}))  # minor 0
    hint = {"rdma": {"requiredTopologyScope": scope, "allocateStrategy": "RequestsAsCount"}}
    binding = s.schedule_one(w(hint=hint, **{RDMA: 2}))
    assert minors(binding) == expected
    with pytest.raises(FitError) as exc:
        s.schedule_one(w("w2", hint=hint, **{RDMA: 2}))  # only minor 1 left
    assert len(exc.value.reasons) == 1


def test_required_scope_rejects_node_when_no_scope_is_big_enough():
    s = scheduler(nics(base(), ["a"] * 4, pcie=["p0", "p1", "p2", "p3"]))
    hint = {"rdma": {"requiredTopologyScope": "PCIe", "allocateStrategy": "RequestsAsCount"}}
    with pytest.raises(FitError) as exc:
        s.schedule_one(w(hint=hint, **{RDMA: 2}))
    assert exc.value.reasons == {"deviceAllocateHint rdma: no PCIe switch has 2 matching free rdma devices": 1}
    for scope in ("Device", "Node"):  # no constraint beyond the node
        assert (
            len(
                s.schedule_one(
                    w(scope.lower(), hint={"rdma": {**hint["rdma"], "requiredTopologyScope": scope}}, **{RDMA: 2})
                ).devices["rdma"]
            )
            == 2
        )


# exclusivePolicy ----------------------------------------------------------------------------------


def test_device_level_takes_only_unused_devices_and_keeps_them():
    s = scheduler(nics(base(), ["a", "a"]))
    s.schedule_one(w("shared", **{RDMA: 30}))  # minor 0 is now shared
    binding = s.schedule_one(w("excl", hint={"rdma": {"exclusivePolicy": "DeviceLevel"}}, **{RDMA: 30}))
    assert minors(binding) == [1]
    assert binding.devices["rdma"][0].resources == {"rdma": 100}  # the whole device: nobody shares it
    placed = s.schedule_one(w("other", **{RDMA: 30}))
    assert minors(placed) == [0]
    with pytest.raises(FitError) as exc:
        s.schedule_one(w("excl2", hint={"rdma": {"exclusivePolicy": "DeviceLevel"}}, **{RDMA: 10}))
    assert exc.value.reasons == {"deviceAllocateHint rdma: 0 matching unused free rdma devices, needs 1": 1}
    s.state.check_invariants()


def test_pcie_level_avoids_switches_with_a_used_device():
    s = scheduler(nics(base(), ["a"] * 4, pcie=["p0", "p0", "p1", "p1"]))
    s.schedule_one(w("shared", **{RDMA: 30}))  # minor 0 on p0
    hint = {"rdma": {"exclusivePolicy": "PCIeLevel"}}
    assert minors(s.schedule_one(w("x", hint=hint, **{RDMA: 100}))) == [2]
    with pytest.raises(FitError) as exc:  # p0 has a used device, p1 now too
        s.schedule_one(w("y", hint=hint, **{RDMA: 100}))
    assert exc.value.reasons == {"deviceAllocateHint rdma: 0 matching unshared-switch free rdma devices, needs 1": 1}


# Validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "path"),
    [
        ({"rdma": {"allocateStrategy": "All"}}, "deviceAllocateHint.rdma.allocateStrategy"),
        ({"rdma": {"requiredTopologyScope": "Rack"}}, "deviceAllocateHint.rdma.requiredTopologyScope"),
        ({"rdma": {"exclusivePolicy": "NodeLevel"}}, "deviceAllocateHint.rdma.exclusivePolicy"),
        ({"rdma": {"vfSelector": {"matchLabels": {"a": "b"}}}}, "deviceAllocateHint.rdma.vfSelector"),
        (
            {"rdma": {"selector": {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}}},
            "deviceAllocateHint.rdma.selector.matchExpressions.0.operator",
        ),
        (
            {"rdma": {"selector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}},
            "deviceAllocateHint.rdma.selector.matchExpressions.0",
        ),
        ({"rdma": {"selectr": {}}}, "deviceAllocateHint.rdma.selectr"),
    ],
)
def test_invalid_hint_names_the_path(hint, path):
    with pytest.raises(PydanticError) as exc:
        Workload.model_validate({"name": "x", "deviceAllocateHint": hint})
    assert path in str(exc.value)


def test_empty_vf_selector_and_empty_hint_change_nothing():
    plain = normalize_device_request({RDMA: 100})
    hints = Workload.model_validate({"name": "x", "deviceAllocateHint": {"rdma": {"vfSelector": {}}}})
    assert normalize_device_request({RDMA: 100}, hints=hints.device_allocate_hint) == plain


def test_hint_changes_the_request_shape():
    from finesched.sched.memo import request_shape

    a, b = w("a", **{RDMA: 100}), w("b", hint={"rdma": {"exclusivePolicy": "DeviceLevel"}}, **{RDMA: 100})
    assert request_shape(a) != request_shape(b)


def test_manifest_round_trip_keeps_the_hint():
    hint = {"rdma": {"selector": {"matchLabels": {"role": "x"}}, "allocateStrategy": "RequestsAsCount"}}
    workload = w(hint=hint, **{RDMA: 2})
    again = Workload.model_validate(workload.model_dump(by_alias=True))
    assert again.device_allocate_hint == workload.device_allocate_hint
    node = nics(base(), ["x"]).obj()
    assert node.devices[0].labels == {"role": "x"}


# With deviceJointAllocate -------------------------------------------------------------------------


def test_joint_allocation_with_a_hinted_type_is_filtered_exactly():
    # node a: the storage NIC is on p1, the GPU on p0 -> no joint choice; node b: both on p0
    a = base("a").device("gpu", 0, pcie="p0").device("rdma", 0, pcie="p0", labels={"role": "compute"})
    a = a.device("rdma", 1, pcie="p1", labels={"role": "storage"})
    b = base("b").device("gpu", 0, pcie="p0").device("rdma", 0, pcie="p0", labels={"role": "storage"})
    s = scheduler(a, b)
    hint = {"rdma": {"selector": {"matchLabels": {"role": "storage"}}}}
    joint = {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}

    def make(name):
        fields = {"deviceAllocateHint": hint, "deviceJointAllocate": joint}
        return make_workload(name).req(cpu="1", **{"nvidia.com/gpu": 1, RDMA: 100}).set(**fields)

    binding = s.schedule_one(make("j1").obj())
    assert binding.node == "b" and minors(binding) == [0] and minors(binding, "gpu") == [0]
    with pytest.raises(FitError) as exc:
        s.schedule_one(make("j2").obj())
    assert exc.value.reasons == {
        "no free gpu shares a PCIe switch with enough free rdma": 1,  # node a, from the exact allocator
        "insufficient gpu-core on any single GPU": 1,  # node b: its GPU and NIC are taken
        "insufficient gpu-memory on any single GPU": 1,
        "insufficient free rdma devices": 1,
    }
