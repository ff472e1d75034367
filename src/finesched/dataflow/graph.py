"""The compiler's view of a dataflow job (seed S2): plain frozen values, built once from the Job manifest.

The manifest (`finesched.model.job`) is what a user writes; this is what the compiler reasons
about: a `ResourceSpec` of canonical integers per operator (or None, "unknown"), tasks of chained
operators, typed edges, and the adjacency the region and network rules walk. Each value keeps the
manifest path it came from, so a compile error names the field to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from finesched.model.job import Job, OperatorResources, SlotProfile

EdgeType = Literal["pipelined", "blocking"]
EdgePattern = Literal["all-to-all", "pointwise"]
Mode = Literal["streaming", "batch"]

#: The fixed dimensions of a spec, in the order every table and dict shows them.
SPEC_FIELDS = ("cpu", "task_heap", "task_off_heap", "managed_on_heap", "managed_off_heap", "network", "gpu")


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """Resources of one operator, task or slot, in canonical units (cpu millicores, memory bytes,
    gpu whole GPUs, extended resources in their finesched units); an unset field is 0.

    Operators never carry `network`: it is derived from the execution topology and added to
    slot profiles by the compiler (S2.3). Specs add field by field, extended resources by name.
    """

    cpu: int = 0
    task_heap: int = 0
    task_off_heap: int = 0
    managed_on_heap: int = 0
    managed_off_heap: int = 0
    network: int = 0
    gpu: int = 0
    extended: tuple[tuple[str, int], ...] = ()  # sorted by name, no zero amounts

    @classmethod
    def of(cls, resources: OperatorResources | SlotProfile) -> ResourceSpec:
        """The spec of a manifest resource block (an operator's resources or the default slot)."""
        return cls(
            cpu=resources.cpu,
            task_heap=resources.task_heap,
            task_off_heap=resources.task_off_heap,
            managed_on_heap=resources.managed_on_heap,
            managed_off_heap=resources.managed_off_heap,
            network=getattr(resources, "network", 0),
            gpu=resources.gpu,
            extended=_extended(resources.extended),
        )

    def __add__(self, other: ResourceSpec) -> ResourceSpec:
        merged = dict(self.extended)
        for name, amount in other.extended:
            merged[name] = merged.get(name, 0) + amount
        sums = {name: getattr(self, name) + getattr(other, name) for name in SPEC_FIELDS}
        return ResourceSpec(**sums, extended=_extended(merged))

    @property
    def managed(self) -> int:
        """Managed memory, both pools."""
        return self.managed_on_heap + self.managed_off_heap

    @property
    def memory(self) -> int:
        """Everything a slot of this spec holds in memory: heap + off-heap + managed + network (FLIP-49 total)."""
        return self.task_heap + self.task_off_heap + self.managed + self.network

    def as_dict(self) -> dict[str, int]:
        """The fixed dimensions (always present), `memory` (their memory total), then extended resources."""
        out = {name: getattr(self, name) for name in SPEC_FIELDS}
        out["memory"] = self.memory
        out.update(self.extended)
        return out


def _extended(amounts: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((k, v) for k, v in amounts.items() if v))


def sum_specs(specs: list[ResourceSpec]) -> ResourceSpec:
    total = ResourceSpec()
    for spec in specs:
        total = total + spec
    return total


@dataclass(frozen=True, slots=True)
class Operator:
    """One operator. `spec` None means its resources are unknown (S2.1); `uses_on_heap`/`uses_off_heap`
    say which managed pools it shares (from its spec when known; `declared` when the manifest said
    so, see `JobGraph.from_job`); `weight` is its share weight (S2.4)."""

    id: str
    spec: ResourceSpec | None
    uses_on_heap: bool
    uses_off_heap: bool
    weight: int
    path: str  # manifest field path, e.g. "spec.tasks[1].operators[0]"
    declared: bool = True


@dataclass(frozen=True, slots=True)
class Task:
    """A job vertex: chained operators that run as `parallelism` subtasks; `group` is the user's
    slot sharing group, or None for the region's group (S2.2)."""

    id: str
    operators: tuple[Operator, ...]
    parallelism: int
    group: str | None
    path: str

    @property
    def spec(self) -> ResourceSpec | None:
        """The sum of the chained operators' specs; None when they are unknown."""
        specs = [op.spec for op in self.operators]
        if any(spec is None for spec in specs):
            return None
        return sum_specs([s for s in specs if s is not None])


@dataclass(frozen=True, slots=True)
class Edge:
    """Data flowing from task `source` to task `target`."""

    source: str
    target: str
    type: EdgeType
    pattern: EdgePattern
    path: str


@dataclass(frozen=True)
class JobGraph:
    """Tasks and edges of one job, in manifest order, with adjacency by task id."""

    name: str
    namespace: str
    mode: Mode
    tasks: tuple[Task, ...]
    edges: tuple[Edge, ...]
    inputs: Mapping[str, tuple[Edge, ...]] = field(init=False, repr=False)
    outputs: Mapping[str, tuple[Edge, ...]] = field(init=False, repr=False)
    by_id: Mapping[str, Task] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        inputs: dict[str, list[Edge]] = {t.id: [] for t in self.tasks}
        outputs: dict[str, list[Edge]] = {t.id: [] for t in self.tasks}
        for edge in self.edges:
            if edge.target in inputs:
                inputs[edge.target].append(edge)
            if edge.source in outputs:
                outputs[edge.source].append(edge)
        object.__setattr__(self, "inputs", {k: tuple(v) for k, v in inputs.items()})
        object.__setattr__(self, "outputs", {k: tuple(v) for k, v in outputs.items()})
        object.__setattr__(self, "by_id", {t.id: t for t in self.tasks})

    @property
    def task_ids(self) -> list[str]:
        return [t.id for t in self.tasks]

    def task(self, task_id: str) -> Task:
        return self.by_id[task_id]

    @property
    def sources(self) -> list[str]:
        """Tasks that read no other task's output."""
        return [t.id for t in self.tasks if not self.inputs[t.id]]

    @property
    def operators(self) -> list[Operator]:
        return [op for task in self.tasks for op in task.operators]

    @classmethod
    def from_job(cls, job: Job) -> JobGraph:
        """The graph of `job`. Which managed pools an operator without resources uses is all or
        none per job, like resources themselves (S2.1): when no operator declares
        `usesManagedMemory`, every one counts as using both pools (Flink's default weight 1 for
        every operator); once any operator declares it, an operator that does not uses none."""
        declared_anywhere = any(op.uses_managed_memory is not None for t in job.tasks for op in t.operators)
        tasks = []
        for i, task in enumerate(job.tasks):
            operators = []
            for j, op in enumerate(task.operators):
                spec = ResourceSpec.of(op.resources) if op.resources is not None else None
                use = op.uses_managed_memory
                path = f"spec.tasks[{i}].operators[{j}]"
                if spec is not None:
                    on, off, declared = spec.managed_on_heap > 0, spec.managed_off_heap > 0, True
                elif use is not None:
                    on, off, declared = use.on_heap, use.off_heap, True
                else:
                    on = off = not declared_anywhere
                    declared = False
                operators.append(Operator(op.id, spec, on, off, op.weight or 1, path, declared))
            group = task.slot_sharing_group
            tasks.append(Task(task.id, tuple(operators), task.parallelism, group, f"spec.tasks[{i}]"))
        edges = tuple(Edge(e.source, e.target, e.type, e.pattern, f"spec.edges[{k}]") for k, e in enumerate(job.edges))
        return cls(job.name, job.namespace, job.mode, tuple(tasks), edges)
