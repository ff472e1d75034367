"""Compiling a job: slot sharing groups (S2.2), slot requests and slot counts (S2.3), validation (S2.1)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dataflow_builders import MiB, blocking, chain, edge, make_job, op, task

from finesched.dataflow import CompileError, NetworkConfig, compile_job
from finesched.dataflow.graph import JobGraph
from finesched.dataflow.network import task_network_bytes
from finesched.errors import ValidationError
from finesched.model.job import Edge, Job, Operator, Task
from finesched.model.manifest import parse_manifest

NO_NETWORK = NetworkConfig(buffer_size=0)
KI_BUFFERS = NetworkConfig(buffer_size=1024, buffers_per_channel=2, floating_buffers_per_gate=8)


# Slot sharing groups ---------------------------------------------------------------------------------
def test_one_group_per_region_by_default() -> None:
    job = make_job(chain("a", "b", "c"), [edge("a", "b"), blocking("b", "c")])
    c = compile_job(job)
    assert c.regions == [frozenset("ab"), frozenset("c")]
    assert c.groups == {"region-0": frozenset("ab"), "region-1": frozenset("c")}


def test_user_groups_are_kept_and_shared_by_name_across_regions() -> None:
    # regions {a, b} and {c, d}; a and d are in the user's group "io" although their regions differ
    tasks = [task("a", group="io"), task("b"), task("c"), task("d", group="io")]
    c = compile_job(make_job(tasks, [edge("a", "b"), blocking("b", "c"), edge("c", "d")]))
    assert c.regions == [frozenset("ab"), frozenset("cd")]
    assert c.groups == {"io": frozenset("ad"), "region-0": frozenset("b"), "region-1": frozenset("c")}


def test_region_group_names_are_reserved() -> None:
    with pytest.raises(CompileError, match=r"spec.tasks\[0\].slotSharingGroup: \"region-1\" task a: group names"):
        compile_job(make_job([task("a", group="region-1")]))


# Slot requests ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tasks", "edges", "want"),
    [
        # a (1 cpu, 1Gi heap) chained with a second operator (500m, 256Mi off-heap) -> the task's spec is their sum
        pytest.param(
            [task("a", op("x", cpu="1", taskHeap="1Gi"), op("y", cpu="500m", taskOffHeap="256Mi"))],
            [],
            {"region-0": {"cpu": 1500, "task_heap": 1024 * MiB, "task_off_heap": 256 * MiB, "memory": 1280 * MiB}},
            id="chained-operators-add",
        ),
        # a -> b pipelined share one group: one slot holds a subtask of each, 1 + 2 cpu, 100 + 300 MiB managed
        pytest.param(
            [task("a", op("x", cpu="1", managedOffHeap="100Mi")), task("b", op("y", cpu="2", managedOnHeap="300Mi"))],
            [edge("a", "b")],
            {
                "region-0": {
                    "cpu": 3000,
                    "managed_off_heap": 100 * MiB,
                    "managed_on_heap": 300 * MiB,
                    "memory": 400 * MiB,
                }
            },
            id="group-sums-its-tasks",
        ),
        # a -> b blocking: two groups, each with its own task's spec
        pytest.param(
            [task("a", op("x", cpu="1")), task("b", op("y", cpu="2", gpu=1))],
            [blocking("a", "b")],
            {"region-0": {"cpu": 1000}, "region-1": {"cpu": 2000, "gpu": 1}},
            id="blocking-edge-two-profiles",
        ),
        # extended resources add by name: 50 + 30 rdma
        pytest.param(
            [task("a", op("x", cpu="1", extended={"rdma": 50}), op("y", cpu="1", extended={"rdma": 30}))],
            [],
            {"region-0": {"cpu": 2000, "rdma": 80}},
            id="extended-by-name",
        ),
    ],
)
def test_slot_request_is_the_sum_of_the_groups_task_specs(
    tasks: list[dict[str, Any]], edges: list[dict[str, Any]], want: dict[str, dict[str, int]]
) -> None:
    requests = compile_job(make_job(tasks, edges), network=NO_NETWORK).slot_requests
    assert set(requests) == set(want)
    for group, wanted in want.items():
        got = requests[group]
        assert {k: got[k] for k in wanted} == wanted
        assert all(v == 0 for k, v in got.items() if k not in wanted)  # every other dimension is 0


@pytest.mark.parametrize(
    ("tasks", "edges", "want"),
    [
        # a (p=2) -> b (p=4) all-to-all pipelined, 1 KiB buffers:
        # a: 4 subpartitions x 2 + 8 floating = 16 buffers; b: 2 channels x 2 + 8 = 12 buffers
        pytest.param([task("a", p=2), task("b", p=4)], [edge("a", "b")], {"a": 16, "b": 12}, id="all-to-all"),
        # a (p=4) -> b (p=2) pointwise: b reads ceil(4/2) = 2 channels -> 2 x 2 + 8 = 12; a writes 1 -> 1 x 2 + 8 = 10
        pytest.param(
            [task("a", p=4), task("b", p=2)], [edge("a", "b", pattern="pointwise")], {"a": 10, "b": 12}, id="pointwise"
        ),
        # a (p=3) -> b (p=3) blocking: a writes 3 subpartitions + 1 = 4; b reads 3 x 2 + 8 = 14
        pytest.param([task("a", p=3), task("b", p=3)], [blocking("a", "b")], {"a": 4, "b": 14}, id="blocking-output"),
        # b has two inputs (gates) from a (p=1) and c (p=2): 1 x 2 + 8 + 2 x 2 + 8 = 22
        pytest.param(
            [task("a"), task("b"), task("c", p=2)],
            [edge("a", "b"), edge("c", "b")],
            {"a": 10, "b": 22, "c": 10},
            id="two-gates",
        ),
    ],
)
def test_network_memory_formula(tasks: list[dict[str, Any]], edges: list[dict[str, Any]], want: dict[str, int]) -> None:
    graph = JobGraph.from_job(make_job(tasks, edges))
    assert {t: task_network_bytes(graph, t, KI_BUFFERS) // 1024 for t in want} == want


def test_slot_profile_adds_the_groups_network_memory() -> None:
    # a (p=2) -> b (p=4) in one group: network 16 KiB + 12 KiB = 28 KiB on top of 1 + 1 cpu and 1Gi heap
    tasks = [task("a", op("x", cpu="1", taskHeap="1Gi"), p=2), task("b", op("y", cpu="1"), p=4)]
    c = compile_job(make_job(tasks, [edge("a", "b")]), network=KI_BUFFERS)
    assert c.network == {"a": 16 * 1024, "b": 12 * 1024}
    assert c.slot_requests["region-0"]["network"] == 28 * 1024
    assert c.slot_requests["region-0"]["memory"] == 1024 * MiB + 28 * 1024


def test_network_config_comes_from_the_manifest() -> None:
    network = {"bufferSize": "1Ki", "buffersPerChannel": 2, "floatingBuffersPerGate": 8}
    job = make_job(
        [task("a", op("x", cpu="1"), p=2), task("b", op("y", cpu="1"), p=4)], [edge("a", "b")], network=network
    )
    assert compile_job(job).slot_requests["region-0"]["network"] == 28 * 1024


def test_unknown_specs_request_the_default_slot() -> None:
    job = make_job(chain("a", "b"), [blocking("a", "b")], defaultSlot={"cpu": "2", "taskHeap": "1Gi"})
    c = compile_job(job)
    # fields left out keep the default slot's defaults: 512Mi managed off-heap, 64Mi network
    want = {
        "cpu": 2000,
        "task_heap": 1024 * MiB,
        "task_off_heap": 0,
        "managed_on_heap": 0,
        "managed_off_heap": 512 * MiB,
        "network": 64 * MiB,
        "gpu": 0,
        "memory": (1024 + 512 + 64) * MiB,
    }
    assert c.slot_requests == {"region-0": want, "region-1": want}
    assert compile_job(job, default_slot={"cpu": "3"}).slot_requests["region-0"]["cpu"] == 3000


# Slot counts -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tasks", "edges", "mode", "want_slots", "want_components"),
    [
        # one group with parallelism 4 and 2: 4 slots (a slot holds one subtask of each task)
        pytest.param([task("a", p=4), task("b", p=2)], [edge("a", "b")], "streaming", 4, 4, id="max-in-group"),
        # two independent pipelines, streaming: one region (virtual source), 4 slots; components 4 + 3 = 7
        pytest.param(
            [task("a", p=4), task("b", p=4), task("c", p=3), task("d", p=1)],
            [edge("a", "b"), edge("c", "d")],
            "streaming",
            4,
            7,
            id="streaming-components",
        ),
        # batch, blocking a -> b: groups {a} and {b}: 4 + 2 = 6 slots; no component figure for batch
        pytest.param([task("a", p=4), task("b", p=2)], [blocking("a", "b")], "batch", 6, None, id="batch-groups-add"),
        # user groups: "x" holds a (p=3) and c (p=1) -> 3; b (p=5) in region-0 -> 5; total 8
        pytest.param(
            [task("a", p=3, group="x"), task("b", p=5), task("c", p=1, group="x")],
            [edge("a", "b"), edge("b", "c")],
            "streaming",
            8,
            5,
            id="user-groups-add",
        ),
    ],
)
def test_slots_needed(
    tasks: list[dict[str, Any]], edges: list[dict[str, Any]], mode: str, want_slots: int, want_components: int | None
) -> None:
    c = compile_job(make_job(tasks, edges, mode=mode))
    assert c.slots_needed == want_slots
    assert c.component_slots == want_components


# Validation ------------------------------------------------------------------------------------------------
def test_mixing_operators_with_and_without_specs_is_a_compile_error() -> None:
    job = make_job([task("a", op("x", cpu="1")), task("b", op("y"), op("z", cpu="1"))], [edge("a", "b")])
    with pytest.raises(CompileError) as info:
        compile_job(job)
    [problem] = info.value.errors
    assert problem.path == "spec.tasks[1].operators[0].resources"
    assert "operator y declares no resources" in problem.message and "(S2.1)" in problem.message
    assert isinstance(info.value, ValidationError)  # callers catching "bad input" catch it too


BAD = {
    "apiVersion": "finesched.io/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "bad"},
    "spec": {"tasks": [task("a"), task("b")], "edges": [edge("a", "b")]},
}


def _bad(change: str) -> dict[str, Any]:
    doc = copy.deepcopy(BAD)
    if change == "cycle":
        doc["spec"]["edges"].append(edge("b", "a"))
    elif change == "unknown-task":
        doc["spec"]["edges"].append(edge("b", "zz"))
    elif change == "zero-parallelism":
        doc["spec"]["tasks"][1]["parallelism"] = 0
    return doc


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        pytest.param("cycle", r"spec.edges\[1\]", r"has a cycle \(a -> b -> a\)", id="cycle"),
        pytest.param("unknown-task", r"spec.edges\[1\].to", r"\"zz\" no task has this id", id="unknown-task"),
        pytest.param(
            "zero-parallelism",
            r"spec.tasks\[1\].parallelism",
            r"0 task b: parallelism must be >= 1",
            id="zero-parallelism",
        ),
    ],
)
def test_bad_structure_is_refused_when_loaded_and_when_compiled(change: str, path: str, message: str) -> None:
    doc = _bad(change)
    with pytest.raises(ValidationError, match=f"{path}: .*{message}"):
        parse_manifest(doc)
    with pytest.raises(CompileError, match=f"{path}: .*{message}"):
        compile_job(doc)  # a manifest mapping is parsed by the compiler, errors as CompileError


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param("cycle", "spec.edges: the task graph has a cycle (a -> b -> a)", id="cycle"),
        pytest.param("unknown-task", 'spec.edges[1].to: "zz" no task has this id', id="unknown-task"),
        pytest.param("zero-parallelism", "spec.tasks[1].parallelism: 0 task b: parallelism must be >= 1", id="zero"),
    ],
)
def test_a_job_built_without_validation_is_still_checked(change: str, message: str) -> None:
    spec = _bad(change)["spec"]
    tasks = tuple(Task.model_construct(**{**t, "operators": (Operator(id=f"{t['id']}.op"),)}) for t in spec["tasks"])
    edges = tuple(
        Edge.model_construct(source=e["from"], target=e["to"], type=e["type"], pattern=e["pattern"])
        for e in spec["edges"]
    )
    raw = Job.model_construct(name="bad", tasks=tasks, edges=edges)  # defaults filled, no checks run
    with pytest.raises(CompileError) as info:
        compile_job(raw)
    assert message in str(info.value)


def test_a_spec_mapping_compiles_like_the_manifest() -> None:
    spec = {"name": "m", "tasks": [task("a", p=2)]}
    assert compile_job(spec).slots_needed == 2
    with pytest.raises(CompileError, match=r"spec.tasks\[0\].operators\[0\].resources.cpu"):
        compile_job({"name": "m", "tasks": [task("a", op("x", cpu="lots"))]})


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        pytest.param({"tasks": []}, ["spec.tasks: [] a job has at least one task"], id="no-tasks"),
        pytest.param(
            {"tasks": [{"id": "a", "operators": []}]},
            ["spec.tasks[0].operators: [] task a: a task has at least one operator"],
            id="no-operators",
        ),
        # one error for one bad value (no echo of the enclosing lists' lengths)
        pytest.param(
            {"tasks": [task("a", op("x", cpu="lots"))]},
            ['spec.tasks[0].operators[0].resources.cpu: "lots" is not a quantity'],
            id="one-bad-value-one-error",
        ),
        # cpu, memory and gpu have their own fields; extended resources are the others
        pytest.param(
            {"tasks": [task("a", op("x", cpu="1", extended={"gpu": 50, "rdma": 100}))]},
            ["spec.tasks[0].operators[0].resources.extended.gpu: 50 is not an extended resource; use gpu"],
            id="extended-gpu-refused",
        ),
    ],
)
def test_manifest_problems_one_line_each(spec: dict[str, Any], want: list[str]) -> None:
    doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Job", "metadata": {"name": "j"}, "spec": spec}
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc)
    lines = [str(e) for e in info.value.errors]
    assert len(lines) == len(want)
    assert all(line.startswith(prefix) for line, prefix in zip(lines, want, strict=True))
