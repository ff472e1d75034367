"""NodeUnschedulable: a node labelled unschedulable takes no new work; bound work stays."""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched.plugins.node_unschedulable import UNSCHEDULABLE_LABEL, UNSCHEDULABLE_REASON
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


def test_marked_node_is_skipped_and_reason_counted() -> None:
    state = ClusterState.from_nodes(
        [
            make_node("a").cpu("8").memory("8Gi").label(UNSCHEDULABLE_LABEL, "cordoned").obj(),
            make_node("b").cpu("2").memory("8Gi").obj(),
        ]
    )
    sched = Scheduler(state)
    # "a" has more room (least-requested would pick it) but is marked: "b" gets the work.
    assert sched.schedule_one(make_workload("w1").req(cpu="1").obj()).node == "b"
    with pytest.raises(FitError) as exc:
        sched.schedule_one(make_workload("w2").req(cpu="2").obj())
    assert exc.value.reasons[UNSCHEDULABLE_REASON] == 1


def test_unmarking_makes_the_node_schedulable_again() -> None:
    marked = make_node("a").cpu("8").memory("8Gi").label(UNSCHEDULABLE_LABEL, "not-ready").obj()
    state = ClusterState.from_nodes([marked])
    sched = Scheduler(state)
    with pytest.raises(FitError):
        sched.schedule_one(make_workload("w1").req(cpu="1").obj())
    state.update_node(make_node("a").cpu("8").memory("8Gi").obj())
    assert sched.schedule_one(make_workload("w1").req(cpu="1").obj()).node == "a"
