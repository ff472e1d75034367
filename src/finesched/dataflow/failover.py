"""Failover regions: which slots restart together when one fails (Flink's region failover, FLIP-1).

Flink restarts the tasks of the failed task's pipelined region only: a pipelined edge streams
data, so the region's other tasks cannot go on without it, while regions joined by blocking edges
(or not at all) keep running. finesched restarts slots, not single subtasks, so the unit is the
set of slots that hold subtasks of the same regions:

1. the execution-level pipelined regions (`CompiledJob.subtask_regions`: a pointwise edge joins
   only the subtasks it links);
2. subtask ``(task, i)`` lives in slot ``(group of task, i)``;
3. slots holding subtasks of one region restart together, and so, transitively, do regions that
   share a slot (restarting a slot restarts every subtask in it).

Worked example: sources a (2) and b (2) apart, a -> c (2) pointwise, b -> d (2) all-to-all,
groups by region (sa for {a, c}, sb for {b, d}). Regions: {a0, c0}, {a1, c1}, {b0, b1, d0, d1};
failover regions: {sa-0}, {sa-1}, {sb-0, sb-1}.
"""

from __future__ import annotations

from finesched.dataflow.compile import CompiledJob
from finesched.dataflow.regions import UnionFind

Slot = tuple[str, int]  # (slot sharing group, slot index)


def job_slots(compiled: CompiledJob) -> list[Slot]:
    """Every slot of the job, group by group (the order `gang_workloads` creates them in)."""
    return [(group, index) for group, count in compiled.group_slots.items() for index in range(count)]


def failover_regions(compiled: CompiledJob) -> list[frozenset[Slot]]:
    """The slots that restart together (module docstring), ordered by their first slot."""
    slots = job_slots(compiled)
    sets = UnionFind(slots)
    for region in compiled.subtask_regions():
        members = sorted({(compiled.group_of_task[task], index) for task, index in region})
        for other in members[1:]:
            sets.union(members[0], other)
    return sets.groups()


def region_tasks(compiled: CompiledJob, region: frozenset[Slot]) -> list[str]:
    """The tasks with a subtask in `region`'s slots, in manifest order."""
    held = {task for group, index in region for task in compiled.slot_tasks(group, index)}
    return [task for task in compiled.graph.task_ids if task in held]
