"""The fused scalar path (plugins/fused_scalar.py) decides exactly as the generic plugin path.

Two schedulers over copies of one random cluster, one with the fused path and one without
(`Scheduler(fused=False)`), take the same random stream of requests: every decision must be the
same node with the same score (ties included, lowest index and the seeded random order), and a
request that fits nowhere the same FitError. The stream repeats shapes, so the memo's patched
subsets are compared as well as whole-cluster evaluations; nodes carry the unschedulable label,
zone labels for node selectors, and uneven capacities and loads.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched import ClusterState, Scheduler
from finesched.cpuset import CPUSet
from finesched.model.workload import Workload
from finesched.plugins.fused_scalar import FusedScalar, wait_for_kernel
from finesched.plugins.node_unschedulable import UNSCHEDULABLE_LABEL
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import MemoEntry, request_shape
from finesched.state.cluster import StateError, plain_scalar
from fused_equivalence import assert_decide_alike, decision

_PLUGIN_FILTERS = [
    "NodeUnschedulable",
    "TenantIsolation",
    "NodeSelector",
    "ResourcesFit",
    "NUMAAlign",
    "CPUOrchestration",
]
PROFILES: dict[str, Any] = {
    "default": "default",
    "spread": "spread",
    "weighted-random-ties": {
        "name": "weighted",
        "plugins": [
            *({"name": f} for f in _PLUGIN_FILTERS),
            {"name": "MostAllocated", "weight": 2},
            {"name": "MostBalanced", "weight": 3},
            {"name": "LeastRequested", "weight": 0},
        ],
        "tieBreak": "random",
        "seed": 11,
    },
    "filters-only": {"name": "filters", "plugins": [{"name": f} for f in _PLUGIN_FILTERS]},
}

node_st = st.fixed_dictionaries(
    {
        "cpu": st.integers(1, 16),
        "memory_gi": st.integers(1, 32),
        "extra": st.integers(0, 4),  # example.com/widget, 0: not offered
        "zone": st.sampled_from(["a", "b", None]),
        "cordoned": st.booleans() | st.just(False),
    }
)
request_st = st.fixed_dictionaries(
    {
        "cpu_m": st.sampled_from([100, 250, 500, 1000, 2000, 3500, 8000]),
        "memory_mi": st.sampled_from([0, 128, 512, 2048, 8192]),
        "extra": st.integers(0, 2),
        "zone": st.sampled_from([None, None, "a", "b"]),
        "unknown": st.integers(0, 30).map(lambda v: v == 0),  # now and then a resource no node offers
    }
)


def _cluster(nodes: list[dict[str, Any]]) -> ClusterState:
    built = []
    for i, spec in enumerate(nodes):
        node = make_node(f"n{i}").cpu(spec["cpu"]).memory(f"{spec['memory_gi']}Gi").pods(40)
        if spec["extra"]:
            node = node.resource("example.com/widget", spec["extra"])
        if spec["zone"] is not None:
            node = node.label("zone", spec["zone"])
        if spec["cordoned"]:
            node = node.label(UNSCHEDULABLE_LABEL, "cordoned")
        built.append(node.obj())
    return ClusterState.from_nodes(built)


def _workload(i: int, spec: dict[str, Any]) -> Workload:
    amounts: dict[str, str | int] = {"cpu": f"{spec['cpu_m']}m"}
    if spec["memory_mi"]:
        amounts["memory"] = f"{spec['memory_mi']}Mi"
    builder = make_workload(f"w{i}").req(**amounts)
    if spec["extra"]:
        builder = builder.request("example.com/widget", spec["extra"])
    if spec["unknown"]:
        builder = builder.request("example.com/nowhere", 1)
    if spec["zone"] is not None:
        builder = builder.selector(zone=spec["zone"])
    return builder.obj()


def _scalar_path(scheduler: Scheduler) -> FusedScalar:
    """The scheduler's fused scalar path: its own, or the one a device path wraps for scalar cycles."""
    fused = scheduler._fused
    scalar = getattr(fused, "_scalar", fused)
    assert isinstance(scalar, FusedScalar)
    return scalar


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "numpy"])
@pytest.mark.parametrize("profile", sorted(PROFILES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(node_st, min_size=1, max_size=24),
    requests=st.lists(request_st, min_size=1, max_size=8),
    stream=st.lists(st.integers(0, 7), min_size=1, max_size=40),
)
def test_fused_path_decides_as_the_generic_path(
    kernel: bool, profile: str, nodes: list[dict[str, Any]], requests: list[dict[str, Any]], stream: list[int]
) -> None:
    """With the compiled memo patch (plugins/fused_kernel.py) and with the numpy passes alone."""
    fused = Scheduler(_cluster(nodes), PROFILES[profile])
    generic = Scheduler(_cluster(nodes), PROFILES[profile], fused=False)
    assert fused._fused is not None and generic._fused is None  # the two paths really differ
    assert not kernel or wait_for_kernel()
    scalar = _scalar_path(fused)
    scalar.use_kernel = kernel and scalar.use_kernel
    workloads = (_workload(i, requests[pick % len(requests)]) for i, pick in enumerate(stream))
    assert_decide_alike(fused, generic, workloads, release_every=7)


def test_profiles_the_fused_path_does_not_cover_go_the_generic_way() -> None:
    state = _cluster([{"cpu": 4, "memory_gi": 8, "extra": 0, "zone": None, "cordoned": False}])
    assert Scheduler(state, "binpack")._fused is None  # DeviceScore: not a share scorer
    assert Scheduler(state, "default")._fused is not None


def test_a_wrong_fused_score_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: a fused total off by one on one node changes a decision."""
    from finesched.plugins import fused_scalar

    original = fused_scalar.FusedScalar._total

    def skewed(self: Any, request: Any, index: Any, n: int) -> Any:
        total = original(self, request, index, n)
        total[-1:] += 1  # favour the last node of every batch a little
        return total

    monkeypatch.setattr(fused_scalar.FusedScalar, "_total", skewed)
    nodes = [{"cpu": 8, "memory_gi": 16, "extra": 0, "zone": None, "cordoned": False}] * 3
    fused = Scheduler(_cluster(nodes), "default")
    generic = Scheduler(_cluster(nodes), "default", fused=False)
    workload = _workload(0, {"cpu_m": 1000, "memory_mi": 512, "extra": 0, "zone": None, "unknown": False})
    assert decision(fused, workload) != decision(generic, workload)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    writes=st.lists(st.tuples(st.integers(0, 39), st.booleans(), st.integers(-1, 500)), max_size=60),
)
def test_a_patch_with_repeated_nodes_equals_one_with_distinct_nodes(
    n: int, writes: list[tuple[int, bool, int]]
) -> None:
    """The fused path patches the memo with the change log as it is (repeats): the entry (mask,
    key, feasible count) must come out as from the distinct, sorted nodes."""
    rng = np.random.default_rng(n)
    feasible = rng.random(n) < 0.5
    key = np.where(feasible, rng.integers(0, 200, n), -1)
    latest = {i % n: (ok, k if ok else -1) for i, ok, k in writes}  # one result per node and cycle
    dirty = np.array([i % n for i, _, _ in writes], dtype=np.intp)
    distinct = np.array(sorted(latest), dtype=np.intp)
    repeated, once = MemoEntry(0, 0, feasible.copy(), key.copy()), MemoEntry(0, 0, feasible.copy(), key.copy())
    repeated.patch(dirty, np.array([latest[i][0] for i in dirty], dtype=bool),
                   np.array([latest[i][1] for i in dirty], dtype=np.int64), 1, repeats=True)  # fmt: skip
    once.patch(distinct, np.array([latest[i][0] for i in distinct], dtype=bool),
               np.array([latest[i][1] for i in distinct], dtype=np.int64), 1)  # fmt: skip
    assert np.array_equal(repeated.feasible, once.feasible) and np.array_equal(repeated.key, once.key)
    assert repeated.feasible_count == once.feasible_count == int(np.count_nonzero(once.feasible))


class _Recorder:
    """A NodeExtra that records the bindings it is asked about (quiet for plain ones if told so)."""

    def __init__(self, name: str, quiet: bool):
        self.name = name
        self.quiet_for_plain_scalar = quiet
        self.calls: list[tuple[str, str]] = []

    def resize(self, capacity: int) -> None: ...
    def set_node(self, index: int, node: object) -> None: ...
    def move(self, src: int, dst: int) -> None: ...
    def clear(self, index: int) -> None: ...
    def assume(self, index: int, binding: Any) -> None:
        self.calls.append(("assume", binding.workload))

    def forget(self, index: int, binding: Any) -> None:
        self.calls.append(("forget", binding.workload))

    def snapshot(self) -> object:
        return None

    def restore(self, snapshot: object) -> None: ...
    def violations(self) -> list[str]:
        return []


def test_extras_quiet_for_plain_scalar_bindings_are_skipped_for_those_only() -> None:
    """ClusterState skips an extra that declares `quiet_for_plain_scalar` for a binding of scalar
    amounts only, and still calls it for a binding with a cpuset; other extras see every binding."""
    state = ClusterState.from_nodes([make_node("n0").cpu(8).memory("16Gi").topology().obj()])
    quiet, busy = state.attach(_Recorder("quiet", True)), state.attach(_Recorder("busy", False))
    sched = Scheduler(state)
    plain = sched.schedule_one(make_workload("plain").req(cpu="1", memory="1Gi").obj())
    pinned = plain.model_copy(update={"workload": "default/pinned", "cpuset": CPUSet([0, 1])})
    state.assume(pinned)
    state.forget(pinned.workload)
    state.forget(plain.workload)
    assert quiet.calls == [("assume", "default/pinned"), ("forget", "default/pinned")]
    assert busy.calls == [("assume", plain.workload), ("assume", "default/pinned"), ("forget", "default/pinned"),
                          ("forget", plain.workload)]  # fmt: skip
    assert plain_scalar(plain) and not plain_scalar(pinned)


class _Reserver:
    """A pre_filter/reserve/pre_bind plugin that skips unless the workload asks for `extra`, and
    records its reserve and pre_bind calls; `IDLE_WHEN_SKIPPED` set per subclass."""

    NAME = "Reserver"
    calls: list[str]

    def __init__(self) -> None:
        self.calls = []

    def pre_filter(self, cycle: Any, request: Any, nodes: Any) -> Any:
        from finesched.sched.framework import SKIP, SUCCESS

        return SUCCESS if "example.com/extra" in request.workload.requests else SKIP

    def reserve(self, cycle: Any, request: Any, node: int) -> Any:
        from finesched.sched.framework import SUCCESS

        self.calls.append("reserve")
        return SUCCESS

    def unreserve(self, cycle: Any, request: Any, node: int) -> None:
        self.calls.append("unreserve")

    def pre_bind(self, cycle: Any, request: Any, node: int, binding: Any) -> Any:
        self.calls.append("pre_bind")
        return binding


class _IdleReserver(_Reserver):
    IDLE_WHEN_SKIPPED = True


@pytest.mark.parametrize(("cls", "skipped_calls"), [(_Reserver, 2), (_IdleReserver, 0)])
def test_reserve_and_pre_bind_skip_only_plugins_idle_when_skipped(cls: type[_Reserver], skipped_calls: int) -> None:
    """A plugin declaring IDLE_WHEN_SKIPPED is left out of reserve and pre_bind in cycles where its
    pre_filter skipped, and runs in the others; a plugin without the declaration always runs."""
    from finesched.sched.registry import default_registry

    plugin = cls()
    registry = default_registry().with_plugins({"Reserver": lambda args: plugin})
    profile = {
        "name": "reserver",
        "plugins": [{"name": "ResourcesFit"}, {"name": "LeastRequested"}, {"name": "Reserver"}],
    }
    node = make_node("n0").cpu(8).memory("16Gi").resource("example.com/extra", 4).obj()
    sched = Scheduler(ClusterState.from_nodes([node]), profile, registry=registry)
    sched.schedule_one(make_workload("plain").req(cpu="1", memory="1Gi").obj())
    assert len(plugin.calls) == skipped_calls
    plugin.calls.clear()
    sched.schedule_one(make_workload("extra").req(cpu="1", memory="1Gi").request("example.com/extra", 1).obj())
    assert plugin.calls == ["reserve", "pre_bind"]


@pytest.mark.parametrize("profile", sorted(PROFILES))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacities=st.lists(st.tuples(st.integers(1, 96_000), st.integers(1, 2**40)), min_size=1, max_size=30),
    loads=st.lists(st.tuples(st.integers(0, 29), st.integers(1, 64_000), st.integers(1, 2**38)), max_size=40),
    request=st.tuples(st.integers(1, 32_000), st.integers(1, 2**36), st.sampled_from([None, "a", "b"])),
    dirty=st.lists(st.integers(0, 29), min_size=1, max_size=60),
    cordoned=st.sets(st.integers(0, 29), max_size=5),
)
def test_the_compiled_patch_writes_what_evaluate_and_the_key_give(
    profile: str,
    capacities: list[tuple[int, int]],
    loads: list[tuple[int, int, int]],
    request: tuple[int, int, str | None],
    dirty: list[int],
    cordoned: set[int],
) -> None:
    """plugins/fused_kernel.py against the numpy passes it replaces, node by node: odd capacities
    and loads (in millicores and bytes, so shares round), repeated dirty nodes, cordoned nodes,
    a node selector, and the seeded tie-break; the feasible count moves by the returned delta."""
    assert wait_for_kernel()
    nodes = []
    for i, (cpu_m, memory) in enumerate(capacities):
        node = make_node(f"n{i}").cpu(f"{cpu_m}m").memory(memory).pods(100).label("zone", "ab"[i % 2])
        if i in cordoned:
            node = node.label(UNSCHEDULABLE_LABEL, "cordoned")
        nodes.append(node.obj())
    state = ClusterState.from_nodes(nodes)
    scheduler = Scheduler(state, PROFILES[profile])
    for j, (i, cpu_m, memory) in enumerate(loads):  # load the nodes where it fits
        if i < state.n:
            w = make_workload(f"load{j}").req(cpu=f"{cpu_m}m", memory=memory).obj()
            binding = scheduler._binding(scheduler._compiler.compile(w, request_shape(w)), i, 0)
            with contextlib.suppress(StateError):
                state.assume(binding)
    cpu_m, memory, zone = request
    builder = make_workload("w").req(cpu=f"{cpu_m}m", memory=memory)
    workload = (builder.selector(zone=zone) if zone is not None else builder).obj()
    compiled, cycle, skipped, _ = scheduler._prepare(workload)
    assert scheduler._fused is not None
    fused = scheduler._fused.path(compiled, skipped)  # the scalar path, also inside the device path
    assert fused is not None and fused.patchable(compiled, skipped)
    index = np.array([i % state.n for i in dirty], dtype=np.intp)
    batch = NodeBatch(state, index=index)
    mask, total = fused.evaluate(cycle, compiled, batch, skipped)
    expected_key = scheduler._key_of(total, batch, mask)
    rng = np.random.default_rng(len(dirty))
    feasible = rng.random(state.n) < 0.5
    key = np.where(feasible, rng.integers(0, 1000, state.n), -1)
    before = int(np.count_nonzero(feasible))
    ranks = scheduler._tie_ranks() if scheduler.profile.tie_break == "random" else None
    delta = fused.patch(cycle, compiled, batch, skipped, feasible, key, ranks)
    assert delta is not None  # the kernel took it
    assert np.array_equal(feasible[index], mask) and np.array_equal(key[index], expected_key)
    assert before + delta == int(np.count_nonzero(feasible))
