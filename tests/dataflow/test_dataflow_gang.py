"""A compiled job as a gang of slot workloads: requests, quotas annotation, all-or-nothing placement."""

from __future__ import annotations

import json

import pytest
from dataflow_builders import MiB, blocking, edge, make_job, op, task, uses

from builders import make_node, make_workload
from finesched.dataflow import QUOTAS_ANNOTATION, binding_quotas, compile_job, gang_workloads, place_gang
from finesched.dataflow.report import slot_records
from finesched.model.resources import ResourceVector
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


def _job():  # a (p=2) -> b (p=2) pipelined, then blocking to c (p=1)
    tasks = [
        task("a", op("read", cpu="1", taskHeap="1Gi", managedOffHeap="100Mi"), p=2),
        task("b", op("join", cpu="1", taskHeap="1Gi", taskOffHeap="512Mi", managedOffHeap="300Mi"), p=2),
        task("c", op("infer", cpu="2", taskHeap="2Gi", gpu=1), p=1),
    ]
    return make_job(tasks, [edge("a", "b"), blocking("b", "c")], network={"bufferSize": 0}, namespace="ml")


def test_one_workload_per_slot_with_the_groups_requests_and_quotas() -> None:
    job = _job()
    c = compile_job(job)
    workloads = gang_workloads(job, c)
    assert [w.key for w in workloads] == ["ml/j-region-0-0", "ml/j-region-0-1", "ml/j-region-1-0"]
    assert {w.gang.name for w in workloads} == {"j"} and {w.gang.min_member for w in workloads} == {3}
    # region-0: cpu 1 + 1; memory = heap 2Gi + off-heap 512Mi + managed 400Mi (+ network 0)
    assert workloads[0].requests == ResourceVector(cpu=2000, memory=2048 * MiB + 512 * MiB + 400 * MiB)
    # region-1: 2 cpu, 2Gi heap, one whole GPU -> gpu-core 100 + gpu-memory-ratio 100
    assert workloads[2].requests == {"cpu": 2000, "memory": 2048 * MiB, "gpu-core": 100, "gpu-memory-ratio": 100}
    # quotas of the slot's own operators: 100/400 and 300/400 of the 400Mi managed off-heap
    assert json.loads(workloads[0].annotations[QUOTAS_ANNOTATION]) == {"read": 100 * MiB, "join": 300 * MiB}
    assert json.loads(workloads[2].annotations[QUOTAS_ANNOTATION]) == {"infer": 0}
    assert workloads[1].labels["finesched.io/slot-sharing-group"] == "region-0"


def _cluster(gpus: int) -> ClusterState:
    return ClusterState.from_nodes(
        [make_node("n1").cpu("8").memory("32Gi").gpus(gpus).obj(), make_node("n2").cpu("2").memory("4Gi").obj()]
    )


def test_the_gang_fits_and_every_binding_carries_its_quotas() -> None:
    job = _job()
    state = _cluster(gpus=1)
    bindings = place_gang(Scheduler(state), job, compile_job(job))
    assert len(bindings) == 3 and set(state.bindings) == {b.workload for b in bindings}
    assert [binding_quotas(b) for b in bindings] == [
        {"read": 100 * MiB, "join": 300 * MiB},
        {"read": 100 * MiB, "join": 300 * MiB},
        {"infer": 0},
    ]
    assert bindings[2].device_minors("gpu") == [0]
    state.check_invariants()
    records = slot_records(gang_workloads(job, compile_job(job)), bindings)
    assert records[2]["binding"]["devices"]["gpu"][0]["minor"] == 0 and records[2]["quotas"] == {"infer": 0}


def test_a_gang_that_does_not_fit_leaves_no_partial_reservation() -> None:
    # the two region-0 slots fit on n1 but the GPU slot finds no GPU: nothing may stay reserved
    job = _job()
    state = _cluster(gpus=0)
    free_before = state.free.copy()
    with pytest.raises(FitError, match="gang j: member ml/j-region-1-0 does not fit"):
        place_gang(Scheduler(state), job, compile_job(job))
    assert state.bindings == {}
    assert (state.free == free_before).all()
    state.check_invariants()


def test_unknown_specs_slots_request_the_default_slot() -> None:
    job = make_job([task("t", uses("sort", off=True), p=3)], defaultSlot={"cpu": "2", "taskHeap": "1Gi"})
    workloads = gang_workloads(job, compile_job(job))
    # 1Gi heap + 512Mi managed off-heap + 64Mi network (the default slot's defaults)
    assert [dict(w.requests) for w in workloads] == [{"cpu": 2000, "memory": (1024 + 512 + 64) * MiB}] * 3
    assert [json.loads(w.annotations[QUOTAS_ANNOTATION]) for w in workloads] == [{"sort": 512 * MiB}] * 3


def test_the_scheduler_copies_the_quotas_annotation_and_nothing_else_onto_bindings() -> None:
    state = _cluster(gpus=0)
    annotations = {QUOTAS_ANNOTATION: '{"op":1}', "example.com/other": "x"}
    binding = Scheduler(state).schedule_one(make_workload("w").req(cpu="1").set(annotations=annotations).obj())
    assert binding.annotations == {QUOTAS_ANNOTATION: '{"op":1}'}
    assert state.bindings["default/w"].annotations == {QUOTAS_ANNOTATION: '{"op":1}'}
    plain = Scheduler(state).schedule_one(make_workload("v").req(cpu="1").obj())
    assert plain.annotations == {}


def _uneven(**spec: object):  # a (p=4: 1 cpu, 100Mi managed) -> b (p=2: 2 cpu, 300Mi managed), one group
    tasks = [
        task("a", op("x", cpu="1", managedOffHeap="100Mi"), p=4),
        task("b", op("y", cpu="2", managedOffHeap="300Mi"), p=2),
    ]
    return make_job(tasks, [edge("a", "b")], network={"bufferSize": 0}, **spec)


@pytest.mark.parametrize(
    ("trim", "want_requests", "want_quotas"),
    [
        # whole pipelines (default): all 4 slots ask for a + b: 3 cpu, 400Mi; quotas 100/400 and 300/400 of 400Mi
        pytest.param(
            False,
            [{"cpu": 3000, "memory": 400 * MiB}] * 4,
            [{"x": 100 * MiB, "y": 300 * MiB}] * 4,
            id="whole-pipelines",
        ),
        # trimmed: slots 2 and 3 hold only a subtask of a: 1 cpu, 100Mi; x's fraction there is 100/100 of 100Mi
        pytest.param(
            True,
            [{"cpu": 3000, "memory": 400 * MiB}] * 2 + [{"cpu": 1000, "memory": 100 * MiB}] * 2,
            [{"x": 100 * MiB, "y": 300 * MiB}] * 2 + [{"x": 100 * MiB}] * 2,
            id="trimmed",
        ),
    ],
)
def test_partial_pipelines(trim: bool, want_requests: list[dict[str, int]], want_quotas: list[dict[str, int]]) -> None:
    job = _uneven(trimPartialPipelines=trim)
    c = compile_job(job)
    assert c.slots_needed == 4 and c.slot_requests["region-0"]["cpu"] == 3000  # the group's (largest) slot either way
    workloads = gang_workloads(job, c)
    assert [dict(w.requests) for w in workloads] == want_requests
    assert [json.loads(w.annotations[QUOTAS_ANNOTATION]) for w in workloads] == want_quotas
    assert c.slot_tasks("region-0", 3) == ["a"]
    # the compile option overrides the manifest
    assert compile_job(job, trim_partial_pipelines=not trim).trim_partial_pipelines is (not trim)


def test_trimming_leaves_unknown_specs_on_the_default_slot_but_shares_it_among_present_users() -> None:
    tasks = [task("a", uses("x", off=True), p=2), task("b", uses("y", off=True), p=1)]
    job = make_job(tasks, [edge("a", "b")], trimPartialPipelines=True)
    c = compile_job(job)
    assert c.slot_profile("region-0", 1) == c.profiles["region-0"]  # the default slot
    # slot 0 holds x and y: 256Mi each of 512Mi; slot 1 holds x alone: all 512Mi
    assert [c.slot_quotas("region-0", i) for i in (0, 1)] == [{"x": 256 * MiB, "y": 256 * MiB}, {"x": 512 * MiB}]


def test_the_jobs_topology_is_its_slots_gangs_and_a_slice_must_divide_the_slots() -> None:
    from finesched.dataflow.compile import CompileError
    from finesched.model.topology import GangTopology

    rack = "topology.finesched.io/rack"
    asked = {"name": "dc", "required": rack}
    job = _job().model_copy(update={"topology": GangTopology.model_validate(asked)})
    workloads = gang_workloads(job, compile_job(job))  # 3 slots
    assert {w.gang.topology for w in workloads} == {job.topology} and {w.gang.min_member for w in workloads} == {3}
    assert gang_workloads(_job(), compile_job(_job()))[0].gang.topology is None
    sliced = GangTopology.model_validate({**asked, "slice": {"size": 2, "required": rack}})
    uneven = _job().model_copy(update={"topology": sliced})
    with pytest.raises(CompileError) as refused:
        gang_workloads(uneven, compile_job(uneven))
    (problem,) = refused.value.errors
    assert problem.path == "spec.topology.slice.size" and problem.value == 2 and "slot count (3)" in problem.message
    parsed = make_job(
        _job().model_dump(by_alias=True)["tasks"], topology={**asked, "slice": {"size": 3, "required": rack}}
    )
    assert parsed.topology is not None and parsed.topology.slice is not None and parsed.topology.slice.size == 3
