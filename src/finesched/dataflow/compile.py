"""Compile a dataflow job: validation, pipelined regions, slot sharing groups, slot requests and
managed-memory fractions (seed S2, Flink FLIP-53). Pure: nothing here touches a cluster.

Steps, each a rule of the seed:

1. validate (S2.1): tasks and edges well formed (an edge to an unknown task, parallelism < 1, a
   cycle: each error names the task); operators with resources and operators without in one job
   is a compile error;
2. pipelined regions (S2.2; `finesched.dataflow.regions`);
3. slot sharing groups (S2.2): a task without a user group joins its region's group
   ``region-<k>``; user-named groups are shared by name across the whole job;
4. slot requests (S2.3): one slot per group per parallel pipeline; its profile is the sum of the
   group's task specs plus each task's network memory (`finesched.dataflow.network`), or the
   default slot when specs are unknown. Slots needed = Σ over groups of the group's largest
   parallelism; for streaming jobs also Σ over connected components of their largest parallelism
   (all components run at once: the fewest slots the job can run in if its components shared
   groups);
5. managed-memory fractions per operator (S2.4; `finesched.dataflow.fractions`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from finesched.dataflow.fractions import group_fractions, pool_quotas, split_pool
from finesched.dataflow.graph import JobGraph, ResourceSpec, sum_specs
from finesched.dataflow.network import NetworkConfig, task_network_bytes
from finesched.dataflow.regions import Subtask, connected_components, pipelined_regions, subtask_regions
from finesched.errors import ErrorDetail, ValidationError
from finesched.model.job import MAX_PARALLELISM, Job, SlotProfile, find_cycle
from finesched.model.manifest import API_VERSION, METADATA_FIELDS, parse_manifest

#: Names the compiler gives region groups; a user group may not take one.
REGION_GROUP = re.compile(r"region-\d+")


class CompileError(ValidationError):
    """A job that cannot be compiled; `errors` lists every problem with its manifest field path."""


@dataclass(frozen=True)
class CompiledJob:
    """What `compile_job` decides for one job; every field is plain data (see the module docstring)."""

    job: Job
    graph: JobGraph
    all_sources_in_same_region: bool
    weighted_fractions: bool
    #: Slots of a group holding fewer tasks than it (a task's parallelism is below the group's) ask
    #: for those tasks only, with fractions over their operators (`slot_profile`, `slot_quotas`).
    trim_partial_pipelines: bool
    #: True when every operator declares resources, False when none does (S2.1).
    specified: bool
    regions: list[frozenset[str]]
    groups: dict[str, frozenset[str]]
    #: Group -> per-slot profile (network included); the default slot when specs are unknown.
    profiles: dict[str, ResourceSpec]
    #: Group -> slots it needs: the largest parallelism among its tasks.
    group_slots: dict[str, int]
    slots_needed: int
    components: list[frozenset[str]]
    #: Streaming jobs: Σ over connected components of their largest parallelism; None for batch.
    component_slots: int | None
    fractions: dict[str, tuple[float, float]]
    #: Task -> network memory of one of its subtasks (bytes), whether or not specs are known.
    network: dict[str, int]
    #: Things that compile but are likely not what the user meant (e.g. managed-memory users of a
    #: pool the default slot has none of: their quota is 0).
    warnings: list[str]
    group_of_task: dict[str, str] = field(repr=False)
    group_of_operator: dict[str, str] = field(repr=False)
    operators_by_group: dict[str, tuple[str, ...]] = field(repr=False)
    tasks_by_group: dict[str, tuple[str, ...]] = field(repr=False)

    @property
    def slot_requests(self) -> dict[str, dict[str, int]]:
        """Group -> per-slot resources: cpu (millicores), task_heap, task_off_heap, managed_on_heap,
        managed_off_heap, network, gpu (whole GPUs), memory (their memory total), extended resources."""
        return {group: profile.as_dict() for group, profile in self.profiles.items()}

    def subtask_regions(self) -> list[frozenset[Subtask]]:
        """Pipelined regions per subtask ``(task, index)``: pointwise edges join only the subtasks they
        link (`finesched.dataflow.regions.subtask_regions`); computed on demand."""
        return subtask_regions(self.graph, self.all_sources_in_same_region)

    def quotas(self, slot_managed_bytes: int | tuple[int, int]) -> dict[str, int]:
        """Operator -> absolute managed-memory quota in bytes for a slot with this much managed memory.

        A pair is (on-heap, off-heap) bytes. One number is the slot's managed memory as a whole: the
        size of the one pool a group's operators use, or split between the pools as the group's slot
        profile splits them when they use both.
        quota = floor(on fraction x on-heap bytes) + floor(off fraction x off-heap bytes), per group
        never more than the pool (`finesched.dataflow.fractions.pool_quotas`).
        """
        out: dict[str, int] = {}
        for group in self.groups:
            if isinstance(slot_managed_bytes, tuple):
                pools = slot_managed_bytes
            else:
                pools = self._pools(group, slot_managed_bytes)
            out.update(self._quotas_in(group, pools))
        return {op.id: out[op.id] for op in self.graph.operators}

    def group_quotas(self, group: str) -> dict[str, int]:
        """Operator -> quota in one slot of `group`, from the pools of the group's own slot profile."""
        profile = self.profiles[group]
        return self._quotas_in(group, (profile.managed_on_heap, profile.managed_off_heap))

    def slot_tasks(self, group: str, index: int) -> list[str]:
        """The tasks slot `index` of `group` holds: one subtask of each task with parallelism > index."""
        return [t for t in self.tasks_by_group[group] if self.graph.task(t).parallelism > index]

    def slot_profile(self, group: str, index: int) -> ResourceSpec:
        """What slot `index` of `group` requests: the group's profile, or with `trim_partial_pipelines`
        and known specs only its own tasks' specs and network memory (the seed's parallel pipeline)."""
        tasks = self.slot_tasks(group, index)
        if not (self.trim_partial_pipelines and self.specified) or len(tasks) == len(self.groups[group]):
            return self.profiles[group]
        specs = [spec for spec in (self.graph.task(t).spec for t in tasks) if spec is not None]
        return sum_specs(specs) + ResourceSpec(network=sum(self.network[t] for t in tasks))

    def slot_quotas(self, group: str, index: int) -> dict[str, int]:
        """Operator -> quota in slot `index` of `group`: `group_quotas`, or with `trim_partial_pipelines`
        the fractions recomputed over the operators that slot holds, from its own profile's pools."""
        tasks = self.slot_tasks(group, index)
        if not self.trim_partial_pipelines or len(tasks) == len(self.groups[group]):
            return self.group_quotas(group)
        ops = [op for t in tasks for op in self.graph.task(t).operators]
        fractions = group_fractions(ops, self.weighted_fractions)
        profile = self.slot_profile(group, index)
        on = pool_quotas({op.id: fractions[op.id][0] for op in ops}, profile.managed_on_heap)
        off = pool_quotas({op.id: fractions[op.id][1] for op in ops}, profile.managed_off_heap)
        return {op.id: on[op.id] + off[op.id] for op in ops}

    def operators_of(self, group: str) -> list[str]:
        """The operator ids of `group`, in manifest order."""
        return list(self.operators_by_group[group])

    def _quotas_in(self, group: str, pools: tuple[int, int]) -> dict[str, int]:
        ops = self.operators_of(group)
        on = pool_quotas({op: self.fractions[op][0] for op in ops}, pools[0])
        off = pool_quotas({op: self.fractions[op][1] for op in ops}, pools[1])
        return {op: on[op] + off[op] for op in ops}

    def _pools(self, group: str, total: int) -> tuple[int, int]:
        """`total` managed bytes as (on-heap, off-heap) for `group`: all of it in the one pool its
        operators use; when they use both, split like the group's slot profile (which may hold one
        pool only: then all of it there), or half each when the profile has no managed memory."""
        used = [self.fractions[op] for op in self.operators_of(group)]
        on_used, off_used = any(f[0] for f in used), any(f[1] for f in used)
        if not (on_used and off_used):
            return (total, 0) if on_used else (0, total)
        profile = self.profiles[group]
        if profile.managed:
            return split_pool(total, profile.managed_on_heap, profile.managed_off_heap)
        return split_pool(total, 1, 1)


def compile_job(
    job: Job | Mapping[str, Any],
    *,
    all_sources_in_same_region: bool | None = None,
    weighted_fractions: bool | None = None,
    trim_partial_pipelines: bool | None = None,
    default_slot: SlotProfile | Mapping[str, Any] | None = None,
    network: NetworkConfig | None = None,
) -> CompiledJob:
    """Compile `job` (a parsed Job, or a Job manifest document or spec mapping); options given here
    override the manifest's. Raise CompileError listing every problem."""
    job = _as_job(job)
    graph = JobGraph.from_job(job)
    problems = _structure_problems(graph) or _mixing_problems(graph)
    if problems:
        raise CompileError(problems)
    same_region = _first_set(all_sources_in_same_region, job.all_sources_in_same_region, job.mode == "streaming")
    any_weight = any(op.weight != 1 for op in graph.operators)
    weighted = _first_set(weighted_fractions, job.weighted_fractions, any_weight)
    slot = _default_slot(job, default_slot)
    net = network or NetworkConfig.of(job.network)

    regions = pipelined_regions(graph, bool(same_region))
    group_of_task, group_problems = _assign_groups(graph, regions)
    if group_problems:
        raise CompileError(group_problems)
    groups = _members(graph, group_of_task)
    net_bytes = {t: task_network_bytes(graph, t, net) for t in graph.task_ids}
    specified = all(op.spec is not None for op in graph.operators)
    layout = _GroupLayout.of(graph, groups, net_bytes, specified=specified, default_slot=slot, weighted=bool(weighted))
    warnings = _pool_warnings(
        layout.profiles, layout.operators_by_group, layout.fractions, {op.id for op in graph.operators if op.declared}
    )
    components = connected_components(graph)
    component_slots = (
        sum(max(graph.task(t).parallelism for t in c) for c in components) if job.mode == "streaming" else None
    )
    return CompiledJob(
        job=job,
        graph=graph,
        all_sources_in_same_region=bool(same_region),
        weighted_fractions=bool(weighted),
        trim_partial_pipelines=_first_set(trim_partial_pipelines, job.trim_partial_pipelines),
        specified=specified,
        regions=regions,
        groups={name: frozenset(members) for name, members in groups.items()},
        profiles=layout.profiles,
        group_slots=layout.group_slots,
        slots_needed=sum(layout.group_slots.values()),
        components=components,
        component_slots=component_slots,
        fractions={op.id: layout.fractions[op.id] for op in graph.operators},
        network=net_bytes,
        warnings=warnings,
        group_of_task=group_of_task,
        group_of_operator=layout.group_of_operator,
        operators_by_group=layout.operators_by_group,
        tasks_by_group={name: tuple(members) for name, members in groups.items()},
    )


def _members(graph: JobGraph, group_of_task: dict[str, str]) -> dict[str, list[str]]:
    """Group name -> its task ids, in the graph's task order."""
    groups: dict[str, list[str]] = {}
    for task_id in graph.task_ids:
        groups.setdefault(group_of_task[task_id], []).append(task_id)
    return groups


@dataclass
class _GroupLayout:
    """Per slot sharing group: its slot profile and slot count, and its operators with their managed
    memory fractions."""

    profiles: dict[str, ResourceSpec] = field(default_factory=dict)
    group_slots: dict[str, int] = field(default_factory=dict)
    fractions: dict[str, tuple[float, float]] = field(default_factory=dict)
    group_of_operator: dict[str, str] = field(default_factory=dict)
    operators_by_group: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, graph: JobGraph, groups: dict[str, list[str]], net_bytes: dict[str, int], *, specified: bool,
        default_slot: ResourceSpec, weighted: bool,
    ) -> _GroupLayout:  # fmt: skip
        """The layout of `groups` (name -> task ids): each group's profile is the sum of its tasks' specs
        and network memory when every operator has a spec (`specified`), else `default_slot`."""
        layout = cls()
        for name, members in groups.items():
            tasks = [graph.task(t) for t in members]
            if specified:
                specs = [spec for spec in (t.spec for t in tasks) if spec is not None]
                layout.profiles[name] = sum_specs(specs) + ResourceSpec(network=sum(net_bytes[t] for t in members))
            else:
                layout.profiles[name] = default_slot
            layout.group_slots[name] = max(t.parallelism for t in tasks)
            ops = [op for t in tasks for op in t.operators]
            layout.fractions.update(group_fractions(ops, weighted))
            layout.group_of_operator.update({op.id: name for op in ops})
            layout.operators_by_group[name] = tuple(op.id for op in ops)
        return layout


def _pool_warnings(
    profiles: dict[str, ResourceSpec],
    operators_by_group: dict[str, tuple[str, ...]],
    fractions: dict[str, tuple[float, float]],
    declared: set[str],
) -> list[str]:
    """Groups whose operators declare using a managed pool their slot has none of (only the default
    slot can lack one: a known spec's users put their memory into the profile)."""
    out = []
    for name, profile in profiles.items():
        pools = (
            (profile.managed_on_heap, "on-heap", "managedOnHeap"),
            (profile.managed_off_heap, "off-heap", "managedOffHeap"),
        )
        for pool, (size, label, key) in enumerate(pools):
            users = [op for op in operators_by_group[name] if fractions[op][pool] > 0 and op in declared]
            if users and not size:
                out.append(
                    f"group {name}: operators {', '.join(users)} use {label} managed memory, but the default slot "
                    f"has none (set defaultSlot.{key}); their quota is 0"
                )
    return out


def _first_set(*values: bool | None) -> bool:
    """The first value that is not None (the option, then the manifest, then the rule's default)."""
    return next(bool(v) for v in values if v is not None)


def _as_job(job: Job | Mapping[str, Any]) -> Job:
    """A parsed Job; a mapping is read as a manifest document (with `kind`) or as a spec with `name`."""
    if isinstance(job, Job):
        return job
    if not isinstance(job, Mapping):
        raise CompileError(f"a job is a Job or a manifest mapping, got {type(job).__name__}")
    doc: Mapping[str, Any] = job
    if "kind" not in job:
        metadata = {k: v for k, v in job.items() if k in METADATA_FIELDS["Job"]}
        spec = {k: v for k, v in job.items() if k not in METADATA_FIELDS["Job"]}
        doc = {"apiVersion": API_VERSION, "kind": "Job", "metadata": metadata, "spec": spec}
    try:
        parsed = parse_manifest(doc)
    except ValidationError as exc:
        raise CompileError(exc.errors) from None
    if not isinstance(parsed, Job):
        raise CompileError(f"kind must be Job, got {doc.get('kind')!r}", path="kind")
    return parsed


def _default_slot(job: Job, given: SlotProfile | Mapping[str, Any] | None) -> ResourceSpec:
    if given is None:
        return ResourceSpec.of(job.default_slot)
    if isinstance(given, SlotProfile):
        return ResourceSpec.of(given)
    try:
        return ResourceSpec.of(SlotProfile.model_validate(given))
    except ValueError as exc:
        raise CompileError(f"default_slot is not a slot profile: {exc}", path="default_slot") from None


def _structure_problems(graph: JobGraph) -> list[ErrorDetail]:
    """The manifest's own checks, again: a Job built without validation must not compile into nonsense."""
    problems: list[ErrorDetail] = []
    if not graph.tasks:
        problems.append(ErrorDetail("spec.tasks", "a job has at least one task"))
    seen: set[str] = set()
    for task in graph.tasks:
        if not task.operators:
            problems.append(ErrorDetail(f"{task.path}.operators", f"task {task.id}: a task has at least one operator"))
        if task.id in seen:
            problems.append(ErrorDetail(f"{task.path}.id", "duplicate task id", task.id))
        seen.add(task.id)
        if not 1 <= task.parallelism <= MAX_PARALLELISM:
            bound = ">= 1" if task.parallelism < 1 else f"<= {MAX_PARALLELISM}"
            rule = f"task {task.id}: parallelism must be {bound}"
            problems.append(ErrorDetail(f"{task.path}.parallelism", rule, task.parallelism))
    operators: set[str] = set()
    for op in graph.operators:
        if op.id in operators:
            problems.append(ErrorDetail(f"{op.path}.id", "duplicate operator id", op.id))
        operators.add(op.id)
    for edge in graph.edges:
        for end, name in (("from", edge.source), ("to", edge.target)):
            if name not in seen:
                rule = f"no task has this id (edge {edge.source} -> {edge.target})"
                problems.append(ErrorDetail(f"{edge.path}.{end}", rule, name))
    if not problems:
        cycle = find_cycle(graph.task_ids, [(e.source, e.target) for e in graph.edges])
        if cycle:
            path = " -> ".join([*cycle, cycle[0]])
            problems.append(ErrorDetail("spec.edges", f"the task graph has a cycle ({path}); a dataflow job is a DAG"))
    return problems


def _mixing_problems(graph: JobGraph) -> list[ErrorDetail]:
    """S2.1: all operators of a job declare resources, or none does."""
    known = [op for op in graph.operators if op.spec is not None]
    unknown = [op for op in graph.operators if op.spec is None]
    if not known or not unknown:
        return []
    rule = (
        f"operator {{}} declares no resources while {len(known)} other operator(s) do (first: {known[0].id}); "
        "a job declares resources for all of its operators or for none (S2.1)"
    )
    return [ErrorDetail(f"{op.path}.resources", rule.format(op.id)) for op in unknown]


def _assign_groups(graph: JobGraph, regions: list[frozenset[str]]) -> tuple[dict[str, str], list[ErrorDetail]]:
    """Task -> slot sharing group name: the user's, else its region's ``region-<k>``."""
    region_of = {task: k for k, region in enumerate(regions) for task in region}
    out: dict[str, str] = {}
    problems: list[ErrorDetail] = []
    for task in graph.tasks:
        if task.group is not None and REGION_GROUP.fullmatch(task.group):
            rule = f"task {task.id}: group names region-<n> are kept for the regions' own groups"
            problems.append(ErrorDetail(f"{task.path}.slotSharingGroup", rule, task.group))
        out[task.id] = task.group if task.group is not None else f"region-{region_of[task.id]}"
    return out, problems
