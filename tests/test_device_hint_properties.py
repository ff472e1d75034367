"""Property: with deviceAllocateHints, allocations never over-allocate, always respect the hint, and the
filter agrees with the exact allocator (a pod is placed exactly when some node's allocator can serve it)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare, InsufficientDevices, allocate_devices, normalize_device_request
from finesched.plugins.deviceshare.hints import device_labels, scope_groups
from finesched.sched.diagnosis import FitError
from finesched.sched.profile import Profile
from finesched.sched.registry import default_registry
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from finesched.state.devices import attach_device_accounts

RDMA = "koordinator.sh/rdma"
ROLES = ("a", "b", None)
PROFILE = [{"name": "ResourcesFit"}, {"name": "DeviceShare"}, {"name": "LeastRequested"}]

device = st.tuples(st.sampled_from(ROLES), st.sampled_from(["p0", "p1", "p2"]), st.integers(0, 1))
node_devices = st.lists(device, min_size=1, max_size=6)


@st.composite
def hints(draw):
    hint = {}
    if draw(st.booleans()):
        role = draw(st.sampled_from(["a", "b"]))
        op = draw(st.sampled_from(["labels", "In", "NotIn", "Exists", "DoesNotExist"]))
        if op == "labels":
            hint["selector"] = {"matchLabels": {"role": role}}
        elif op in ("In", "NotIn"):
            hint["selector"] = {"matchExpressions": [{"key": "role", "operator": op, "values": [role]}]}
        else:
            hint["selector"] = {"matchExpressions": [{"key": "role", "operator": op}]}
    strategy = draw(st.sampled_from([None, "ApplyForAll", "RequestsAsCount"]))
    if strategy:
        hint["allocateStrategy"] = strategy
    scope = draw(st.sampled_from([None, "Device", "PCIe", "NUMANode", "Node"]))
    if scope:
        hint["requiredTopologyScope"] = scope
    exclusive = draw(st.sampled_from([None, "DeviceLevel", "PCIeLevel"]))
    if exclusive:
        hint["exclusivePolicy"] = exclusive
    return hint


@st.composite
def pods(draw):
    hint = draw(st.one_of(st.none(), hints()))
    if hint and hint.get("allocateStrategy") == "RequestsAsCount":
        amount = draw(st.integers(1, 3))
    else:
        amount = draw(st.sampled_from([20, 50, 100, 200]))
    return hint, amount


def build(layouts):
    built = []
    for n, layout in enumerate(layouts):
        b = make_node(f"n{n}").cpu("16").memory("64Gi").topology(sockets=1, numa_per_socket=2)
        for minor, (role, pcie, numa) in enumerate(layout):
            b = b.device("rdma", minor, pcie=pcie, numa=numa, labels={} if role is None else {"role": role})
        built.append(b.obj())
    state = ClusterState.from_nodes(built)
    profile = Profile.model_validate({"name": "t", "plugins": PROFILE})
    registry = default_registry().with_plugins({"DeviceShare": DeviceShare.from_args})
    return Scheduler(state, profile=profile, registry=registry)


def direct(s, i, workload):
    """The exact allocator's answer on node i, called directly (None when it cannot serve)."""
    accounts = attach_device_accounts(s.state)
    dreq = normalize_device_request(workload.requests, hints=workload.device_allocate_hint)
    nd = accounts.node_devices(i, "rdma")
    try:
        return allocate_devices({"rdma": nd}, dreq, labels={"rdma": device_labels(s.state.nodes[i], "rdma")})
    except InsufficientDevices:
        return None


def check_hint(s, i, workload, grants, before):
    """The grants on node i respect the workload's hint, judged against the devices before the decision."""
    hint = workload.device_allocate_hint.get("rdma")
    node = s.state.nodes[i]
    by_minor = {d.minor: d for d in node.devices}
    minors = [g.minor for g in grants]
    assert len(set(minors)) == len(minors)
    amount = workload.requests["rdma"]
    if hint is None:
        return
    if hint.selector is not None:
        assert all(hint.selector.matches(by_minor[m].labels) for m in minors)
    slot = {int(m): k for k, m in enumerate(before.minors)}
    used = (before.free != before.total).any(axis=0)
    if hint.allocate_strategy == "RequestsAsCount":
        assert len(minors) == amount and all(g.resources["rdma"] == 100 for g in grants)
    if hint.allocate_strategy == "ApplyForAll":
        matching = [
            d.minor for d in node.devices if d.health and (hint.selector is None or hint.selector.matches(d.labels))
        ]
        assert sorted(minors) == sorted(matching)
    if hint.required_topology_scope in ("PCIe", "NUMANode"):
        groups = scope_groups(before, hint.required_topology_scope)
        assert len({int(groups[slot[m]]) for m in minors}) == 1
    if hint.exclusive_policy == "DeviceLevel":
        assert not any(used[slot[m]] for m in minors)
        assert all(g.resources["rdma"] == 100 for g in grants)  # whole: nobody can share it
    if hint.exclusive_policy == "PCIeLevel":
        busy = {int(before.pcie[k]) for k in range(len(before)) if used[k]}
        assert not any(int(before.pcie[slot[m]]) in busy for m in minors)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(node_devices, min_size=1, max_size=3), st.lists(pods(), min_size=1, max_size=8), st.data())
def test_hinted_allocations_respect_the_hint_and_never_overallocate(layouts, stream, data):
    s = build(layouts)
    accounts = attach_device_accounts(s.state)
    placed = []
    for n, (hint, amount) in enumerate(stream):
        fields = {"deviceAllocateHint": {"rdma": hint}} if hint is not None else {}
        workload = make_workload(f"w{n}").req(cpu="100m", **{RDMA: amount}).set(**fields).obj()
        assert isinstance(workload, Workload)
        before = {i: accounts.node_devices(i, "rdma") for i in range(s.state.n)}
        able = {s.state.names[i] for i in range(s.state.n) if direct(s, i, workload) is not None}
        try:
            binding = s.schedule_one(workload)
        except FitError:
            assert not able, (able, hint, amount)  # the filter rejected a node the allocator could serve
            continue
        assert binding.node in able  # the filter passed a node the allocator cannot serve
        i = s.state.names.index(binding.node)
        check_hint(s, i, workload, binding.devices["rdma"], before[i])
        s.state.check_invariants()  # free >= 0 everywhere: nothing over-allocated
        placed.append(binding)
        if placed and data.draw(st.integers(0, 3)) == 0:
            s.release(placed.pop(data.draw(st.integers(0, len(placed) - 1))))
            s.state.check_invariants()
