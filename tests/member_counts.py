"""Member counts for tests: what `Framework.run_count` says a node holds, and what placing copies
one by one with `Scheduler.schedule_one` actually gets (tests/test_member_count*.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.profile import Profile
from finesched.sched.request import compile_request
from finesched.sched.runtime import PreFilterFailed
from finesched.sched.scheduler import Scheduler

#: The CPU and NUMA plugins with DeviceShare: exclusive cpusets, SingleNUMANode, GPUs near them.
CPU_PROFILE = Profile.model_validate(
    {
        "name": "cpu",
        "plugins": [
            {"name": "ResourcesFit"},
            {"name": "NUMAAlign"},
            {"name": "CPUOrchestration"},
            {"name": "DeviceShare"},
        ],
    }
)


def counts(scheduler: Scheduler, workload: Workload) -> np.ndarray:
    """run_count over every node after pre_filter and filter, as the topology step calls it."""
    state, framework = scheduler.state, scheduler.framework
    request = compile_request(workload, state, framework.owns)
    cycle, nodes = CycleState(), NodeBatch(state)
    try:
        skipped = framework.run_pre_filter(cycle, request, nodes)
    except PreFilterFailed:
        return np.zeros(state.n, dtype=np.int64)
    feasible, _ = framework.run_filter(cycle, request, nodes, skipped)
    return framework.run_count(cycle, request, nodes, feasible, skipped)


def copy_of(data: Mapping[str, Any], k: int) -> Workload:
    return Workload.model_validate({**data, "name": f"{data.get('name', 'm')}-{k}"})


def placed_one_by_one(make: Callable[[], Scheduler], data: Mapping[str, Any], limit: int = 400) -> int:
    """How many copies of the workload `data` schedule_one places, one after another, on a fresh
    scheduler from `make`, until FitError (or `limit`)."""
    scheduler = make()
    for k in range(limit):
        try:
            scheduler.schedule_one(copy_of(data, k))
        except FitError:
            return k
    return limit
