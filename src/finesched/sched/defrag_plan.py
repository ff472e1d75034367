"""The defragmentation planner: which running workloads to move, and where, so that one waiting
workload fits (see sched/defrag.py for the contract). Pure: state in, plan out, nothing changed."""

from __future__ import annotations

from typing import Protocol

from finesched.model.workload import Workload
from finesched.sched.defrag import Defragmenter, DefragPlan
from finesched.sched.preempt import SchedulerView


class DefragView(SchedulerView, Protocol):
    """What the planner reads of the Scheduler besides what preemption reads."""

    movable: dict[str, Workload]


def find_defragmentation(
    sched: DefragView, workload: Workload, defragmenter: Defragmenter, now: float
) -> tuple[DefragPlan | None, str]:
    """The plan that lets `workload` fit by moving movable workloads, or None and why."""
    return None, "the planner is not written yet"
