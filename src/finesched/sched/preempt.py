"""How the Scheduler asks its post_filter plugin for a preemption and applies the answer.

Driver-facing contract (Scheduler methods, see sched/scheduler.py):

* `Scheduler.find_preemption(workload) -> (Preemption | None, why)` decides and changes nothing;
* `Scheduler.apply_preemption(p)` evicts `p.victims` from the state (`ClusterState.forget`) and
  assumes `p.binding`, the preemptor's exact binding on `p.node`, in one step. The freed capacity
  is therefore held for the preemptor at once: it is *nominated* to `p.node`
  (`Scheduler.nominated[preemptor] == node`) while its binding is assumed but not committed. With
  `auto_commit` the binding is committed at once and nothing stays nominated;
* a driver with a durable store (auto_commit False) makes the evictions durable and tells the
  victims' agents to stop, then writes the preemptor's binding and calls
  `Scheduler.confirm_preemption(preemptor)` (commit; the nomination ends). If a write fails it
  calls `Scheduler.undo_preemption(p)`: the preemptor's binding is forgotten and the victims are
  assumed (and committed) again, exactly as before.
* only committed bindings are victims: a binding still in flight (assumed, not yet committed by
  its driver, e.g. decided earlier in the same batch) is never evicted under it;
* victims are not queued again by the core: a driver that wants them retried submits them;
* `Scheduler.run` does all this itself for queued work: a unit that fits nowhere preempts (a gang
  only when every member can be placed, else nothing is evicted), and every decision is kept in
  `Scheduler.preemptions` (`take_preemptions()` returns and clears them) so a driver sees which
  bindings of the run's results need evictions made durable first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError, gang_fit_error, unresolvable_nodes
from finesched.sched.elastic import ReclaimRule
from finesched.sched.framework import BoolArray, NodeBatch, Preemption
from finesched.sched.memo import request_shape
from finesched.sched.queue import demand_of
from finesched.sched.request import ScheduleRequest
from finesched.sched.runtime import PreFilterFailed
from finesched.state.cluster import StateError

if TYPE_CHECKING:
    from finesched.sched.queue import SchedulingQueue
    from finesched.sched.request import RequestCompiler
    from finesched.sched.runtime import Framework
    from finesched.sched.topology import TopologyPlacer
    from finesched.state.cluster import ClusterState


class SchedulerView(Protocol):
    """What preemption reads and changes of the Scheduler (sched/scheduler.py), which calls these
    steps with itself: this module depends on that much, not on the Scheduler class."""

    state: ClusterState
    framework: Framework
    queue: SchedulingQueue
    auto_commit: bool
    #: Whether preemption may run at all (`Scheduler(preemption=False)`).
    preemption: bool
    preemptions: list[Preemption]
    preemption_misses: dict[str, str]
    _compiler: RequestCompiler
    _nominated: dict[str, str]
    _victims_committed: dict[str, set[str]]

    @property
    def topology(self) -> TopologyPlacer: ...

    def schedule_one(self, workload: Workload) -> Binding: ...

    def schedule_gang(self, workloads: Sequence[Workload]) -> list[Binding]: ...

    def _place(self, workload: Workload, allowed: npt.NDArray[np.bool_] | None = None) -> Binding: ...

    def _binding(self, request: ScheduleRequest, node: int, score: int) -> Binding: ...


INDEX_NAME = "PreemptionIndex"


class Handle:
    """The scheduler's side of a post_filter call (framework.PreemptionHandle)."""

    def __init__(self, scheduler: SchedulerView, skipped: set[str], allowed: npt.NDArray[np.bool_] | None = None):
        self.scheduler = scheduler
        self.skipped = skipped
        #: [n] the only nodes the preemptor may go to (a topology gang's domain), None: any node.
        #: The post_filter plugin skips the others before asking anything about them.
        self.allowed = allowed
        self._everywhere: npt.NDArray[np.bool_] | None = None  # unresolvable over all nodes, when computed

    def unresolvable(self, cycle: CycleState, request: ScheduleRequest, nodes: npt.NDArray[np.intp]) -> BoolArray:
        """Per node of `nodes`: no eviction can make the workload fit there (diagnosis.unresolvable_nodes).

        Node-local filters are asked about `nodes` only; otherwise all nodes are filtered once
        per decision and the answer is read from that.
        """
        framework, state = self.scheduler.framework, self.scheduler.state
        if framework.node_local:
            trial = cycle.clone()
            _, results = framework.run_filter(trial, request, NodeBatch(state, index=nodes), self.skipped)
            return unresolvable_nodes(results, len(nodes))
        if self._everywhere is None:
            _, results = framework.run_filter(cycle.clone(), request, NodeBatch(state), self.skipped)
            self._everywhere = unresolvable_nodes(results, state.n)
        return self._everywhere[nodes]

    def reclaim_rule(self, workload: Workload) -> ReclaimRule | None:
        return self.scheduler.queue.reclaim_rule(workload.tenant, demand_of(workload))

    def try_without(
        self, cycle: CycleState, request: ScheduleRequest, node: int, victims: Iterable[str]
    ) -> Binding | None:
        sched = self.scheduler
        state = sched.state
        index = state.extras.get(INDEX_NAME)
        version = state.capacity_version
        saved: list[tuple[Binding, bool]] = []
        if index is not None:
            index.paused = True  # type: ignore[attr-defined]
        try:
            for key in victims:
                committed = state.is_committed(key)
                saved.append((state.forget(key), committed))
            return exact_binding(sched, cycle, request, node, self.skipped)
        finally:
            for binding, committed in saved:
                state.assume(binding)
                if committed:
                    state.commit(binding.workload)
            if index is not None:
                index.paused = False  # type: ignore[attr-defined]
            state.capacity_version = version  # the state is exactly as it was


def exact_binding(
    sched: SchedulerView, cycle: CycleState, request: ScheduleRequest, node: int, skipped: set[str]
) -> Binding | None:
    """The workload's exact binding on `node` in the state as it is now, or None when it does not fit
    there: the profile's filters on that node, then reserve and pre_bind (undone: nothing is held)."""
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


def prepare(sched: SchedulerView, workload: Workload) -> tuple[ScheduleRequest, CycleState, set[str]] | str:
    """A workload's compiled request, its cycle state after pre_filter and the plugins pre_filter
    skipped, for a decision about it that changes nothing (preemption's, the defragmenter's); or
    why pre_filter rejects it."""
    request = sched._compiler.compile(workload, request_shape(workload))
    cycle = CycleState()
    try:
        skipped = sched.framework.run_pre_filter(cycle, request, NodeBatch(sched.state))
    except PreFilterFailed as exc:
        return f"{exc.status.message()} ({exc.status.plugin})"
    return request, cycle, skipped


def find_preemption(
    sched: SchedulerView, workload: Workload, allowed: npt.NDArray[np.bool_] | None = None
) -> tuple[Preemption | None, str]:
    """The post_filter plugin's decision for `workload` (no state change); see the module docstring.
    `allowed`: evict only on (and place only on) those nodes (a topology gang's domain)."""
    plugin = sched.framework.points.post_filter
    if plugin is None or not sched.preemption:
        return None, "preemption is off"
    state = sched.state
    if workload.key in state.bindings or state.n == 0:
        return None, "already bound" if state.n else "no nodes"
    prepared = prepare(sched, workload)
    if isinstance(prepared, str):
        return None, prepared
    request, cycle, skipped = prepared
    p, why = plugin.post_filter(cycle, request, Handle(sched, skipped, allowed))
    if p is not None and allowed is not None and not allowed[state.index[p.node]]:
        return None, "the preemption found lies outside the gang's topology domain"
    return p, why


def apply_preemption(sched: SchedulerView, p: Preemption) -> Binding:
    """Evict the victims and assume the preemptor's binding (module docstring); StateError changes nothing."""
    state = sched.state
    missing = [v.workload for v in p.victims if state.bindings.get(v.workload) != v]
    if missing:
        raise StateError(f"preemption for {p.preemptor}: victims no longer bound as decided: {', '.join(missing)}")
    committed = {v.workload for v in p.victims if state.is_committed(v.workload)}
    for victim in p.victims:
        state.forget(victim.workload)
    try:
        state.assume(p.binding)
    except StateError:
        _readmit(sched, p.victims, committed)
        raise
    sched._victims_committed[p.preemptor] = committed
    if sched.auto_commit:
        state.commit(p.binding.workload)
    else:
        sched._nominated[p.preemptor] = p.node
    sched.preemptions.append(p)
    return p.binding


def undo_preemption(sched: SchedulerView, p: Preemption) -> None:
    """Forget the preemptor's binding and re-admit its victims as they were."""
    state = sched.state
    if p.preemptor in state.bindings:
        state.forget(p.preemptor)
    committed = sched._victims_committed.pop(p.preemptor, {v.workload for v in p.victims})
    _readmit(sched, p.victims, committed)
    sched._nominated.pop(p.preemptor, None)
    if p in sched.preemptions:
        sched.preemptions.remove(p)


def _readmit(sched: SchedulerView, victims: Sequence[Binding], committed: set[str]) -> None:
    for victim in victims:
        sched.state.assume(victim)
        if victim.workload in committed:
            sched.state.commit(victim.workload)


def place_or_preempt(
    sched: SchedulerView, workload: Workload, allowed: npt.NDArray[np.bool_] | None = None
) -> tuple[Binding, Preemption | None]:
    """Schedule `workload`; when it fits nowhere, preempt for it (raises the FitError when that fails too).
    `allowed`: place and evict only on those nodes (a topology gang's domain)."""
    try:
        return (sched.schedule_one(workload) if allowed is None else sched._place(workload, allowed)), None
    except FitError as exc:
        if exc.unresolvable:  # evicting others cannot help (kube-scheduler skips these too)
            raise
        p, why = find_preemption(sched, workload, allowed)
        if p is None:
            sched.preemption_misses[workload.key] = why
            raise
        return apply_preemption(sched, p), p


def place_gang_or_preempt(sched: SchedulerView, workloads: Sequence[Workload]) -> list[Binding]:
    """All members placed (preempting where needed) or none, and then nothing evicted either.

    A topology gang (`gang.topology`) is first placed without evicting anything; when no domain
    takes it so, its domains are tried in the topology policy's order (sched/topology.py), each
    member placed or preempting for it only on that domain's nodes: every victim is in one domain.
    """
    gang = workloads[0].gang if workloads else None
    if gang is not None and gang.topology is not None:
        return _place_topology_gang_or_preempt(sched, workloads)
    steps: list[tuple[Binding, Preemption | None]] = []
    try:
        for workload in workloads:
            steps.append(place_or_preempt(sched, workload))
    except (FitError, ValidationError) as exc:
        for binding, p in reversed(steps):
            if p is None:
                sched.state.forget(binding.workload)
            else:
                undo_preemption(sched, p)
        if isinstance(exc, ValidationError):
            raise
        name = workloads[0].gang.name if workloads[0].gang else "gang"
        raise gang_fit_error(name, exc, "none placed, none evicted") from None
    if len(steps) > 1:
        sched.topology.history.append(len(steps))
    return [binding for binding, _ in steps]


def _place_topology_gang_or_preempt(sched: SchedulerView, workloads: Sequence[Workload]) -> list[Binding]:
    """`place_gang_or_preempt` for a topology gang: without evictions, else in one domain with them."""
    try:
        return sched.schedule_gang(workloads)
    except FitError as exc:
        if exc.unresolvable:
            raise
        first = exc

    def place(workload: Workload, allowed: npt.NDArray[np.bool_]) -> object:
        return place_or_preempt(sched, workload, allowed)

    def undo(step: object) -> None:
        binding, p = step  # type: ignore[misc]
        if p is None:
            sched.state.forget(binding.workload)
        else:
            undo_preemption(sched, p)

    try:
        steps = sched.topology.place(workloads, place, undo, evicting=True)
    except FitError as exc:
        sched.preemption_misses[workloads[0].key] = exc.message
        raise first from None
    return [binding for binding, _ in steps]  # type: ignore[misc]
