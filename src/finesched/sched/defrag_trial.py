"""The exact test of one set of movers on one target node, on the live state, restored exactly.

With the movers' bindings forgotten, the waiting workload's binding on the node comes from the
profile's filters, reserve and pre_bind (as preemption's `Handle.try_without`). That binding is
then *assumed* (reserved: nothing else takes it) and each mover is placed again by the
Scheduler's own cycle (`_place`: the profile's filters and scores), biggest first; it may land on
the same node on another card (HAMi's intra-node case). Finally the order in which the moves can
be made one by one (release a source, take its target; the waiting workload last) is found by
trying them on the state (`ClusterState.assume` refuses what does not fit, devices included), so
no step of the plan over-allocates.

Whatever happens, the state is put back as it was: the same bindings (and commits), free
amounts, device grants, PreemptionIndex (paused: its start order must not change) and
`capacity_version`. Only the change log advances (the nodes touched are logged as changed, so
score memos re-check them; rewinding it would let a memo entry taken mid-trial look current).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from finesched.model.binding import Binding
from finesched.sched.cycle_state import CycleState
from finesched.sched.defrag_movers import INDEX_NAME, Mover, same_place
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import StateError

#: (mover, its target binding) in the order the moves are made.
Steps = list[tuple[Mover, Binding]]


def exact_binding(
    sched: Any, cycle: CycleState, request: ScheduleRequest, node: int, skipped: set[str]
) -> Binding | None:
    """The waiting workload's exact binding on `node` in the state as it is now (None: it does not fit)."""
    state, framework = sched.state, sched.framework
    trial = cycle.clone()
    if framework.node_local:
        mask, _ = framework.run_filter(trial, request, NodeBatch(state, index=np.array([node])), skipped)
        ok = bool(mask[0])
    else:
        mask, _ = framework.run_filter(trial, request, NodeBatch(state), skipped)
        ok = bool(mask[node])
    if not ok or not framework.run_reserve(trial, request, node).ok:
        return None
    binding = framework.run_pre_bind(trial, request, node, sched._binding(request, node, 0))
    framework.run_unreserve(trial, request, node)
    return binding


def try_movers(
    sched: Any, cycle: CycleState, request: ScheduleRequest, node: int, skipped: set[str], movers: Sequence[Mover]
) -> tuple[Binding, Steps] | None:
    """The waiting workload's binding on `node` and the moves (in order) that make room for it by
    moving `movers`, or None; the state is restored exactly (module docstring)."""
    state = sched.state
    index = state.extras.get(INDEX_NAME)
    version = state.capacity_version
    movable = {m.key: sched.movable.get(m.key) for m in movers}
    sources = [(state.bindings[m.key], state.is_committed(m.key)) for m in movers]
    added: list[str] = []  # keys assumed here, forgotten before the sources come back
    if index is not None:
        index.paused = True
    try:
        for m in movers:
            state.forget(m.key)
        binding = exact_binding(sched, cycle, request, node, skipped)
        if binding is None:
            return None
        state.assume(binding)
        added.append(binding.workload)
        targets: list[tuple[Mover, Binding]] = []
        for m in sorted(movers, key=lambda m: -m.size):
            try:
                target = sched._place(m.workload)
            except (FitError, StateError):
                return None
            added.append(m.key)
            targets.append((m, target))
        _undo(state, added, sources)
        added = []
        steps = [(m, t) for m, t in targets if not same_place(m.binding, t)]
        ordered = _order(state, binding, steps, added)
        if ordered is None:
            return None
        return binding, ordered
    finally:
        _undo(state, added, sources)
        for key, workload in movable.items():
            if workload is None:
                sched.movable.pop(key, None)
            else:
                sched.movable[key] = workload
        if index is not None:
            index.paused = False
        state.capacity_version = version


def _order(state: Any, binding: Binding, steps: Steps, added: list[str]) -> Steps | None:
    """Make the moves one by one on the state, each as soon as its target fits, then the waiting
    workload's binding; the order found (None: no order fits). Keys assumed go into `added`."""
    pending = list(steps)
    done: Steps = []
    while pending:
        for i, (m, target) in enumerate(pending):
            state.forget(m.key)
            try:
                state.assume(target)
            except StateError:
                state.assume(m.binding)  # back where it was (it held exactly this a moment ago)
                continue
            added.append(m.key)
            done.append(pending.pop(i))
            break
        else:
            return None
    try:
        state.assume(binding)
    except StateError:
        return None
    added.append(binding.workload)
    return done


def _undo(state: Any, added: list[str], sources: Sequence[tuple[Binding, bool]]) -> None:
    """Forget what the trial assumed, then put every source binding back (with its commit)."""
    for key in reversed(added):
        if key in state.bindings:
            state.forget(key)
    for source, committed in sources:
        if source.workload not in state.bindings:
            state.assume(source)
        if committed:
            state.commit(source.workload)
