"""DeviceAccounts: arrays from manifests, foreign use, assume/forget, health, rebuild, snapshots,
the fit-count cache, and the encoded (S0.2) export/apply."""

from __future__ import annotations

from functools import partial

import pytest

from builders import make_node
from finesched.codec import EncodedVector, encode
from finesched.model.binding import Binding, DeviceGrant
from finesched.plugins.deviceshare.request import compile_rule, fit_mask
from finesched.plugins.deviceshare.request import normalize_device_request as norm
from finesched.state.cluster import ClusterState, StateError
from finesched.state.device_wire import EncodedUpdateError, apply_encoded_updates
from finesched.state.devices import STRATEGY_LABEL, DeviceAccounts, attach_device_accounts

GI = 2**30


def state_of(*builders, bindings=()):
    state = ClusterState.from_nodes([b.obj() for b in builders], bindings)
    return state, attach_device_accounts(state)


def grant(minor, **amounts):
    return DeviceGrant(minor=minor, resources={k.replace("_", "-"): v for k, v in amounts.items()})


def binding(name, node="n1", **devices):
    return Binding(workload=f"default/{name}", node=node, devices=devices)


def dump(accounts: DeviceAccounts, n: int) -> dict:
    """Everything the accounts hold for nodes [0, n), comparable with ==."""
    out = {}
    for kind, acc in accounts.types.items():
        fields = ("total", "free", "foreign", "htotal", "hfree")
        out[kind] = {f: getattr(acc, f)[:, :n].tolist() for f in fields}
        out[kind].update({f: getattr(acc, f)[:n].tolist() for f in ("valid", "healthy", "minor", "numa", "pcie")})
        out[kind]["dims"] = list(acc.dims)
    return out


def a100(name="n1", **kw):
    return make_node(name).cpu("64").memory("256Gi").numa(2).gpus(4, memory="80Gi", numa=[0, 1], **kw)


# From manifests ---------------------------------------------------------------------------------------


def test_arrays_from_manifest():
    node = (
        a100()
        .device("rdma", 0, numa=1, pcie="pci0000:ae")
        .set(
            links=[{"type": "gpu", "a": 0, "b": 1, "bandwidth": "600G"}, {"type": "gpu", "a": 2, "b": 3}],
            foreignAllocations=[{"type": "gpu", "minor": 3, "resources": {"gpu-core": 20, "gpu-memory-ratio": 25}}],
        )
    )
    _, accounts = state_of(node)
    gpu = accounts.node_devices(0, "gpu")
    assert gpu.dims == ("gpu-core", "gpu-memory-ratio", "gpu-memory")
    assert gpu.minors.tolist() == [0, 1, 2, 3] and gpu.numa.tolist() == [0, 1, 0, 1]
    # foreign 25% of an 80Gi card = 20Gi of memory filled in, so 60Gi is left
    assert gpu.free[:, 3].tolist() == [80, 75, 60 * GI]
    assert gpu.links.tolist() == [[0, 600 * 10**9, 0, 0], [600 * 10**9, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]
    rdma = accounts.node_devices(0, "rdma")
    assert rdma.dims == ("rdma",) and rdma.free.tolist() == [[100]] and rdma.pcie.tolist() == [0]
    assert accounts.node_devices(0, "fpga") is None
    assert set(accounts.all_node_devices(0)) == {"gpu", "rdma"}
    assert accounts.violations() == []


def test_totals_count_healthy_devices_only():
    state, accounts = state_of(a100(), make_node("n2").gpus(2, memory="40Gi", healthy=False))
    assert accounts.totals() == {"gpu-core": 400, "gpu-memory-ratio": 400, "gpu-memory": 320 * GI}
    assert state.totals()["gpu-core"] == 400


@pytest.mark.parametrize(
    ("policies", "labels", "want"),
    [
        pytest.param({}, {}, None, id="unset"),
        pytest.param({}, {STRATEGY_LABEL: "MostAllocated"}, "MostAllocated", id="label"),
        pytest.param(
            {"deviceAllocateStrategy": "LeastAllocated"},
            {STRATEGY_LABEL: "MostAllocated"},
            "LeastAllocated",
            id="policies-before-label",
        ),
        # an unknown label value is now a manifest error (test_manifest.py, bad-device-strategy-label)
    ],
)
def test_node_strategy(policies, labels, want):
    node = a100().set(policies=policies, labels=labels)
    assert state_of(node)[1].strategy_of(0) == want


# Assume / forget -------------------------------------------------------------------------------------


def test_assume_and_forget_are_inverse():
    state, accounts = state_of(a100())
    before = dump(accounts, 1)
    b = binding("w", gpu=[grant(1, gpu_core=50, gpu_memory_ratio=50, gpu_memory=40 * GI)])
    state.assume(b)
    assert accounts.node_devices(0, "gpu").free[:, 1].tolist() == [50, 50, 40 * GI]
    assert accounts.violations() == [] and state.check_invariants() is None
    state.forget(b.workload)
    assert dump(accounts, 1) == before


@pytest.mark.parametrize(
    ("grants", "message"),
    [
        pytest.param([grant(0, gpu_core=101)], "asks 101, 100 free", id="above-free"),
        pytest.param([grant(9, gpu_core=10)], "no gpu with minor 9", id="unknown-minor"),
        pytest.param([grant(0, fpga=10)], "has no fpga dimension", id="unknown-dimension"),
        pytest.param([grant(0, gpu_core=10), grant(0, gpu_core=10)], "granted twice", id="same-device-twice"),
        # the first grant fits, the second does not: nothing at all is taken
        pytest.param([grant(0, gpu_core=10), grant(1, gpu_memory=81 * GI)], "gpu 1 gpu-memory", id="all-or-nothing"),
    ],
)
def test_assume_refuses_and_changes_nothing(grants, message):
    state, accounts = state_of(a100())
    before = dump(accounts, 1)
    with pytest.raises(StateError, match=message):
        state.assume(binding("w", gpu=grants))
    assert dump(accounts, 1) == before and "default/w" not in state.bindings


def test_unhealthy_devices_take_no_new_grant_but_keep_old_ones():
    state, accounts = state_of(a100())
    state.assume(binding("old", gpu=[grant(0, gpu_core=50)]))
    # the agent reports GPU 0 failed: the existing binding is re-applied, not lost
    sick = a100().data()
    sick["devices"][0]["health"] = False
    state.update_node(make_node("n1").set(**sick).obj())
    assert accounts.violations() == []
    assert accounts.totals()["gpu-core"] == 300
    with pytest.raises(StateError, match="unhealthy"):
        state.assume(binding("new", gpu=[grant(0, gpu_core=10)]))
    state.forget("default/old")
    assert accounts.violations() == []


def test_rebuild_from_bindings_matches_live_state_even_after_a_device_failed():
    live, accounts = state_of(a100(), a100("n2"))
    bindings = [
        binding("a", gpu=[grant(0, gpu_core=50, gpu_memory_ratio=50, gpu_memory=40 * GI)]),
        binding("b", node="n2", gpu=[grant(2, gpu_core=100, gpu_memory_ratio=100, gpu_memory=80 * GI)]),
    ]
    for b in bindings:
        live.assume(b)
    _, again = state_of(a100(), a100("n2"), bindings=bindings)
    assert dump(again, 2) == dump(accounts, 2)
    sick = a100().data()
    sick["devices"][0]["health"] = False
    _, accounts2 = state_of(make_node("n1").set(**sick), a100("n2"), bindings=bindings)
    assert accounts2.violations() == [] and len(accounts2.held(0)) == 1


def test_remove_node_moves_the_last_node_and_snapshot_restores():
    state, accounts = state_of(a100("n1"), a100("n2"), a100("n3"))
    state.assume(binding("w", node="n3", gpu=[grant(2, gpu_core=30)]))
    snap = state.snapshot()
    before = dump(accounts, 3)
    state.remove_node("n1")
    assert state.index["n3"] == 0
    assert accounts.node_devices(0, "gpu").free[0].tolist() == [100, 100, 70, 100]
    assert accounts.violations() == []
    state.restore(snap)
    accounts = state.extras["devices"]
    assert dump(accounts, 3) == before and accounts.violations() == []


# The fit-count cache ---------------------------------------------------------------------------------


def test_fit_counts_follow_every_change():
    state, accounts = state_of(*(a100(f"n{i}") for i in range(5)))
    tr = norm({"gpu": 60}).types["gpu"]
    rule = compile_rule(tr, accounts.types["gpu"].dims)
    evaluate = partial(fit_mask, rule)

    def fresh():
        acc = accounts.types["gpu"]
        return fit_mask(rule, acc.free[:, : state.n], acc.total[:, : state.n], acc.healthy[: state.n]).sum(1).tolist()

    assert accounts.fit_counts("gpu", rule, evaluate, state.n)[0].tolist() == [4] * 5
    state.assume(binding("w", node="n2", gpu=[grant(0, gpu_core=50), grant(3, gpu_core=41)]))
    assert accounts.fit_counts("gpu", rule, evaluate, state.n)[0].tolist() == fresh() == [4, 4, 2, 4, 4]
    state.remove_node("n0")
    state.add_node(make_node("big").gpus(8).obj())
    assert accounts.fit_counts("gpu", rule, evaluate, state.n)[0].tolist() == fresh()
    state.forget("default/w")
    assert accounts.fit_counts("gpu", rule, evaluate, state.n)[0].tolist() == fresh()


# Encoded device state (S0.2) ----------------------------------------------------------------------------


def test_export_encodes_free_per_device_in_minor_order():
    state, accounts = state_of(a100())
    state.assume(binding("w", gpu=[grant(1, gpu_core=50, gpu_memory_ratio=50, gpu_memory=40 * GI)]))
    encoded = accounts.export_encoded(0)["gpu"]
    # gpu-core free [100, 50, 100, 100] in 7 bits: 100 + 50<<7 + 100<<14 + 100<<21
    assert encoded["gpu-core"] == EncodedVector(100 + (50 << 7) + (100 << 14) + (100 << 21), 4, 7)
    assert encoded["gpu-memory"].decode() == [80 * GI, 40 * GI, 80 * GI, 80 * GI]
    assert encoded["gpu-memory"].bits == 37  # 80Gi = 2^36 · 1.25 needs 37 bits


def test_apply_decodes_many_nodes_and_turns_missing_free_into_foreign():
    state, accounts = state_of(*(a100(f"n{i}") for i in range(3)))
    state.assume(binding("w", node="n0", gpu=[grant(0, gpu_core=50)]))
    # the agents report: n0 gpu-core [40, 100, 100, 100] (10 used outside), n1 and n2 [100, 90, 100, 100]
    updates = {
        "n0": {"gpu": {"gpu-core": (encode([40, 100, 100, 100], 7), 4, 7)}},
        "n1": {"gpu": {"gpu-core": EncodedVector.encode_vector([100, 90, 100, 100], 7)}},
        "n2": {"gpu": {"gpu-core": (encode([100, 90, 100, 100], 7), 4, 7)}},
    }
    apply_encoded_updates(state, updates)
    assert accounts.node_devices(0, "gpu").free[0].tolist() == [40, 100, 100, 100]
    assert accounts.types["gpu"].foreign[0, 0, :4].tolist() == [10, 0, 0, 0]
    assert accounts.node_devices(2, "gpu").free[0].tolist() == [100, 90, 100, 100]
    assert accounts.violations() == []
    state.forget("default/w")
    assert accounts.node_devices(0, "gpu").free[0, 0] == 90 and accounts.violations() == []


@pytest.mark.parametrize(
    ("update", "message"),
    [
        pytest.param({"gpu": {"gpu-core": (encode([100, 100], 7), 2, 7)}}, "count 2 but the node has 4", id="count"),
        pytest.param(
            {"gpu": {"gpu-core": (encode([100] * 4, 8), 4, 8)}},
            "bits 8 but the node's gpu-core totals need 7",
            id="bits",
        ),
        # 50 is granted on GPU 0, so the agent cannot report more than 50 free there
        pytest.param(
            {"gpu": {"gpu-core": (encode([60, 100, 100, 100], 7), 4, 7)}}, "minor 0 reports 60 free", id="range"
        ),
        pytest.param({"gpu": {"gpu-core": (1 << 40, 4, 7)}}, "needs 41 bits", id="k-too-wide"),
        pytest.param({"fpga": {"fpga": (0, 1, 7)}}, "no such device dimension", id="unknown-type"),
    ],
)
def test_bad_encoded_updates_change_nothing(update, message):
    state, accounts = state_of(a100(), a100("n2"))
    state.assume(binding("w", gpu=[grant(0, gpu_core=50)]))
    good = {"gpu": {"gpu-core": (encode([100, 80, 100, 100], 7), 4, 7)}}
    before = dump(accounts, 2)
    with pytest.raises(EncodedUpdateError, match=message):
        apply_encoded_updates(state, {"n2": good, "n1": update})
    assert dump(accounts, 2) == before
    with pytest.raises(EncodedUpdateError, match="no node named 'nope'"):
        apply_encoded_updates(state, {"nope": good})


# Review fixes: encoded updates mark the state, defensive foreign check, annotation-only bindings -------------


def test_encoded_updates_only_through_the_state_and_marked_changed():
    import finesched.state.device_wire as wire
    from finesched.state.device_wire import export_node_state

    # the unmarked paths are gone: a memo would keep stale verdicts after them
    assert not hasattr(DeviceAccounts, "apply_encoded") and not hasattr(wire, "apply_encoded")
    state, accounts = state_of(a100(), a100("n2"))
    exported = export_node_state(state, "n2")
    assert exported == accounts.export_encoded(1)
    position, version = state.change_position, state.capacity_version
    update = {"gpu": {"gpu-core": (encode([100, 70, 100, 100], 7), 4, 7)}}
    apply_encoded_updates(state, {"n2": update})
    assert state.changed_since(position).tolist() == [1] and state.capacity_version > version
    assert export_node_state(state, "n2")["gpu"]["gpu-core"].decode() == [100, 70, 100, 100]
    with pytest.raises(KeyError, match="no node named 'nope'"):
        export_node_state(state, "nope")


def test_a_node_built_unchecked_with_bad_foreign_use_is_refused_not_capped():
    from finesched.model.node import ForeignAllocation

    over = ForeignAllocation(type="gpu", minor=0, resources={"gpu-core": 150})
    bad = a100().obj().model_copy(update={"foreign_allocations": (over,)})  # model_copy skips validation
    state = ClusterState.from_nodes([bad])
    with pytest.raises(StateError, match=r"foreignAllocations\.0\.resources\.gpu-core: 150 foreign gpu-core"):
        attach_device_accounts(state)


KOORD_GPU_1 = (
    '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}}]}'
)


def test_a_binding_with_only_the_device_annotation_takes_the_annotated_share():
    from finesched.plugins.deviceshare import DEVICE_ALLOCATED

    state, accounts = state_of(a100())
    before = dump(accounts, 1)
    b = Binding(workload="default/koord", node="n1", annotations={DEVICE_ALLOCATED: KOORD_GPU_1})
    state.assume(b)
    # ratio 50 of an 80Gi card: 40Gi filled in per card, as for a binding finesched made
    assert accounts.node_devices(0, "gpu").free[:, 1].tolist() == [50, 50, 40 * GI]
    assert accounts.held(0)["default/koord"].devices == {
        "gpu": [grant(1, gpu_core=50, gpu_memory_ratio=50, gpu_memory=40 * GI)]
    }
    assert accounts.violations() == [] and state.check_invariants() is None
    _, rebuilt = state_of(a100(), bindings=[b])  # the start-up rebuild reads the annotation too
    assert dump(rebuilt, 1) == dump(accounts, 1)
    state.forget(b.workload)
    assert dump(accounts, 1) == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{", "device-allocated: not JSON", id="not-json"),
        pytest.param(
            '{"gpu":[{"minor":7,"resources":{"koordinator.sh/gpu-core":"50"}}]}', "no gpu with minor 7", id="minor"
        ),
    ],
)
def test_a_bad_device_annotation_is_refused_and_changes_nothing(text, message):
    from finesched.plugins.deviceshare import DEVICE_ALLOCATED

    state, accounts = state_of(a100())
    before = dump(accounts, 1)
    with pytest.raises(StateError, match=message):
        state.assume(Binding(workload="default/w", node="n1", annotations={DEVICE_ALLOCATED: text}))
    assert dump(accounts, 1) == before and "default/w" not in state.bindings


def test_prefixed_dimensions_of_manifest_defined_types_are_held_bare():
    state, accounts = state_of(make_node("n1").device("xpu", 0).device("xpu", 1))
    b = binding("w", xpu=[DeviceGrant(minor=1, resources={"koordinator.sh/xpu": 50})])
    state.assume(b)
    assert accounts.node_devices(0, "xpu").free.tolist() == [[100, 50]]
    assert accounts.held(0)["default/w"].devices == {"xpu": [grant(1, xpu=50)]}
    assert accounts.violations() == []
    state.forget("default/w")
    assert accounts.node_devices(0, "xpu").free.tolist() == [[100, 100]]


def test_a_node_an_extra_refuses_is_not_half_added():
    from finesched.model.node import ForeignAllocation

    state, accounts = state_of(a100())
    over = ForeignAllocation(type="gpu", minor=0, resources={"gpu-core": 150})
    bad = a100().obj().model_copy(update={"name": "n2", "foreign_allocations": (over,)})
    before = (state.n, list(state.names), state.free.copy(), dump(accounts, 0))
    with pytest.raises(StateError, match="150 foreign gpu-core"):
        state.add_node(bad)
    assert (state.n, state.names) == before[:2] and (state.free == before[2]).all()
    assert "n2" not in state.index and dump(accounts, 0) == before[3]
    state.add_node(a100().obj().model_copy(update={"name": "n2"}))  # the slot is free again
    state.check_invariants()
