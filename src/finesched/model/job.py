"""A dataflow job (seed S2, Flink FLIP-53): tasks of chained operators, edges, slot sharing groups.

This module is the manifest shape only: what a user may write and its structural checks (ids
unique, edges between existing tasks, no cycles). Compiling a job into pipelined regions, slot
requests and managed-memory fractions (S2.2-S2.4) belongs to `finesched.dataflow`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from finesched.model.base import FrozenDict, FrozenStrDict, Loc, Model, raise_problems
from finesched.model.resources import ByteQuantity, CountQuantity, CPUQuantity


class _ResourceFields(Model):
    """Flink-style resource dimensions (S2.1), each a quantity in its own unit; unspecified ones are 0."""

    cpu: CPUQuantity = 0
    task_heap: ByteQuantity = 0
    task_off_heap: ByteQuantity = 0
    managed_on_heap: ByteQuantity = 0
    managed_off_heap: ByteQuantity = 0
    gpu: CountQuantity = 0


class OperatorResources(_ResourceFields):
    """An operator's declared ResourceSpec (S2.1)."""


class SlotProfile(_ResourceFields):
    """The default slot used for groups whose resources are unknown (S2.3)."""


class ManagedMemoryUse(Model):
    on_heap: bool = False
    off_heap: bool = False


class Operator(Model):
    """One operator; without `resources` it is "unknown" (S2.1)."""

    id: str = Field(min_length=1)
    resources: OperatorResources | None = None
    uses_managed_memory: ManagedMemoryUse | None = None


class Task(Model):
    """Chained operators that run as one parallel instance per subtask."""

    id: str = Field(min_length=1)
    parallelism: PositiveInt = 1
    slot_sharing_group: str | None = None
    operators: tuple[Operator, ...] = Field(min_length=1)


class Edge(Model):
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    type: Literal["pipelined", "blocking"] = "pipelined"
    pattern: Literal["all-to-all", "pointwise"] = "all-to-all"


class Job(Model):
    name: str = Field(min_length=1)
    namespace: str = Field(default="default", min_length=1)
    labels: FrozenStrDict = Field(default_factory=FrozenDict)
    mode: Literal["streaming", "batch"] = "streaming"
    all_sources_in_same_region: bool | None = None
    default_slot: SlotProfile = Field(default_factory=SlotProfile)
    tasks: tuple[Task, ...] = Field(min_length=1)
    edges: tuple[Edge, ...] = ()

    @model_validator(mode="after")
    def _structure(self) -> Job:
        if self.all_sources_in_same_region is None:
            object.__setattr__(self, "all_sources_in_same_region", self.mode == "streaming")
        raise_problems(self._problems(), "Job")
        return self

    def _problems(self) -> list[tuple[Loc, str, object]]:
        problems: list[tuple[Loc, str, object]] = []
        ids: set[str] = set()
        operator_ids: set[str] = set()
        for i, task in enumerate(self.tasks):
            if task.id in ids:
                problems.append((("tasks", i, "id"), "duplicate task id", task.id))
            ids.add(task.id)
            for j, op in enumerate(task.operators):
                if op.id in operator_ids:
                    problems.append((("tasks", i, "operators", j, "id"), "duplicate operator id", op.id))
                operator_ids.add(op.id)
        for i, edge in enumerate(self.edges):
            for field, end in (("from", edge.source), ("to", edge.target)):
                if end not in ids:
                    problems.append((("edges", i, field), "no task has this id", end))
            if edge.source == edge.target:
                problems.append((("edges", i, "to"), "an edge joins two different tasks", edge.target))
        if not problems and self._has_cycle():
            problems.append((("edges",), "the task graph has a cycle; a dataflow job is a DAG", len(self.edges)))
        return problems

    def _has_cycle(self) -> bool:
        successors: dict[str, list[str]] = {t.id: [] for t in self.tasks}
        for edge in self.edges:
            successors[edge.source].append(edge.target)
        state: dict[str, int] = {}  # 1 = on the current path, 2 = done

        def visit(task: str) -> bool:
            state[task] = 1
            for nxt in successors[task]:
                if state.get(nxt) == 1 or (nxt not in state and visit(nxt)):
                    return True
            state[task] = 2
            return False

        return any(task not in state and visit(task) for task in successors)
