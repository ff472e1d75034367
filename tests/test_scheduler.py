"""The scheduling cycle end to end: placement, FitError reasons, ties, profiles, reserve fallback, memo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytest

from builders import make_node, make_workload
from finesched import ClusterState, FitError, Scheduler
from finesched.errors import ValidationError
from finesched.model.node import Node
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import SKIP, SUCCESS, Code, NodeBatch, ScoreArray, Status
from finesched.sched.profile import Profile
from finesched.sched.registry import Registry, default_registry, no_args
from finesched.sched.request import ScheduleRequest
from finesched.sched.runtime import ScoreRangeError

GI = 2**30


def cluster(*nodes: Node) -> ClusterState:
    return ClusterState.from_nodes(list(nodes))


def three_nodes() -> ClusterState:
    return cluster(
        make_node("small").cpu("2").memory("4Gi").obj(),
        make_node("big").cpu("16").memory("64Gi").label("zone", "a").obj(),
        make_node("mid").cpu("8").memory("16Gi").label("zone", "b").obj(),
    )


def profile(*plugins: str | dict[str, Any], **extra: Any) -> Profile:
    items = [p if isinstance(p, dict) else {"name": p} for p in plugins]
    return Profile.model_validate({"name": "test", "plugins": items, **extra})


def test_default_profile_spreads_to_least_requested_node() -> None:
    state = three_nodes()
    binding = Scheduler(state).schedule_one(make_workload("w", "ns").req(cpu="1", memory="1Gi").obj())
    # big: cpu 1/16 = 0.0625, mem 1/64 = 0.015625 -> least requested 96, balanced 100 - 4 * 0.000576... = 99
    assert binding.node == "big" and binding.workload == "ns/w" and binding.tenant == "ns"
    assert binding.requests == {"cpu": 1000, "memory": GI, "pods": 1}
    assert state.is_committed("ns/w")
    state.check_invariants()


def test_binpack_profile_fills_the_fullest_fitting_node() -> None:
    state = three_nodes()
    sched = Scheduler(state, "binpack")
    # small: cpu 1/2, mem 1/4 -> mean 0.375 -> 37, the highest MostAllocated score
    assert sched.schedule_one(make_workload("a").req(cpu="1", memory="1Gi").obj()).node == "small"
    assert sched.schedule_one(make_workload("b").req(cpu="1", memory="3Gi").obj()).node == "small"
    assert sched.schedule_one(make_workload("c").req(cpu="1", memory="1Gi").obj()).node == "mid"


def test_fit_error_counts_nodes_per_reason() -> None:
    state = three_nodes()
    w = make_workload("w").req(cpu="4").selector(zone="b").obj()
    Scheduler(state).schedule_one(make_workload("fill").req(cpu="6").selector(zone="b").obj())
    with pytest.raises(FitError) as info:
        Scheduler(state).schedule_one(w)
    # small and big fail the selector, small (2 cpu) is short of cpu too; mid (zone b) has 2 cpu left:
    # every filter's reasons count on every node they rejected
    assert info.value.message == "0/3 nodes available: 2 insufficient cpu, 2 node(s) didn't match node selector"
    assert info.value.reasons == {"node(s) didn't match node selector": 2, "insufficient cpu": 2}
    assert not info.value.unresolvable


def test_resource_no_node_offers_is_unresolvable() -> None:
    with pytest.raises(FitError) as info:
        Scheduler(three_nodes()).schedule_one(make_workload("w").request("example.com/foo", 1).obj())
    assert info.value.reasons == {"insufficient example.com/foo (no node offers it)": 3}
    assert info.value.unresolvable


def test_request_above_every_allocatable_is_unresolvable() -> None:
    with pytest.raises(FitError) as info:
        Scheduler(three_nodes()).schedule_one(make_workload("w").req(cpu="64").obj())
    assert info.value.reasons == {"insufficient cpu": 3} and info.value.unresolvable


def test_zero_allocatable_nodes_score_without_division_by_zero() -> None:
    state = cluster(make_node("zero").cpu("0").memory("0").obj(), make_node("one").cpu("1").memory("1Gi").obj())
    with np.errstate(all="raise"):
        assert Scheduler(state).schedule_one(make_workload("w").req(cpu="500m").obj()).node == "one"
        assert Scheduler(state).schedule_one(make_workload("be").obj()).node in ("zero", "one")


def test_empty_cluster_and_double_binding() -> None:
    with pytest.raises(FitError, match="0/0 nodes available"):
        Scheduler(ClusterState()).schedule_one(make_workload("w").obj())
    state = three_nodes()
    sched = Scheduler(state)
    w = make_workload("w").req(cpu="1").obj()
    sched.schedule_one(w)
    with pytest.raises(ValidationError, match="already bound"):
        sched.schedule_one(w)


def test_ties_break_by_lowest_index_or_seeded_order() -> None:
    nodes = [make_node(f"n{i}").cpu("4").memory("8Gi").obj() for i in range(8)]
    w = make_workload("w").req(cpu="1").obj()
    assert Scheduler(cluster(*nodes)).schedule_one(w).node == "n0"
    seeded = [
        Scheduler(cluster(*nodes), profile("ResourcesFit", "LeastRequested", tieBreak="random", seed=s))
        for s in range(6)
    ]
    picks = [s.schedule_one(w).node for s in seeded]
    again = [
        Scheduler(cluster(*nodes), profile("ResourcesFit", "LeastRequested", tieBreak="random", seed=s))
        .schedule_one(w)
        .node
        for s in range(6)
    ]
    assert picks == again  # the seed fixes the order
    assert len(set(picks)) > 1  # different seeds break ties differently


def test_batch_keeps_order_and_reports_failures_in_place() -> None:
    results = Scheduler(three_nodes()).schedule_batch(
        [make_workload("a").req(cpu="1").obj(), make_workload("b").req(cpu="100").obj(), make_workload("c").obj()]
    )
    assert [type(r).__name__ for r in results] == ["Binding", "FitError", "Binding"]


def test_gang_is_all_or_nothing() -> None:
    state = three_nodes()
    sched = Scheduler(state)
    members = [make_workload(f"m{i}").req(cpu="10").gang("g", 2).obj() for i in range(2)]
    with pytest.raises(FitError, match="gang g: member default/m1 does not fit"):
        sched.schedule_gang(members)  # only big (16 cpu) takes a 10-cpu member, and only one
    assert state.bindings == {} and state.free[0].tolist() == [2000, 16000, 8000]
    small = [make_workload(f"s{i}").req(cpu="6").gang("h", 2).obj() for i in range(2)]
    assert [b.node for b in sched.schedule_gang(small)] == ["big", "big"]  # cpu share 0.375 then 0.75: big both times


def test_release_gives_resources_back() -> None:
    state = three_nodes()
    sched = Scheduler(state)
    binding = sched.schedule_one(make_workload("w").req(cpu="2").obj())
    sched.release(binding)
    assert state.bindings == {} and state.free[0].tolist() == [2000, 16000, 8000]
    state.check_invariants()


# Profiles -------------------------------------------------------------------------------------------------
def test_unknown_plugin_lists_valid_names() -> None:
    with pytest.raises(ValidationError) as info:
        Scheduler(three_nodes(), profile("ResourcesFit", "NoSuchPlugin"))
    message = str(info.value)
    assert 'plugins[1].name: "NoSuchPlugin" unknown plugin; valid plugins:' in message
    assert "LeastRequested" in message and "ResourcesFit" in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param(
            {"name": "x", "plugins": [{"name": "LeastRequested", "weight": -1}]},
            "greater than or equal to 0",
            id="negative-weight",
        ),
        pytest.param(
            {"name": "x", "plugins": [{"name": "LeastRequested", "weight": 1.5}]},
            "valid integer",
            id="fractional-weight",
        ),
        pytest.param({"name": "x", "plugins": []}, "at least 1 item", id="no-plugins"),
        pytest.param(
            {"name": "x", "plugins": [{"name": "ResourcesFit"}], "tieBreak": "coin"},
            "'lowest-index' or 'random'",
            id="bad-tie-break",
        ),
    ],
)
def test_invalid_profiles_are_rejected(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        Scheduler(three_nodes(), spec)


def test_profile_loads_from_yaml_and_rejects_bad_files(tmp_path: Any) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: packing\nplugins:\n  - {name: ResourcesFit}\n  - {name: MostAllocated, weight: 2}\n")
    sched = Scheduler(three_nodes(), str(path))
    assert sched.profile.name == "packing" and sched.framework.points.score[0][1] == 2
    with pytest.raises(ValidationError, match="unknown profile"):
        Scheduler(three_nodes(), "nonexistent-profile")
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins: [{name: ResourcesFit, colour: red}]\n")
    with pytest.raises(ValidationError, match="colour"):
        Scheduler(three_nodes(), str(bad))


def test_plugin_enabled_twice_and_args_to_argless_plugin() -> None:
    with pytest.raises(ValidationError, match="enabled twice"):
        Scheduler(three_nodes(), profile("ResourcesFit", "ResourcesFit"))
    with pytest.raises(ValidationError, match="ResourcesFit takes no args"):
        Scheduler(three_nodes(), profile({"name": "ResourcesFit", "args": {"x": 1}}))


# Runtime rules with test plugins --------------------------------------------------------------------------
class OutOfRange:
    NAME: ClassVar[str] = "OutOfRange"

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        return np.full(nodes.n, 101, dtype=np.int64)


class Recorder:
    """Reserve fails on the nodes named in `refuse`; records every call."""

    NAME: ClassVar[str] = "Recorder"
    calls: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, refuse: tuple[int, ...] = ()):
        self.refuse = refuse

    def reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        Recorder.calls.append(("reserve", node))
        return Status.unschedulable("exact allocation impossible") if node in self.refuse else SUCCESS

    def unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        Recorder.calls.append(("unreserve", node))


class Second:
    NAME: ClassVar[str] = "Second"

    def reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        Recorder.calls.append(("second-reserve", node))
        return SUCCESS

    def unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        Recorder.calls.append(("second-unreserve", node))


class Gate:
    """pre_filter answers with the code in the workload's `gate` label."""

    NAME: ClassVar[str] = "Gate"

    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        code = request.workload.labels.get("gate")
        return SKIP if code is None else Status(Code[code], ("gate closed",))


def registry(**extra: Any) -> Registry:
    def factory(cls: Any, **kwargs: Any) -> Any:
        return lambda args: cls(**kwargs)

    base: Mapping[str, Any] = {
        "OutOfRange": no_args(OutOfRange),
        "Second": no_args(Second),
        "Gate": no_args(Gate),
        "Recorder": factory(Recorder, **extra),
    }
    return default_registry().with_plugins(base)


def test_out_of_range_scores_name_the_plugin() -> None:
    sched = Scheduler(three_nodes(), profile("ResourcesFit", "OutOfRange"), registry=registry())
    with pytest.raises(ScoreRangeError, match="plugin 'OutOfRange' returned an invalid score"):
        sched.schedule_one(make_workload("w").obj())


def test_failed_reserve_unreserves_in_reverse_and_tries_the_next_node() -> None:
    Recorder.calls.clear()
    state = three_nodes()
    # LeastRequested order for 1 cpu: big (index 1), mid (2), small (0); big refuses
    sched = Scheduler(
        state, profile("ResourcesFit", "LeastRequested", "Second", "Recorder"), registry=registry(refuse=(1,))
    )
    binding = sched.schedule_one(make_workload("w").req(cpu="1").obj())
    assert binding.node == "mid"
    assert Recorder.calls == [
        ("second-reserve", 1),
        ("reserve", 1),
        ("unreserve", 1),
        ("second-unreserve", 1),
        ("second-reserve", 2),
        ("reserve", 2),
    ]


def test_every_reserve_failing_is_reported() -> None:
    sched = Scheduler(three_nodes(), profile("ResourcesFit", "Recorder"), registry=registry(refuse=(0, 1, 2)))
    with pytest.raises(FitError) as info:
        sched.schedule_one(make_workload("w").req(cpu="1").obj())
    assert info.value.reasons == {"exact allocation impossible (Recorder)": 3}


def test_reserve_attempts_are_bounded() -> None:
    sched = Scheduler(
        three_nodes(), profile("ResourcesFit", "Recorder", maxReserveAttempts=1), registry=registry(refuse=(0, 1, 2))
    )
    with pytest.raises(FitError) as info:
        sched.schedule_one(make_workload("w").req(cpu="1").obj())
    assert info.value.reasons == {
        "exact allocation impossible (Recorder)": 1,
        "not tried (limit of 1 reserve attempts)": 2,
    }


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        pytest.param("ERROR", ValidationError, id="error-is-the-users"),
        pytest.param("UNSCHEDULABLE", FitError, id="unschedulable"),
        pytest.param("UNRESOLVABLE", FitError, id="unresolvable"),
    ],
)
def test_pre_filter_failures(code: str, outcome: type[Exception]) -> None:
    sched = Scheduler(three_nodes(), profile("Gate", "ResourcesFit"), registry=registry())
    w = make_workload("w").set(labels={"gate": code}).obj()
    with pytest.raises(outcome, match="gate closed"):
        sched.schedule_one(w)
    assert sched.schedule_one(make_workload("open").obj()).node  # SKIP passes


# Memo ---------------------------------------------------------------------------------------------------
class NotLocal:
    """A scorer that does not promise node-locality: disables the memo for its profile."""

    NAME: ClassVar[str] = "NotLocal"

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        return np.zeros(nodes.n, dtype=np.int64)


def test_memo_gives_the_same_decisions_as_full_evaluation() -> None:
    rng = np.random.default_rng(3)
    nodes = [
        make_node(f"n{i}")
        .cpu(str(int(rng.integers(2, 17))))
        .memory(f"{int(rng.integers(4, 65))}Gi")
        .label("zone", "ab"[i % 2])
        .obj()
        for i in range(40)
    ]
    shapes = [("1", "1Gi"), ("2", "4Gi"), ("500m", "512Mi"), ("4", "2Gi")]
    memo_state, plain_state = cluster(*nodes), cluster(*nodes)
    reg = default_registry().with_plugins({"NotLocal": no_args(NotLocal)})
    with_memo = Scheduler(memo_state, "default")
    without = Scheduler(
        plain_state, profile("NodeSelector", "ResourcesFit", "LeastRequested", "MostBalanced", "NotLocal"), registry=reg
    )
    assert with_memo.framework.node_local and not without.framework.node_local
    placed: list[str] = []
    for step in range(300):
        cpu, mem = shapes[int(rng.integers(len(shapes)))]
        builder = make_workload(f"w{step}").req(cpu=cpu, memory=mem)
        if step % 5 == 0:
            builder = builder.selector(zone="a")
        w = builder.obj()
        outcomes = []
        for sched in (with_memo, without):
            try:
                outcomes.append(sched.schedule_one(w).node)
            except FitError as exc:
                outcomes.append(exc.message)
        assert outcomes[0] == outcomes[1], step
        if isinstance(outcomes[0], str) and outcomes[0] in memo_state.index:
            placed.append(w.key)
        if placed and step % 7 == 0:  # releases make nodes dirty again
            key = placed.pop(int(rng.integers(len(placed))))
            with_memo.release(key)
            without.release(key)
    memo_state.check_invariants()


def bad_gpu_request(name: str) -> Any:
    """gpu-core alone (no memory) is an invalid device request: a pre_filter error, not a FitError."""
    return make_workload(name).req(cpu="1").request("koordinator.sh/gpu-core", 50).obj()


def test_an_invalid_request_does_not_stop_a_batch_or_a_run() -> None:
    from finesched.sched.diagnosis import InvalidRequest

    state = three_nodes()
    sched = Scheduler(state)
    with pytest.raises(ValidationError):
        sched.schedule_one(bad_gpu_request("direct"))
    results = sched.schedule_batch([make_workload("a").req(cpu="1").obj(), bad_gpu_request("bad")])
    assert results[0].node and isinstance(results[1], InvalidRequest) and results[1].unresolvable
    assert "invalid request" in str(results[1])
    sched.submit([bad_gpu_request("queued-bad"), make_workload("b").req(cpu="1").obj()])
    ran = sched.run()
    assert [type(r).__name__ for r in ran] == ["InvalidRequest", "Binding"]
    assert len(sched.queue) == 0
    sched.submit([bad_gpu_request("queued-bad")])  # dropped from the queue, so it may be submitted again
    state.check_invariants()


def test_batch_and_submit_skip_workloads_already_bound() -> None:
    sched = Scheduler(three_nodes())
    w = make_workload("w").req(cpu="1").obj()
    binding = sched.schedule_one(w)
    assert sched.schedule_batch([w]) == [binding]
    sched.submit([w])
    assert len(sched.queue) == 0 and sched.run() == []


def test_submit_is_all_or_nothing() -> None:
    sched = Scheduler(three_nodes())
    d1, d2 = make_workload("d1").req(cpu="1").obj(), make_workload("d2").req(cpu="1").obj()
    with pytest.raises(ValidationError, match="d1: is already queued"):
        sched.submit([d1, d2, d1])
    assert len(sched.queue) == 0
    sched.submit([d1])
    with pytest.raises(ValidationError, match="already queued"):
        sched.submit([d2, d1])
    assert len(sched.queue) == 1


@pytest.mark.parametrize("change", ["add", "update"])
def test_parked_work_is_retried_after_capacity_grows_between_runs(change: str) -> None:
    state = cluster(make_node("n1").cpu("2").memory("8Gi").obj())
    sched = Scheduler(state)
    sched.submit([make_workload("big").req(cpu="4").obj()])
    (first,) = sched.run()
    assert isinstance(first, FitError) and "insufficient cpu" in str(first)
    if change == "add":
        state.add_node(make_node("n2").cpu("8").memory("8Gi").obj())
    else:
        state.update_node(make_node("n1").cpu("16").memory("8Gi").obj())
    (second,) = sched.run()
    assert not isinstance(second, FitError) and second.node == ("n2" if change == "add" else "n1")


def test_evaluate_ranks_every_feasible_node_without_placing() -> None:
    state = three_nodes()
    sched = Scheduler(state)
    w = make_workload("w").req(cpu="3", memory="4Gi").obj()
    scores = sched.evaluate(w)
    assert set(scores) == {"big", "mid"} and not state.bindings
    binding = sched.schedule_one(w)
    assert binding.node == max(scores, key=lambda n: scores[n]) and binding.score == scores[binding.node]
    with pytest.raises(FitError, match="insufficient cpu"):
        sched.evaluate(make_workload("huge").req(cpu="64").obj())


def test_profile_errors_found_at_start_name_the_file_and_refuse_weights_on_filters(tmp_path: Any) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nplugins:\n  - {name: ResourcesFit, weight: 5}\n  - {name: LeastRequsted}\n")
    with pytest.raises(ValidationError) as caught:
        Scheduler(three_nodes(), str(path))
    lines = [str(e) for e in caught.value.errors]
    assert lines[0].startswith(f"{path}: plugins[0].weight: 5 ResourcesFit does not score")
    assert lines[1].startswith(f'{path}: plugins[1].name: "LeastRequsted" unknown plugin')


def test_a_gang_with_an_invalid_member_places_none_of_it() -> None:
    from finesched.sched.diagnosis import InvalidRequest

    state = three_nodes()
    sched = Scheduler(state)
    members = [make_workload("g0").req(cpu="1").gang("g", 2).obj(), bad_gpu_request("g1")]
    members[1] = members[1].model_copy(update={"gang": members[0].gang})
    with pytest.raises(ValidationError):
        sched.schedule_gang(members)
    assert not state.bindings
    sched.submit(members)
    results = sched.run()
    assert [type(r) for r in results] == [InvalidRequest, InvalidRequest] and not state.bindings
    state.check_invariants()


def test_a_gang_that_only_partly_fits_is_reported_and_the_run_ends() -> None:
    """The gang's rollback frees what it took; that must not count as new capacity for it."""
    state = cluster(make_node("a").cpu("4").memory("8Gi").obj())
    sched = Scheduler(state)
    sched.submit([make_workload(f"g{i}").req(cpu="3", memory="1Gi").gang("g", 2).obj() for i in range(2)])
    results = sched.run()
    assert [type(r) for r in results] == [FitError, FitError] and not state.bindings
    assert "none placed" in str(results[0])
