"""Unresolvable is a property of the node alone: it could not fit the workload even with every workload gone.

Sources: kube-scheduler's UnschedulableAndUnresolvable (framework/interface.go: "preemption would not change
anything"); NodeResourcesFit marks a node unresolvable when the request exceeds its *allocatable*
(noderesources/fit.go, InsufficientResource.Unresolvable), per node; the extender protocol's
FailedAndUnresolvableNodes (extender/v1/types.go) and DefaultPreemption's candidate set (preemption.go
findCandidates: only Unschedulable nodes are tried). Each case judges node "x" beside an unrelated node "y"
that could fit after evictions, and alone: the answer for x must not change.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # starlette's TestClient warns about its httpx dependency on import
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from builders import make_node, make_workload
from finesched.k8s.app import create_app
from finesched.k8s.assess import Assessor
from finesched.k8s.setup import build_extender
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError, unresolvable_nodes
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GPU_60G = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "60Gi"}


def with_requests(builder, requests: dict[str, str]):
    for name, amount in requests.items():
        builder = builder.request(name, amount)
    return builder


def verdicts(nodes: list[Node], busy: dict[str, dict[str, str]], w: Workload) -> dict[str, tuple[str, bool]]:
    """{node: (reason, unresolvable)} as the extender's assessment gives them; `busy` binds one workload
    (its requests) on a node first."""
    s = Scheduler(ClusterState.from_nodes(nodes))
    for name, requests in busy.items():
        s.schedule_one(with_requests(make_workload(f"load-{name}"), requests).selector(node=name).obj())
    assessment = Assessor(s).assess(w, "w")
    return {s.state.names[i]: assessment.reason(i) for i in range(s.state.n) if not assessment.feasible[i]}


def labelled(builder) -> Node:
    data = builder.data()
    return builder.label("node", data["name"]).obj()


CASES = [
    # NodeResourcesFit: x has 2 CPUs, the workload asks 4 -> unresolvable; y has 8, all held -> "insufficient
    # cpu" there too, but evicting the load would help: resolvable.
    pytest.param(
        labelled(make_node("x").cpu("2").memory("8Gi")),
        labelled(make_node("y").cpu("8").memory("8Gi")),
        {"y": {"cpu": "8"}},
        make_workload("w").req(cpu="4").obj(),
        ("insufficient cpu (ResourcesFit)", True),
        id="cpu-above-allocatable",
    ),
    # DeviceShare: x's only GPU has 40Gi, the workload asks 60Gi of one card -> no card could ever hold it;
    # y's 80Gi card is held by a 70Gi share: resolvable.
    pytest.param(
        labelled(make_node("x").cpu("8").memory("8Gi").gpus(1, memory="40Gi")),
        labelled(make_node("y").cpu("8").memory("8Gi").gpus(1, memory="80Gi")),
        {"y": {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "70Gi"}},
        with_requests(make_workload("w").req(cpu="1"), GPU_60G).obj(),
        ("insufficient gpu-memory on any single GPU (DeviceShare)", True),
        id="no-card-with-enough-memory",
    ),
    # NUMAAlign, SingleNUMANode: x's NUMA nodes have 2 CPUs each, the workload asks 3 on one -> no zone can
    # ever hold it; y's NUMA nodes have 4 CPUs, held by a 4-CPU and a 2-CPU load: resolvable.
    pytest.param(
        labelled(make_node("x").cpu("4").memory("8Gi").topology(1, 2, 2, 1).numa(2, memory="4Gi")),
        labelled(make_node("y").cpu("8").memory("8Gi").topology(1, 2, 4, 1).numa(2, memory="4Gi")),
        {"y": {"cpu": "7"}},
        make_workload("w").req(cpu="3", memory="1Gi").set(numaTopologyPolicy="SingleNUMANode").obj(),
        ("node(s) cannot fit the request on a single NUMA node (NUMAAlign)", True),
        id="numa-policy-no-zone-can-meet",
    ),
    # NUMAAlign with devices: x has 2 GPUs per NUMA node, the workload asks 3 on one -> never; y has 4 per NUMA
    # node, 3 of each held: resolvable (its DeviceShare reason, "insufficient free GPUs", is resolvable too).
    pytest.param(
        labelled(make_node("x").cpu("8").memory("8Gi").topology(1, 2, 4, 1).numa(2, "4Gi").gpus(4, numa=[0, 0, 1, 1])),
        labelled(
            make_node("y").cpu("8").memory("8Gi").topology(1, 2, 4, 1).numa(2, "4Gi").gpus(8, numa=[0] * 4 + [1] * 4)
        ),
        {"y": {"nvidia.com/gpu": "6"}},
        make_workload("w").req(cpu="1").request("nvidia.com/gpu", "3").set(numaTopologyPolicy="SingleNUMANode").obj(),
        ("node(s) cannot fit the request on a single NUMA node (NUMAAlign)", True),
        id="numa-policy-devices-no-zone-can-meet",
    ),
]


@pytest.mark.parametrize(("x", "y", "busy", "w", "want"), CASES)
def test_unresolvable_is_per_node(x: Node, y: Node, busy: dict, w: Workload, want: tuple[str, bool]) -> None:
    alone = verdicts([x], {k: v for k, v in busy.items() if k == "x"}, w)
    with_y = verdicts([x, y], busy, w)
    y_first = verdicts([y, x], busy, w)
    assert alone["x"] == with_y["x"] == y_first["x"] == want
    assert with_y["y"][1] is False  # y could fit once its load is gone


def test_extender_reports_the_node_in_failed_and_unresolvable() -> None:
    x = make_node("x").cpu("8").memory("8Gi").gpus(1, memory="40Gi").obj()
    # y's 80Gi card is held, here by a workload outside finesched: y could fit once it is gone, x never
    held = [{"type": "gpu", "minor": 0, "resources": {"gpu-core": 100, "gpu-memory-ratio": 100}}]
    y = make_node("y").cpu("8").memory("8Gi").gpus(1, memory="80Gi").set(foreignAllocations=held).obj()
    http = TestClient(create_app(build_extender([x, y])))
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", **GPU_60G}}}]},
    }
    body = http.post("/filter", json={"Pod": pod, "NodeNames": ["x", "y"], "Nodes": None}).json()
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"] == {"x": "insufficient gpu-memory on any single GPU (DeviceShare)"}
    assert set(body["FailedNodes"]) == {"y"}


def test_fit_error_is_unresolvable_only_when_every_node_is() -> None:
    x = make_node("x").cpu("2").memory("8Gi").obj()
    y = make_node("y").cpu("8").memory("8Gi").label("node", "y").obj()
    s = Scheduler(ClusterState.from_nodes([x]))
    with pytest.raises(FitError) as alone:
        s.schedule_one(make_workload("w").req(cpu="4").obj())
    assert alone.value.unresolvable
    s = Scheduler(ClusterState.from_nodes([x, y]))
    s.schedule_one(make_workload("load").req(cpu="8").selector(node="y").obj())
    with pytest.raises(FitError) as both:
        s.schedule_one(make_workload("w").req(cpu="4").obj())
    assert not both.value.unresolvable  # y could take it after an eviction


# Property: a node's answer reads that node alone -------------------------------------------------------------
NODE = st.tuples(
    st.integers(1, 8),  # allocatable CPUs
    st.integers(0, 8),  # CPUs held by a load
    st.sampled_from([0, 40, 80]),  # GiB of the node's one GPU (0: no GPU)
    st.integers(0, 100),  # percent of that GPU held
)


def unresolvable_of(spec: list[tuple[int, int, int, int]], w: Workload) -> list[bool]:
    nodes = []
    for i, (cpu, _, gib, _) in enumerate(spec):
        builder = make_node(f"n{i}").cpu(str(cpu)).memory("16Gi").label("node", f"n{i}")
        nodes.append((builder.gpus(1, memory=f"{gib}Gi") if gib else builder).obj())
    s = Scheduler(ClusterState.from_nodes(nodes))
    for i, (cpu, held, gib, pct) in enumerate(spec):
        load = make_workload(f"load{i}").req(cpu=str(min(held, cpu)) if held else "0").selector(node=f"n{i}")
        if gib and pct:
            load = with_requests(
                load, {"koordinator.sh/gpu-core": str(pct), "koordinator.sh/gpu-memory-ratio": str(pct)}
            )
        if held or (gib and pct):
            s.schedule_one(load.obj())
    request = s._compiler.compile(w, request_shape(w))
    cycle = CycleState()
    skipped = s.framework.run_pre_filter(cycle, request, NodeBatch(s.state))
    _, results = s.framework.run_filter(cycle, request, NodeBatch(s.state), skipped)
    return unresolvable_nodes(results, s.state.n).tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(NODE, min_size=1, max_size=4),
    extra=NODE,
    cpu=st.integers(1, 8),
    gpu=st.sampled_from([None, "20Gi", "60Gi"]),
)
def test_adding_an_unrelated_node_or_a_load_changes_no_answer(nodes, extra, cpu, gpu) -> None:
    w = make_workload("w").req(cpu=str(cpu))
    if gpu:
        w = with_requests(w, {"koordinator.sh/gpu-core": "10", "koordinator.sh/gpu-memory": gpu})
    workload = w.obj()
    before = unresolvable_of(nodes, workload)
    after = unresolvable_of([*nodes, extra], workload)
    assert after[: len(nodes)] == before
    assert before == [unresolvable_of([spec], workload)[0] for spec in nodes]
    # nor does what is bound: the verdict reads the node's fixed properties (preemption keeps it per shape)
    assert before == unresolvable_of([(alloc, 0, gib, 0) for alloc, _, gib, _ in nodes], workload)
    # and it means what it says: unresolvable exactly where the node could not fit the workload even idle
    for (alloc, _, gib, _), never in zip(nodes, before, strict=True):
        idle_fits = cpu <= alloc and (gpu is None or (gib > 0 and int(gpu[:-2]) <= gib))
        assert never == (not idle_fits)
