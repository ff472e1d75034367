"""A tenant's flood of work that fits nowhere does not hold every other tenant's work behind it."""

from __future__ import annotations

from finesched.model.tenant import Tenant
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.queue import FAILING_AFTER, SchedulingQueue


def workload(name: str, tenant: str) -> Workload:
    return Workload.model_validate({"name": name, "namespace": tenant, "tenant": tenant, "requests": {"cpu": 1}})


def test_a_failing_flood_goes_after_work_that_fits() -> None:
    queue = SchedulingQueue([Tenant(name="a"), Tenant(name="b")], capacity=lambda: {"cpu": 100})
    queue.charge("b", {"cpu": 10})  # b holds something, a nothing: plain DRF would always pick a first
    for i in range(100):
        queue.push(workload(f"a{i}", "a"))
    queue.push(workload("b0", "b"))
    popped = []
    while True:
        unit = queue.pop()
        assert unit is not None
        popped.append(unit.tenant)
        if unit.tenant == "b":
            queue.done(unit)
            break
        queue.park(unit, FitError(unit.workloads[0].key, 1, {"no node has that much": 1}))
    assert popped == ["a"] * FAILING_AFTER + ["b"]
    queue.push(workload("b1", "b"))
    assert queue.pop().tenant == "b"  # still failing: b's work first
    next_a = queue.pop()
    assert next_a is not None and next_a.tenant == "a"  # and a goes on when b has nothing ready
    queue.done(next_a)  # one of a's units fitted: a is back in the plain DRF order
    queue.push(workload("b2", "b"))
    assert queue.pop().tenant == "a"
