"""What a flood of work that fits nowhere leaves behind once it is deleted: nothing that outlives it.

Counts and table sizes, not RSS (tests/server/test_server_flood_memory.py has the server's side;
BENCHMARKS.md the process's memory). The collector is paused where the point is that reference
counting alone frees the flood: a reference cycle waits for a full collection, and the memory of
everything it holds with it.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from builders import make_node, make_workload
from finesched import ClusterState, Scheduler
from finesched.model.manifest import parse_manifest
from finesched.sched.queue import SchedulingQueue

FLOOD = 300


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def flooded_scheduler(profile: str = "default") -> tuple[Scheduler, list[str]]:
    """A one-node cluster with FLOOD workloads queued that ask for more CPU than it has, all tried and parked."""
    state = ClusterState.from_nodes([make_node("n1").cpu("4").memory("8Gi").obj()])
    scheduler = Scheduler(state, profile, auto_commit=False)
    flood = [make_workload(f"w{i}", "team-a").req(cpu="1000").obj() for i in range(FLOOD)]
    scheduler.submit(flood)
    assert scheduler.run(report_waiting=False, flush_backoff=False) == []
    return scheduler, [w.key for w in flood]


def test_a_parked_units_error_keeps_no_frames() -> None:
    scheduler, _ = flooded_scheduler()
    waiting = scheduler.queue.waiting()
    assert len(waiting) == FLOOD and {why for _, why in waiting} == {"unschedulable"}
    for unit, _ in waiting:
        error = unit.last_error
        assert error is not None and "insufficient cpu" in error.message  # what it says is kept
        assert error.__traceback__ is None and error.__context__ is None and error.__cause__ is None


def test_a_deleted_flood_is_freed_by_reference_counting_alone() -> None:
    for profile in ("default", "binpack"):
        scheduler, keys = flooded_scheduler(profile)
        units = [weakref.ref(unit) for unit, _ in scheduler.queue.waiting()]
        assert len(units) == FLOOD
        with collector_paused():
            assert scheduler.queue.forget(keys) == FLOOD
            alive = [ref for ref in units if ref() is not None]
        assert alive == [], f"{profile}: {len(alive)} parked units outlive their deletion (a reference cycle)"
        assert len(scheduler.queue) == 0


def test_the_queue_forgets_into_a_table_of_its_remaining_size() -> None:
    queue = SchedulingQueue()
    flood = [make_workload(f"w{i}", "team-a").req(cpu="1").obj() for i in range(5000)]
    kept = [make_workload(f"k{i}", "team-b").req(cpu="1").obj() for i in range(10)]
    for workload in [*flood, *kept]:
        queue.push(workload)
    full = sys.getsizeof(queue._keys)
    assert queue.forget(w.key for w in flood) == len(flood)
    assert len(queue) == len(kept) and all(queue.holds(w.key) for w in kept)
    assert sys.getsizeof(queue._keys) <= sys.getsizeof({w.key for w in kept}) < full / 100


def test_manifest_values_are_not_kept_in_the_parsers_string_cache() -> None:
    def doc() -> dict[str, object]:
        metadata = {"name": "flood-7", "namespace": "team-a", "labels": {"app": "a-value-seen-once"}}
        return {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload", "metadata": metadata,
                "spec": {"requests": {"cpu": "1"}}}  # fmt: skip

    first, second = parse_manifest(doc()), parse_manifest(doc())
    assert first == second
    # Equal values parsed twice are two strings: pydantic-core's process-wide cache did not keep them.
    assert first.name is not second.name and first.labels["app"] is not second.labels["app"]
