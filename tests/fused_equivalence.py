"""What the fused-path equivalence tests compare: the decisions of a fused and a generic scheduler.

tests/test_fused_scalar.py and tests/test_fused_devices_path.py replay the same stream through
`Scheduler(...)` and `Scheduler(..., fused=False)` and hold every decision (node, score, devices,
annotations, or the FitError's words) and the final free amounts equal.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from finesched import FitError, Scheduler
from finesched.model.workload import Workload


def decision(scheduler: Scheduler, workload: Workload) -> tuple[Any, ...]:
    """Everything a caller sees of one decision."""
    try:
        binding = scheduler.schedule_one(workload)
    except FitError as exc:
        return ("unschedulable", exc.message, dict(exc.reasons), exc.unresolvable)
    return (binding.node, binding.score, binding.devices, dict(binding.annotations))


def assert_decide_alike(
    fused: Scheduler, generic: Scheduler, workloads: Iterable[Workload], release_every: int
) -> None:
    """Both schedulers decide every workload alike; every `release_every`-th decision one binding is
    given back on both (scores move the other way on that node); the free amounts end equal."""
    for i, workload in enumerate(workloads):
        assert decision(fused, workload) == decision(generic, workload), f"decision {i}"
        if i % release_every == release_every - 1:
            key = next(iter(fused.state.bindings), None)
            if key is not None:
                assert fused.release(key).node == generic.release(key).node
    np.testing.assert_array_equal(fused.state.free, generic.state.free)
