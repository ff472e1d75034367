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

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.defrag_chain import CHAIN_DEPTH, CHAIN_TRIALS, Room
from finesched.sched.defrag_movers import (
    Mover,
    MoveRules,
    Need,
    covers,
    keys_of,
    lacks_text,
    same_place,
)
from finesched.sched.diagnosis import FitError
from finesched.sched.preempt import INDEX_NAME, exact_binding
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import StateError

#: (mover, its target binding) in the order the moves are made.
Steps = list[tuple[Mover, Binding]]


def try_movers(
    sched: Any,
    cycle: CycleState,
    request: ScheduleRequest,
    node: int,
    skipped: set[str],
    movers: Sequence[Mover],
    *,
    need: Need | None = None,
    room: Room | None = None,
    rules: MoveRules | None = None,
    budget: int | None = None,
) -> tuple[Binding, Steps] | str:
    """The waiting workload's binding on `node` and the moves (in order) that make room for it by
    moving `movers` (and, with `room` and `rules`, the chains that make room for them, at most
    `budget` moves in all), or why not; the state is restored exactly (module docstring)."""
    state = sched.state
    index = state.extras.get(INDEX_NAME)
    version = state.capacity_version
    trial = _Trial(sched, room, rules, len(movers) if budget is None else budget)
    if index is not None:
        index.paused = True
    try:
        for m in movers:
            trial.forget(m)
        binding = exact_binding(sched, cycle, request, node, skipped)
        if binding is None:
            lacks = "; ".join(lacks_text(state, need, node)) if need is not None else ""
            name, keys = state.names[node], ", ".join(keys_of(movers))
            return f"{request.key} still lacks {lacks or 'room'} on {name} without {keys}"
        state.assume(binding)
        trial.added.append(binding.workload)
        for m in sorted(movers, key=lambda m: -m.size):
            if not trial.place_or_chain(m, CHAIN_DEPTH):
                return trial.stuck_text(m)
        sources = trial.sources
        _undo(state, trial.added, sources)
        trial.added, trial.sources = [], []
        steps = [(m, t) for m, t in trial.steps if not same_place(m.binding, t)]
        ordered = _order(state, binding, steps, trial.added)
        trial.sources = sources
        if ordered is None:
            return f"no order of the moves {', '.join(m.key for m, _ in steps)} keeps every step within capacity"
        return binding, ordered
    finally:
        _undo(state, trial.added, trial.sources)
        for key, workload in trial.touched.items():
            if workload is None:
                sched.movable.pop(key, None)
            else:
                sched.movable[key] = workload
        if index is not None:
            index.paused = False
        state.capacity_version = version


class _Trial:
    """What one exact trial changed on the state (to roll back), and the moves it found."""

    def __init__(self, sched: Any, room: Room | None, rules: MoveRules | None, budget: int):
        self.sched = sched
        self.state = sched.state
        self.room = room
        self.rules = rules
        self.added: list[str] = []  # keys assumed here, forgotten before the sources come back
        self.sources: list[tuple[Binding, bool]] = []
        self.steps: Steps = []  # each mover and its target, as placed
        self.movers: list[Mover] = []  # every mover of the plan so far
        self.touched: dict[str, Workload | None] = {}  # movable entries to put back
        self.left = budget  # moves still allowed
        self.tries = CHAIN_TRIALS
        self.stuck: dict[str, str] = {}

    def forget(self, m: Mover) -> None:
        state = self.state
        self.touched.setdefault(m.key, self.sched.movable.get(m.key))
        self.sources.append((state.bindings[m.key], state.is_committed(m.key)))
        state.forget(m.key)
        self.movers.append(m)
        self.left -= 1

    def place(self, m: Mover, allowed: npt.NDArray[np.bool_] | None = None) -> None:
        target = self.sched._place(m.workload, allowed)
        self.added.append(m.key)
        self.steps.append((m, target))

    def checkpoint(self) -> tuple[int, int, int, int, int]:
        return len(self.added), len(self.sources), len(self.steps), len(self.movers), self.left

    def rollback(self, cp: tuple[int, int, int, int, int]) -> None:
        added, sources, steps, movers, self.left = cp
        _undo(self.state, self.added[added:], self.sources[sources:])
        del self.added[added:], self.sources[sources:], self.steps[steps:], self.movers[movers:]

    def place_or_chain(self, m: Mover, depth: int) -> bool:
        """Place `m` (already forgotten) by the profile; failing that, make room for it by moving
        other movers (a chain, `depth` levels at most). On failure nothing of it stays assumed."""
        try:
            self.place(m)
            return True
        except (FitError, StateError) as exc:
            self.stuck.setdefault(m.key, str(exc))
        if depth <= 0 or self.left <= 0 or self.room is None or self.rules is None:
            return False
        state, room = self.state, self.room
        need = room.need(m)
        taken = {m.key for m in self.movers}
        for node, useful in room.options(need, taken, self.left):
            only = np.zeros(state.n, dtype=bool)
            only[node] = True
            for size in range(1, min(self.left, len(useful)) + 1):
                for subset in itertools.combinations(useful, size):
                    if self.tries <= 0:
                        return False
                    if not covers(state, need, node, subset) or self.rules.refusal([*self.movers, *subset]):
                        continue
                    self.tries -= 1
                    cp = self.checkpoint()
                    for c in subset:
                        self.forget(c)
                    try:
                        self.place(m, only)
                    except (FitError, StateError):
                        self.rollback(cp)
                        continue
                    if all(self.place_or_chain(c, depth - 1) for c in sorted(subset, key=lambda c: -c.size)):
                        return True
                    self.rollback(cp)
        return False

    def stuck_text(self, m: Mover) -> str:
        chained = " nor after moving others for it" if self.room is not None and self.left > 0 else ""
        return f"{m.key} fits on no other node{chained} ({self.stuck.get(m.key, 'no room')})"


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
