"""Defragmentation: move running workloads that allow it so that a waiting one fits.

Fragmentation accumulates as workloads leave: a node ends with three cards each 30 % used and a
whole-GPU workload waits beside 2.1 idle GPUs. The defragmenter (a profile's `defragmentation`)
plans *moves* of running workloads that opted in (`spec.migration: {allowed: true}`) so that the
waiting workload fits, with the fewest moves and the lowest priorities first (`find_defragmentation`
in sched/defrag_plan.py). A plan is applied in one step on the state: each mover's target is
reserved (assumed) and its source released, then the waiting workload's binding is assumed. A
driver with a durable store then stops each mover's process and starts it on its target, and binds
the waiting workload (`Scheduler.confirm_defragmentation`, or `undo_defragmentation` on failure).

Driver contract (Scheduler methods, as for preemption in sched/preempt.py):

* `Scheduler.run` tries a plan for a single workload that fits nowhere, before preemption, when the
  profile enables the defragmenter; applied plans are handed out by `take_defragmentations()`. The
  movers' new bindings are not among `run`'s results: drivers read them from the plans.
* `Defragmenter` caps moves per minute (cluster and tenant) and keeps a cool-down per moved
  workload; the time is given (`Scheduler.clock`), so the simulator replays it on trace time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from finesched.model.binding import Binding
from finesched.sched.profile import Defragmentation
from finesched.state.cluster import StateError

if TYPE_CHECKING:
    from finesched.state.cluster import ClusterState

#: How far back the per-minute budgets look.
BUDGET_WINDOW_S = 60.0
#: Plans tried per `Scheduler.run` (a failed one costs milliseconds): a queue of thousands of
#: workloads that fit nowhere does not slow every decision behind it, and one tenant's flood does
#: not take the tries of the others (per tenant of the waiting workload).
TRIES_PER_RUN = 32
TRIES_PER_TENANT_PER_RUN = 8


@dataclass(frozen=True)
class Move:
    """One running workload moved: from `source` to `target` (its exact binding after the move)."""

    workload: str
    tenant: str
    priority: int
    source: Binding
    target: Binding
    #: Why it moved, for its events and `describe workload`.
    reason: str


@dataclass(frozen=True)
class DefragPlan:
    """The moves that let `workload` (waiting) fit, and its exact binding once they are made."""

    workload: str
    binding: Binding
    moves: tuple[Move, ...]
    #: Why the waiting workload needed them.
    reason: str

    @property
    def mover_keys(self) -> list[str]:
        return [m.workload for m in self.moves]


class Defragmenter:
    """The budget and the cool-down of the defragmenter (pure: every call is given the time)."""

    def __init__(self, config: Defragmentation):
        self.config = config
        #: (time, tenant) of each move made within the last minute, oldest first.
        self._recent: deque[tuple[float, str]] = deque()
        #: Workload key -> when it was last moved (entries older than the cool-down are dropped).
        self._moved_at: dict[str, float] = {}
        #: Waiting workload -> when its plan was recorded, so that a plan taken back is not charged.
        self._recorded: dict[str, float] = {}
        #: Plans tried in the current `Scheduler.run`, in all and per tenant of the waiting workload.
        self._tries = 0
        self._tenant_tries: dict[str, int] = {}

    def begin_run(self) -> None:
        """A new `Scheduler.run`: the tries per run start again."""
        self._tries = 0
        self._tenant_tries.clear()

    def may_try(self, tenant: str) -> bool:
        """Whether a plan may be tried now for a waiting workload of `tenant` (and count it)."""
        used = self._tenant_tries.get(tenant, 0)
        if self._tries >= TRIES_PER_RUN or used >= TRIES_PER_TENANT_PER_RUN:
            return False
        self._tries += 1
        self._tenant_tries[tenant] = used + 1
        return True

    def _expire(self, now: float) -> None:
        while self._recent and self._recent[0][0] <= now - BUDGET_WINDOW_S:
            self._recent.popleft()
        cooldown = self.config.cooldown_seconds
        if len(self._moved_at) > 4 * max(1, len(self._recent)) + 64:
            self._moved_at = {k: t for k, t in self._moved_at.items() if t > now - cooldown}

    def moves_left(self, now: float) -> int:
        """How many moves the cluster's per-minute budget still allows now."""
        self._expire(now)
        return max(0, self.config.max_moves_per_minute - len(self._recent))

    def tenant_moves_left(self, tenant: str, now: float) -> int:
        """How many moves of `tenant`'s workloads its per-minute budget still allows now."""
        self._expire(now)
        used = sum(1 for _, t in self._recent if t == tenant)
        return max(0, self.config.max_moves_per_tenant_per_minute - used)

    def refusal(self, key: str, now: float) -> str | None:
        """Why `key` may not be moved now (its cool-down), None when it may."""
        moved = self._moved_at.get(key)
        if moved is not None and now - moved < self.config.cooldown_seconds:
            return f"moved {now - moved:.0f}s ago (cool-down {self.config.cooldown_seconds:g}s)"
        return None

    def record(self, plan: DefragPlan, now: float) -> None:
        """Count a plan's moves against the budgets and start each mover's cool-down."""
        for move in plan.moves:
            self._recent.append((now, move.tenant))
            self._moved_at[move.workload] = now
        self._recorded[plan.workload] = now
        if len(self._recorded) > 4096:  # only the latest plans can still be taken back
            self._recorded = dict(list(self._recorded.items())[-1024:])

    def unrecord(self, plan: DefragPlan) -> None:
        """A plan taken back (its write failed or conflicted) costs no budget and no cool-down."""
        when = self._recorded.pop(plan.workload, None)
        if when is None:
            return
        for move in plan.moves:
            if (when, move.tenant) in self._recent:
                self._recent.remove((when, move.tenant))
            if self._moved_at.get(move.workload) == when:
                del self._moved_at[move.workload]


def apply_plan(state: ClusterState, plan: DefragPlan, commit: bool) -> None:
    """Release each mover's source, assume its target, then the waiting workload's binding.

    Raises StateError (and changes nothing) when a mover is no longer bound as planned or a
    binding does not fit any more."""
    missing = [m.workload for m in plan.moves if state.bindings.get(m.workload) != m.source]
    if missing:
        raise StateError(f"defragmentation for {plan.workload}: no longer bound as planned: {', '.join(missing)}")
    committed = {m.workload for m in plan.moves if state.is_committed(m.workload)}
    done: list[Move] = []
    try:
        for move in plan.moves:
            state.forget(move.workload)
            done.append(move)
            state.assume(move.target)
            if commit:
                state.commit(move.workload)
        state.assume(plan.binding)
    except StateError:
        _restore(state, done, committed)
        raise
    if commit:
        state.commit(plan.binding.workload)


def undo_plan(state: ClusterState, plan: DefragPlan, committed: set[str] | None = None) -> None:
    """Take an applied plan back: the waiting workload forgotten, every mover back on its source."""
    if plan.workload in state.bindings:
        state.forget(plan.workload)
    _restore(state, plan.moves, {m.workload for m in plan.moves} if committed is None else committed)


def _restore(state: ClusterState, moves: Sequence[Move], committed: set[str]) -> None:
    for move in reversed(moves):
        if state.bindings.get(move.workload) == move.target:
            state.forget(move.workload)
        if move.workload not in state.bindings:
            state.assume(move.source)
            if move.workload in committed:
                state.commit(move.workload)
