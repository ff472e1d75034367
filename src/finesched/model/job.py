"""A dataflow job (seed S2, Flink FLIP-53): tasks of chained operators, edges, slot sharing groups.

This module is the manifest shape only: what a user may write and its structural checks (ids
unique, edges between existing tasks, parallelism >= 1, no cycles), each reported with its field
path and the task it concerns. Compiling a job into pipelined regions, slot requests and
managed-memory fractions (S2.2-S2.4) belongs to `finesched.dataflow`, which also owns the rule
that operators with and without resources do not mix (S2.1): it is a property of the whole job's
resource declarations, reported as a compile error.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from finesched.model.base import FrozenDict, FrozenStrDict, Loc, Model, raise_problems
from finesched.model.names import NamespaceName, ObjectName
from finesched.model.resources import ByteQuantity, CountQuantity, CPUQuantity, ResourceVector
from finesched.model.topology import GangTopology
from finesched.model.workload import DEFAULT_BACKOFF_LIMIT, RestartPolicy

MiB = 2**20
#: Flink's upper bound of a job vertex's (max) parallelism.
MAX_PARALLELISM = 32768


class _ResourceFields(Model):
    """Flink-style resource dimensions (S2.1), each a quantity in its own unit; unspecified ones are 0.

    `gpu` counts whole GPUs (a slot asks for gpu-core = gpu-memory-ratio = 100 per GPU);
    `extended` holds any other finesched resource by name (``rdma: 100``, a GPU share as
    ``gpu-core: 50`` with ``gpu-memory-ratio: 50``), added to the slot's requests as written.
    """

    cpu: CPUQuantity = 0
    task_heap: ByteQuantity = 0
    task_off_heap: ByteQuantity = 0
    managed_on_heap: ByteQuantity = 0
    managed_off_heap: ByteQuantity = 0
    gpu: CountQuantity = 0
    extended: ResourceVector = Field(default_factory=ResourceVector)

    @model_validator(mode="after")
    def _extended_names(self) -> _ResourceFields:
        own = {"cpu": "cpu", "memory": "taskHeap, taskOffHeap, managedOnHeap, managedOffHeap", "gpu": "gpu"}
        problems: list[tuple[Loc, str, object]] = [
            (("extended", name), f"is not an extended resource; use {own[name]}", self.extended[name])
            for name in self.extended
            if name in own
        ]
        raise_problems(problems, type(self).__name__)
        return self


class OperatorResources(_ResourceFields):
    """An operator's declared ResourceSpec (S2.1)."""


class SlotProfile(_ResourceFields):
    """The default slot, requested for every slot of a job whose resources are unknown (S2.3).

    Unlike an operator's spec it has network memory of its own (nothing to derive it from), and
    every field has a usable default, so ``defaultSlot: {cpu: 2}`` changes the cpu alone.
    """

    cpu: CPUQuantity = 1000
    task_heap: ByteQuantity = 512 * MiB
    managed_off_heap: ByteQuantity = 512 * MiB
    network: ByteQuantity = 64 * MiB


class NetworkMemory(Model):
    """The network-memory formula's parameters (S2.3; see `finesched.dataflow.network`)."""

    buffer_size: ByteQuantity = 32 * 1024
    buffers_per_channel: int = Field(default=2, ge=0)
    floating_buffers_per_gate: int = Field(default=8, ge=0)


class ManagedMemoryUse(Model):
    on_heap: bool = False
    off_heap: bool = False


class Operator(Model):
    """One operator; without `resources` it is "unknown" (S2.1).

    `uses_managed_memory` says which managed pools an unknown operator shares (S2.4: 1/n of the
    group's users each); when no operator of the job declares it, every operator counts as a user
    of both pools. `weight` replaces its 1 when the job sets `weightedFractions`.
    """

    id: str = Field(min_length=1)
    resources: OperatorResources | None = None
    uses_managed_memory: ManagedMemoryUse | None = None
    weight: PositiveInt | None = None


#: A variable a slot command may set: a shell name (the slot runs it under /bin/sh).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Names the node agent and the slot set themselves (subtask index, quotas, devices, ...).
RESERVED_ENV_PREFIX = "FINESCHED_"


def env_problems(env: dict[str, str]) -> list[tuple[Loc, str, object]]:
    """Names a slot's shell cannot export, or that finesched sets itself."""
    problems: list[tuple[Loc, str, object]] = []
    for name in env:
        if not ENV_NAME.fullmatch(name):
            problems.append((("env", name), "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", name))
        elif name.startswith(RESERVED_ENV_PREFIX):
            problems.append((("env", name), f"{RESERVED_ENV_PREFIX}* variables are set by finesched", name))
    return problems


class SlotRun(Model):
    """What every slot of one slot sharing group runs: `command` + `args` with `env` (added to the
    variables finesched gives each slot, see `finesched.dataflow.commands`)."""

    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: FrozenStrDict = Field(default_factory=FrozenDict)

    @model_validator(mode="after")
    def _env_names(self) -> SlotRun:
        raise_problems(env_problems(self.env), type(self).__name__)
        return self


class Task(Model):
    """Chained operators that run as one parallel instance per subtask. `command` (+ `args`, `env`)
    is what each subtask runs, unless the task's slot sharing group has a command of its own."""

    id: str = Field(min_length=1)
    parallelism: int = 1  # checked in Job so the error names the task
    #: Part of its slots' workload names (``<job>-<group>-<index>``), hence a DNS-1123 label.
    slot_sharing_group: NamespaceName | None = None
    # Emptiness is checked in Job: a tuple's min_length would also fire after an item's own error.
    operators: tuple[Operator, ...] = Field(json_schema_extra={"minItems": 1})
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: FrozenStrDict = Field(default_factory=FrozenDict)

    @model_validator(mode="after")
    def _env_names(self) -> Task:
        raise_problems(env_problems(self.env), "Task")
        return self


class Edge(Model):
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    type: Literal["pipelined", "blocking"] = "pipelined"
    pattern: Literal["all-to-all", "pointwise"] = "all-to-all"


class Job(Model):
    """A dataflow job. `all_sources_in_same_region` unset means true for streaming, false for batch (S2.2);
    `weighted_fractions` unset means true when any operator declares a weight;
    `trim_partial_pipelines` asks for a slot holding fewer tasks than its group to request only them.

    What runs: `slot_sharing_groups[name]` gives a group's slots one command, otherwise each task's
    own `command` runs (`finesched.dataflow.commands`). `restart_policy` OnFailure: a failed slot
    restarts the slots of its pipelined region (Flink's region failover), up to `backoff_limit`
    region restarts in all; Never: a failed slot fails the job."""

    name: ObjectName
    namespace: NamespaceName = "default"
    labels: FrozenStrDict = Field(default_factory=FrozenDict)
    mode: Literal["streaming", "batch"] = "streaming"
    all_sources_in_same_region: bool | None = None
    weighted_fractions: bool | None = None
    trim_partial_pipelines: bool = False
    default_slot: SlotProfile = Field(default_factory=SlotProfile)
    network: NetworkMemory = Field(default_factory=NetworkMemory)
    tasks: tuple[Task, ...] = Field(json_schema_extra={"minItems": 1})  # checked in `_problems`, with the rest
    edges: tuple[Edge, ...] = ()
    slot_sharing_groups: dict[str, SlotRun] = Field(default_factory=dict)
    restart_policy: RestartPolicy = "OnFailure"
    backoff_limit: int = Field(default=DEFAULT_BACKOFF_LIMIT, ge=0, le=1000)
    #: The PriorityClass of every slot (a Kubernetes Job's pod template names one the same way);
    #: none: the global default class, if any.
    priority_class_name: ObjectName | None = None
    #: Where the job's slots go in the network tree (a gang's `topology`, model/topology.py): its
    #: slots are the gang's members, in slot order (group by group, index by index); a slice size
    #: must divide the job's slot count (checked when it is compiled: dataflow/gang.py).
    topology: GangTopology | None = None

    @model_validator(mode="after")
    def _structure(self) -> Job:
        if self.all_sources_in_same_region is None:
            object.__setattr__(self, "all_sources_in_same_region", self.mode == "streaming")
        if self.weighted_fractions is None:
            weighted = any(op.weight is not None for task in self.tasks for op in task.operators)
            object.__setattr__(self, "weighted_fractions", weighted)
        raise_problems(self._problems(), "Job")
        return self

    def _problems(self) -> list[tuple[Loc, str, object]]:
        problems: list[tuple[Loc, str, object]] = []
        if not self.tasks:
            problems.append((("tasks",), "a job has at least one task", []))
        ids: set[str] = set()
        operator_ids: set[str] = set()
        for i, task in enumerate(self.tasks):
            if not task.operators:
                problems.append((("tasks", i, "operators"), f"task {task.id}: a task has at least one operator", []))
            if task.id in ids:
                problems.append((("tasks", i, "id"), "duplicate task id", task.id))
            ids.add(task.id)
            if not 1 <= task.parallelism <= MAX_PARALLELISM:
                bound = ">= 1" if task.parallelism < 1 else f"<= {MAX_PARALLELISM}"
                rule = f"task {task.id}: parallelism must be {bound}"
                problems.append((("tasks", i, "parallelism"), rule, task.parallelism))
            for j, op in enumerate(task.operators):
                if op.id in operator_ids:
                    problems.append((("tasks", i, "operators", j, "id"), "duplicate operator id", op.id))
                operator_ids.add(op.id)
        for i, edge in enumerate(self.edges):
            for field, end in (("from", edge.source), ("to", edge.target)):
                if end not in ids:
                    rule = f"no task has this id (edge {edge.source} -> {edge.target})"
                    problems.append((("edges", i, field), rule, end))
            if edge.source == edge.target:
                problems.append((("edges", i, "to"), "an edge joins two different tasks", edge.target))
        if not problems:
            cycle = find_cycle([t.id for t in self.tasks], [(e.source, e.target) for e in self.edges])
            if cycle:
                path = " -> ".join([*cycle, cycle[0]])
                where = next(i for i, e in enumerate(self.edges) if (e.source, e.target) == (cycle[-1], cycle[0]))
                closing = {"from": cycle[-1], "to": cycle[0]}
                problems.append(
                    (("edges", where), f"the task graph has a cycle ({path}); a dataflow job is a DAG", closing)
                )
        return problems


def find_cycle(tasks: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """The tasks of one directed cycle in order (empty when there is none); iterative, so deep graphs are fine."""
    successors: dict[str, list[str]] = {t: [] for t in tasks}
    for source, target in edges:
        if source in successors and target in successors:
            successors[source].append(target)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in tasks:
        if root in state:
            continue
        path: list[str] = [root]
        stack = [iter(successors[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(successors[nxt]))
    return []
