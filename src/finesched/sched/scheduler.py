"""The Scheduler: one core that every driver (CLI, API server, Kubernetes extender, simulator) uses.

`schedule_one` is the cycle of DESIGN.md, in numbered steps (the shape of kube-scheduler's
schedule_one.go):

1. compile the workload into a compact request (once);
2. pre_filter: per-workload checks and precomputation;
3. filter: one vectorized pass per plugin over all nodes; none left -> FitError with reasons;
4. pre_score + score: weighted sum of vectorized scores over all nodes;
5. select: nodes best-first (or a select plugin's order); reserve decides the exact allocation
   on the first node where it succeeds (unreserve in reverse on failure, then the next node);
6. pre_bind completes the binding; `ClusterState.assume` applies it; commit unless the driver
   commits later (after its durable write).

The core never does I/O.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from finesched.cpuset import CPUSet
from finesched.errors import ValidationError
from finesched.model.base import fast_construct
from finesched.model.binding import Binding
from finesched.model.tenant import Tenant
from finesched.model.topology import Topology
from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.defrag import Defragmenter, DefragPlan, apply_plan, undo_plan
from finesched.sched.defrag_plan import find_defragmentation
from finesched.sched.diagnosis import FitError, InvalidRequest, QuotaWait, diagnose, gang_fit_error
from finesched.sched.framework import Code, NodeBatch, Preemption, ScoreArray
from finesched.sched.memo import RECOUNT_NODES, MemoEntry, ScoreMemo, request_shape
from finesched.sched.preempt import (
    apply_preemption,
    find_preemption,
    place_gang_or_preempt,
    place_or_preempt,
    undo_preemption,
)
from finesched.sched.profile import Profile, resolve_profile
from finesched.sched.queue import QueuedUnit, SchedulingQueue
from finesched.sched.registry import Registry, default_registry
from finesched.sched.request import RequestCompiler, ScheduleRequest
from finesched.sched.runtime import Framework, PreFilterFailed
from finesched.sched.tenant_usage import TenantUsage, binding_amounts
from finesched.sched.topology import OUTSIDE_DOMAIN, TopologyPlacer
from finesched.state.cluster import ClusterState, StateError

__all__ = ["CARRIED_ANNOTATIONS", "Result", "Scheduler", "binding_amounts"]

Result = Binding | FitError
EMPTY_CPUSET = CPUSet()
#: Workload annotations its binding carries unchanged to the node agent: facts the agent applies
#: that no plugin decides (a dataflow slot's managed-memory quotas per operator, seed S2.4).
CARRIED_ANNOTATIONS = ("finesched.io/managed-memory-quotas",)


class Scheduler:
    """Places workloads on a ClusterState with the plugins of one profile."""

    def __init__(
        self,
        state: ClusterState,
        profile: str | Profile | dict[str, object] = "default",
        tenants: Iterable[Tenant] = (),
        *,
        registry: Registry | None = None,
        auto_commit: bool = True,
        memoize: bool = True,
        preemption: bool = True,
        topologies: Iterable[Topology] = (),
        fused: bool = True,
    ):
        """`preemption=False` turns the profile's post_filter (DefaultPreemption) off: `run` then
        never evicts anything (`finesched plan --no-preemption`). `topologies`: the network trees
        gangs may name (`gang.topology`; model/topology.py)."""
        self.state = state
        self.profile = resolve_profile(profile)
        self.framework = Framework(self.profile, registry or default_registry(), state)
        self.auto_commit = auto_commit
        #: Reuse filter/score results per request shape where the profile allows (sched/memo.py).
        self.memoize = memoize
        #: What each tenant holds, kept by the state on every assume/forget (so DRF and quotas
        #: stay right after forced node removals, restores and bindings made by other drivers).
        self.usage = state.attach(TenantUsage())
        self.queue = SchedulingQueue(tenants, capacity=state.totals, usage=self.usage.of)
        self.memo = ScoreMemo()
        self._compiler = RequestCompiler(state, self.framework.owns)
        #: Filter and score of scalar requests in a few numpy calls (sched/fused.py); None: the
        #: profile needs the generic plugin path (`fused=False` forces it, for the equivalence tests).
        self._fused = self.framework.fused(state) if fused else None
        self._tie_rank: npt.NDArray[np.int64] | None = None
        self._tie_version = -1
        #: The state's capacity version when `run` last looked: a change made between runs (added or
        #: updated nodes, releases through the state) wakes the workloads parked as unschedulable.
        self._capacity_seen = state.capacity_version
        #: Whether `run` may preempt (needs a post_filter plugin in the profile; sched/preempt.py).
        self.preemption = preemption
        #: Preemptions applied, in order (`take_preemptions` hands them to a driver and clears them).
        self.preemptions: list[Preemption] = []
        self._nominated: dict[str, str] = {}
        #: Why preemption found nothing for a workload that fits nowhere (its latest attempt).
        self.preemption_misses: dict[str, str] = {}
        self._victims_committed: dict[str, set[str]] = {}
        #: The Topology objects gangs may name, by name (`set_topologies` replaces them).
        self.topologies: dict[str, Topology] = {t.name: t for t in topologies}
        #: Domain choice and placement of topology gangs (domain indexes, gang size history).
        self.topology = TopologyPlacer(self)
        #: Bound workloads that allow the defragmenter to move them (`spec.migration`), by key;
        #: entries whose key is no longer bound are ignored (sched/defrag.py).
        self.movable: dict[str, Workload] = {}
        #: The profile's defragmenter (budget, cool-down); None: `run` never moves anything.
        config = self.profile.defragmentation
        self.defragmenter = Defragmenter(config) if config is not None else None
        #: The time the defragmenter's budget and cool-down follow (the simulator sets trace time).
        self.clock: Callable[[], float] = time.time
        #: Defragmentation plans applied by `run`, in order (`take_defragmentations` hands them out).
        self.defragmentations: list[DefragPlan] = []
        self._movers_committed: dict[str, set[str]] = {}

    def set_topologies(self, topologies: Iterable[Topology]) -> None:
        """Replace the known topologies; parked work is tried again (a gang may fit a new tree)."""
        self.topologies = {t.name: t for t in topologies}
        self.topology.indexes.keep(self.topologies.values())
        self.queue.cluster_changed()

    # One workload -----------------------------------------------------------------------------------
    def schedule_one(self, workload: Workload) -> Binding:
        """Place `workload` and return its binding (applied to the state), or raise FitError."""
        return self._place(workload)

    def _prepare(self, workload: Workload) -> tuple[ScheduleRequest, CycleState, set[str], Hashable | None]:
        """Steps 1-2 of a cycle: the compiled request, its cycle state after pre_filter, the plugins
        pre_filter skipped, and the memo shape (None: not memoized). Raises FitError when the
        cluster has no nodes or pre_filter rejects the workload, ValidationError when it is bound."""
        state = self.state
        workload_key = workload.key
        if workload_key in state.bindings:
            raise ValidationError(f"already bound to {state.bindings[workload_key].node}", path=workload_key)
        if state.n == 0:
            raise FitError(workload_key, 0, {}, detail="0/0 nodes available: the cluster has no nodes")
        # 1. compile
        shape = request_shape(workload)
        request = self._compiler.compile(workload, shape)
        cycle = CycleState()
        # 2. pre_filter
        try:
            skipped = self.framework.run_pre_filter(cycle, request, NodeBatch(state))
        except PreFilterFailed as exc:
            raise _prefilter_error(workload_key, state.n, exc) from None
        return request, cycle, skipped, self.decision_shape(workload, shape) if self.memoize else None

    def decision_shape(self, workload: Workload, shape: Hashable | None = None) -> Hashable | None:
        """What this profile's filter and score verdicts on a node depend on besides the node: the
        request shape (`shape`, else computed), with the keys of plugins that add to it; None when a
        plugin reads more than the workload's shape and its node (`Framework.node_local` false).
        The memo keys its entries by it; the simulator's failure reuse too."""
        framework = self.framework
        if not framework.node_local:
            return None
        if shape is None:
            shape = request_shape(workload)
        if framework.shape_keys:
            keys = tuple(p.shape_key(workload) for p in framework.shape_keys)
            if any(k is not None for k in keys):
                return (shape, keys)
        return shape

    def _place(self, workload: Workload, allowed: npt.NDArray[np.bool_] | None = None) -> Binding:
        """Place `workload` (steps 1-6); with `allowed`, only on those nodes (a gang's topology
        domain): the mask is applied to the memoized results, never stored in the memo."""
        state = self.state
        workload_key = workload.key
        request, cycle, skipped, memo_shape = self._prepare(workload)
        # 3-4. filter and score every node (memoized per request shape where plugins allow)
        feasible, key = self._evaluate(cycle, request, skipped, memo_shape)
        outside = 0
        if allowed is not None:
            inside = feasible & allowed[: feasible.shape[0]]
            outside = int(feasible.sum()) - int(inside.sum())
            feasible, key = inside, np.where(inside, key, -1)
        # 5. select and reserve
        failures: Counter[str] | None = None
        for attempt, node in enumerate(self._candidates(cycle, request, feasible, key)):
            if attempt >= self.profile.max_reserve_attempts:
                break
            status = self.framework.run_reserve(cycle, request, node)
            if not status.ok:
                failures = failures if failures is not None else Counter()
                failures[f"{status.message()} ({status.plugin})"] += 1
                continue
            # 6. pre_bind and assume
            binding = self._binding(request, node, self._score_of(int(key[node])), workload_key)
            binding = self.framework.run_pre_bind(cycle, request, node, binding)
            try:
                state.assume(binding)
            except StateError as exc:
                self.framework.run_unreserve(cycle, request, node)
                failures = failures if failures is not None else Counter()
                failures[f"state refused the binding: {exc}"] += 1
                continue
            if self.auto_commit:
                state.commit(binding.workload)
            if workload.migration is not None and workload.migration.allowed:
                self.movable[workload_key] = workload
            elif self.movable:  # a workload of the same key that was movable before is gone
                self.movable.pop(workload_key, None)
            return binding
        _, results = self.framework.run_filter(cycle, request, NodeBatch(state), skipped)
        failures = failures or Counter()
        error = diagnose(workload_key, state.n, results, failures)
        if outside:
            error.reasons[OUTSIDE_DOMAIN] = outside
        untried = int(feasible.sum()) - sum(failures.values())
        if untried > 0:
            error.reasons[f"not tried (limit of {self.profile.max_reserve_attempts} reserve attempts)"] = untried
        raise error

    def _evaluate(
        self, cycle: CycleState, request: ScheduleRequest, skipped: set[str], shape: Hashable | None
    ) -> tuple[npt.NDArray[np.bool_], ScoreArray]:
        """Feasibility and selection key of every node; raise FitError when no node is feasible.

        The key is the weighted score total (with the seeded tie-break folded in when the
        profile asks for it), -1 on infeasible nodes; the highest key wins.
        """
        state = self.state
        fused = self._fused.path(request, skipped) if self._fused is not None else None
        if shape is not None:
            compiled = fused is not None and fused.patchable(request, skipped)
            # the change log as it is (repeats): the kernel counts exactly with them, numpy recounts
            raw = compiled or (fused is not None and state.n <= RECOUNT_NODES)
            entry, dirty = self.memo.lookup(shape, state, distinct=not raw)
            if entry is not None and dirty is not None:
                batch = NodeBatch(state, index=dirty)
                delta = None
                if compiled:
                    assert fused is not None
                    ranks = self._tie_ranks() if self.profile.tie_break == "random" else None
                    delta = fused.patch(cycle, request, batch, skipped, entry.feasible, entry.key, ranks)
                if delta is not None:
                    entry.patched(delta, state.change_position)
                elif fused is not None:
                    mask, total = fused.evaluate(cycle, request, batch, skipped)
                    key = self._key_of(total, batch, mask)
                    entry.patch(dirty, mask, key, state.change_position, repeats=raw)
                else:
                    mask, _ = self.framework.run_filter(cycle, request, batch, skipped)
                    entry.patch(dirty, mask, self._score_key(cycle, request, batch, mask), state.change_position)
                if entry.feasible_count:
                    return entry.feasible, entry.key
        nodes = NodeBatch(state)
        if fused is not None:
            feasible, total = fused.evaluate(cycle, request, nodes, skipped)
            if not feasible.any():  # the plugins word the diagnosis
                raise diagnose(
                    request.key,
                    state.n,
                    self.framework.run_filter(cycle, request, nodes, skipped)[1],
                    no_node_passed=True,
                )
            key = self._key_of(total, nodes, feasible)
        else:
            feasible, results = self.framework.run_filter(cycle, request, nodes, skipped)
            if not feasible.any():
                raise diagnose(request.key, state.n, results, no_node_passed=True)
            key = self._score_key(cycle, request, nodes, feasible)
        if shape is not None and self.memo.wants(shape):
            self.memo.store(shape, MemoEntry(state.change_position, state.nodes_version, feasible, key))
        return feasible, key

    def _score_key(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, feasible: npt.NDArray[np.bool_]
    ) -> ScoreArray:
        scored = nodes.with_mask(feasible)
        try:
            self.framework.run_pre_score(cycle, request, scored)
        except PreFilterFailed as exc:
            raise _prefilter_error(request.key, self.state.n, exc) from None
        if nodes.n == 0:
            return np.empty(0, dtype=np.int64)
        return self._key_of(self.framework.run_score(cycle, request, scored), nodes, feasible)

    def _key_of(self, total: ScoreArray, nodes: NodeBatch, feasible: npt.NDArray[np.bool_]) -> ScoreArray:
        """The selection key of a batch from its score totals: the seeded tie-break folded in
        when the profile asks for it, -1 on infeasible nodes."""
        if self.profile.tie_break == "random":
            n = self.state.n
            total = total * (n + 1) + (n - nodes.take(self._tie_ranks()))
        if total.shape[0] < 1024:  # a memo's few changed nodes: one call
            return np.where(feasible, total, -1)
        # np.where(feasible, total, -1), branch-free: np.where takes a branch per element, which
        # a mask of mixed verdicts mispredicts half the time (several times slower over many nodes).
        # `total` is this cycle's own array (run_score and the fused path return fresh ones).
        total += 1
        total *= feasible
        total -= 1
        return total

    def _score_of(self, key: int) -> int:
        return key // (self.state.n + 1) if self.profile.tie_break == "random" else key

    def _binding(self, request: ScheduleRequest, node: int, score: int, key: str | None = None) -> Binding:
        """A binding of the scalar amounts; pre_bind plugins add devices, cpuset and NUMA grants.
        `key`: the workload's key when the caller has it already (it is formatted on each read)."""
        w = request.workload
        annotations = w.annotations
        return fast_construct(
            Binding,
            {
                "workload": w.key if key is None else key,
                "node": self.state.names[node],
                "tenant": w.tenant,
                "priority": w.priority,
                "qos": w.qos or "LS",
                "requests": request.scalar,
                "cpuset": EMPTY_CPUSET,
                "cpu_exclusive_policy": "None",
                "numa": (),
                "devices": {},
                "annotations": {k: annotations[k] for k in CARRIED_ANNOTATIONS if k in annotations}
                if annotations
                else {},
                "score": score,
            },
        )

    def _candidates(
        self, cycle: CycleState, request: ScheduleRequest, feasible: npt.NDArray[np.bool_], key: ScoreArray
    ) -> Iterator[int]:
        """Feasible nodes best first (the select plugin's order when the profile has one)."""
        select = self.framework.select()
        if select is not None:
            yield from select.select(cycle, request, NodeBatch(self.state, feasible), key)
            return
        best = int(key.argmax())  # the first maximum: the lowest index among equals
        if key[best] < 0:
            return
        yield best
        key = key.copy()  # the key may be memoized: only the retry path pays for a copy
        while True:
            key[best] = -1
            best = int(key.argmax())
            if key[best] < 0:
                return
            yield best

    def _tie_ranks(self) -> npt.NDArray[np.int64]:
        """A seeded random rank per node (lower wins ties), fixed while the node set is unchanged."""
        if self._tie_rank is None or self._tie_version != self.state.nodes_version:
            rng = np.random.default_rng(self.profile.seed)
            order = rng.permutation(self.state.n)
            rank = np.empty(self.state.n, dtype=np.int64)
            rank[order] = np.arange(self.state.n)
            self._tie_rank, self._tie_version = rank, self.state.nodes_version
        return self._tie_rank

    # Many workloads -----------------------------------------------------------------------------------
    def schedule_batch(self, workloads: Sequence[Workload]) -> list[Result]:
        """Schedule each workload in the given order (no queue); a FitError in place of each failure.

        A workload that is already bound gets its existing binding (no new decision); one whose
        request is invalid gets an `InvalidRequest`, and the others are still scheduled.
        """
        results: list[Result] = []
        bindings = self.state.bindings
        for workload in workloads:
            existing = bindings.get(workload.key)
            if existing is not None:
                results.append(existing)
                continue
            try:
                results.append(self.schedule_one(workload))
            except FitError as exc:
                results.append(exc)
            except ValidationError as exc:
                results.append(InvalidRequest(workload.key, self.state.n, _problem_text(exc, workload.key)))
        return results

    def evaluate(self, workload: Workload) -> dict[str, int]:
        """Every feasible node's total score for `workload`, by node name, without placing it.

        What `schedule_one` ranks (before the seeded tie-break, if the profile has one), computed
        afresh over all nodes without the per-shape memo; raises FitError when no node is feasible
        and ValidationError for an invalid request. Used to explain a decision and in the tests.
        """
        state = self.state
        if state.n == 0:
            raise FitError(workload.key, 0, {}, detail="0/0 nodes available: the cluster has no nodes")
        request = self._compiler.compile(workload, request_shape(workload))
        cycle = CycleState()
        try:
            skipped = self.framework.run_pre_filter(cycle, request, NodeBatch(state))
        except PreFilterFailed as exc:
            raise _prefilter_error(workload.key, state.n, exc) from None
        feasible, key = self._evaluate(cycle, request, skipped, None)
        return {state.names[int(i)]: self._score_of(int(key[i])) for i in np.flatnonzero(feasible)}

    def schedule_gang(self, workloads: Sequence[Workload]) -> list[Binding]:
        """Place all of `workloads` or none of them (then raise the first member's FitError, or its
        ValidationError when a member's request is invalid).

        A gang with `gang.topology` goes inside one domain of its level (sched/topology.py): its
        bindings come in member index order (names, numbers compared as numbers)."""
        gang = workloads[0].gang if workloads else None
        if gang is not None and gang.topology is not None:
            steps = self.topology.place(workloads, self._place, self._forget_step)
            return [step for step in steps if isinstance(step, Binding)]
        placed: list[Binding] = []
        try:
            for workload in workloads:
                placed.append(self._place(workload))
        except (FitError, ValidationError) as exc:
            for binding in reversed(placed):
                self.state.forget(binding.workload)
            if isinstance(exc, ValidationError):  # an invalid member: none placed, the user's error
                raise
            name = workloads[0].gang.name if workloads[0].gang else "gang"
            raise gang_fit_error(name, exc, "none placed") from None
        self.topology.history.append(len(placed))
        return placed

    def _forget_step(self, step: object) -> None:
        """Undo one member placed by `_place` (a topology gang that did not fit all its domain)."""
        assert isinstance(step, Binding)
        self.state.forget(step.workload)

    def submit(self, workloads: Iterable[Workload]) -> None:
        """Queue workloads for `run` (priority, DRF between tenants, FIFO, quotas, gangs).

        Workloads already bound are skipped (there is nothing to decide). All or nothing: a workload
        that is already queued, or given twice, is refused before anything is queued.
        """
        pending = [w for w in workloads if w.key not in self.state.bindings]
        seen: set[str] = set()
        for workload in pending:
            if workload.key in seen or self.queue.holds(workload.key):
                raise ValidationError("is already queued", path=workload.key)
            seen.add(workload.key)
        for workload in pending:
            self.queue.push(workload)

    def run(self, limit: int | None = None, *, report_waiting: bool = True, flush_backoff: bool = True) -> list[Result]:
        """Schedule everything queued; results in decision order, then what still waits (as FitErrors).

        A long-running driver passes `limit` (at most that many queued units are decided, so it can
        make a batch durable before deciding more), `report_waiting=False` (no FitError per waiting
        workload on every call) and `flush_backoff=False` (backoff follows the wall clock)."""
        results: list[Result] = []
        seen_version = self.state.capacity_version
        if self.defragmenter is not None:
            self.defragmenter.begin_run()
        if seen_version != self._capacity_seen:
            self.queue.cluster_changed()  # capacity changed since the last run: parked work may fit now
        if flush_backoff:
            self.queue.flush_backoff()  # an offline run does not wait out wall-clock backoff
        decided = 0
        while limit is None or decided < limit:
            decided += 1
            unit = self.queue.pop()
            if unit is None:
                if self.state.capacity_version == seen_version:
                    break
                seen_version = self.state.capacity_version
                self.queue.cluster_changed()
                if flush_backoff:
                    self.queue.flush_backoff()
                continue
            placed, parked = self._run_unit(unit)
            results += placed
            if parked:
                # A gang's rollback freed what it had just taken, which the state counts as a capacity
                # change; it must not wake the gang (or any parked unit) again, or `run` never ends.
                seen_version = self.state.capacity_version
        self._capacity_seen = self.state.capacity_version
        if not report_waiting:
            return results
        for unit, why in self.queue.waiting():
            results += [self._waiting_error(unit, why, w) for w in unit.workloads]
        return results

    def _run_unit(self, unit: QueuedUnit) -> tuple[list[Result], bool]:
        """Schedule one queued unit (preempting when it fits nowhere and the profile has a
        post_filter): its results, and whether it was parked as unschedulable."""
        preempt = self.preemption and self.framework.points.post_filter is not None
        try:
            if len(unit.workloads) == 1:
                workload = unit.workloads[0]
                bindings = [self._place_defragmenting(workload, preempt)]
            else:
                gang = unit.workloads
                bindings = place_gang_or_preempt(self, gang) if preempt else self.schedule_gang(gang)
        except FitError as exc:
            self.queue.park(unit, exc)
            return [], True
        except ValidationError as exc:  # an invalid request: reported, dropped from the queue, not retried
            self.queue.done(unit)
            return [InvalidRequest(w.key, self.state.n, _problem_text(exc, w.key)) for w in unit.workloads], False
        self.queue.done(unit)
        return list(bindings), False

    def _place_defragmenting(self, workload: Workload, preempt: bool) -> Binding:
        """Place one queued workload; when it fits nowhere, move movable workloads for it (with a
        defragmenter), else preempt (with a post_filter), else raise the FitError."""
        if self.defragmenter is None:
            return place_or_preempt(self, workload)[0] if preempt else self.schedule_one(workload)
        try:
            return self.schedule_one(workload)
        except FitError as exc:
            if exc.unresolvable:
                raise
            if not self.defragmenter.may_try(workload.tenant):
                if not preempt:
                    raise
                return place_or_preempt(self, workload)[0]
            plan, _ = self.find_defragmentation(workload)
            if plan is not None:
                return self.apply_defragmentation(plan)
            if not preempt:
                raise
        return place_or_preempt(self, workload)[0]

    def _waiting_error(self, unit: QueuedUnit, why: str, workload: Workload) -> FitError:
        if why == "unschedulable" and unit.last_error is not None:
            return (
                unit.last_error
                if len(unit.workloads) == 1
                else FitError(workload.key, self.state.n, unit.last_error.reasons, detail=unit.last_error.message)
            )
        if why == "quota":
            problem = self.queue.quota_problem(unit.tenant, unit.demand)
            return QuotaWait(workload.key, self.state.n, {}, detail=f"waiting: {problem}")
        if why == "queued":  # a run with a limit left it in its tenant's line
            return FitError(workload.key, self.state.n, {}, detail=self.queue.unit_reason(unit))
        gang = workload.gang
        have = len(unit.workloads)
        detail = f"waiting: gang {gang.name if gang else '?'} has {have}/{gang.min_member if gang else '?'} members"
        return FitError(workload.key, self.state.n, {}, detail=detail)

    # Preemption (sched/preempt.py has the driver contract) ------------------------------------------
    def find_preemption(self, workload: Workload) -> tuple[Preemption | None, str]:
        """The preemption that would let `workload` fit (victims, node, its exact binding), or None
        and why; changes nothing."""
        return find_preemption(self, workload)

    def apply_preemption(self, preemption: Preemption) -> Binding:
        """Evict the victims and assume the preemptor's binding (nominated until committed)."""
        return apply_preemption(self, preemption)

    def undo_preemption(self, preemption: Preemption) -> None:
        """Roll an applied preemption back: preemptor forgotten, victims re-admitted as they were."""
        undo_preemption(self, preemption)

    def confirm_preemption(self, preemptor: str) -> None:
        """The driver made the evictions and the preemptor's binding durable: commit; nomination ends."""
        self.state.commit(preemptor)
        self._nominated.pop(preemptor, None)
        self._victims_committed.pop(preemptor, None)

    @property
    def nominated(self) -> dict[str, str]:
        """Preemptor -> node while its binding is assumed but not yet committed (the capacity its
        victims freed is held by that binding); an entry ends when the binding is committed, by
        `confirm_preemption` or `ClusterState.commit`, or is gone."""
        state = self.state
        live = {k: n for k, n in self._nominated.items() if k in state.bindings and not state.is_committed(k)}
        if len(live) != len(self._nominated):
            self._nominated = dict(live)
        return live

    def preempt(self, workload: Workload) -> Binding:
        """`schedule_one`, preempting when the workload fits nowhere (raises FitError if that fails too)."""
        return place_or_preempt(self, workload)[0]

    def take_preemptions(self) -> list[Preemption]:
        """The preemptions applied since the last call, in order (then forgotten here)."""
        out, self.preemptions = self.preemptions, []
        return out

    # Defragmentation (sched/defrag.py has the driver contract) ---------------------------------------
    def remember_movable(self, workload: Workload) -> None:
        """A driver restoring a bound workload tells the defragmenter whether it may move it."""
        if workload.movable:
            self.movable[workload.key] = workload
        else:
            self.movable.pop(workload.key, None)

    def find_defragmentation(
        self, workload: Workload, defragmenter: Defragmenter | None = None, now: float | None = None
    ) -> tuple[DefragPlan | None, str]:
        """The moves that would let `workload` fit, or None and why; changes nothing. `defragmenter`:
        the budget to plan under (default: the profile's; a dry run passes its own)."""
        defragmenter = defragmenter or self.defragmenter
        if defragmenter is None:
            return None, "defragmentation is off (the profile has no defragmentation)"
        return find_defragmentation(self, workload, defragmenter, self.clock() if now is None else now)

    def apply_defragmentation(self, plan: DefragPlan) -> Binding:
        """Move the plan's workloads to their targets and assume the waiting workload's binding
        (committed at once with `auto_commit`, else until `confirm_defragmentation`)."""
        state = self.state
        committed = {m.workload for m in plan.moves if state.is_committed(m.workload)}
        apply_plan(state, plan, self.auto_commit)
        self._movers_committed[plan.workload] = committed
        if self.defragmenter is not None:
            self.defragmenter.record(plan, self.clock())
        self.defragmentations.append(plan)
        return plan.binding

    def undo_defragmentation(self, plan: DefragPlan) -> None:
        """Take an applied plan back: every mover on its source again, the waiting workload forgotten."""
        undo_plan(self.state, plan, self._movers_committed.pop(plan.workload, None))
        if self.defragmenter is not None:
            self.defragmenter.unrecord(plan)
        if plan in self.defragmentations:
            self.defragmentations.remove(plan)

    def confirm_defragmentation(self, plan: DefragPlan) -> None:
        """The driver made the moves and the binding durable: commit them."""
        for move in plan.moves:
            if self.state.bindings.get(move.workload) == move.target:
                self.state.commit(move.workload)
        if plan.workload in self.state.bindings:
            self.state.commit(plan.workload)
        self._movers_committed.pop(plan.workload, None)

    def take_defragmentations(self) -> list[DefragPlan]:
        """The plans applied since the last call, in order (then forgotten here)."""
        out, self.defragmentations = self.defragmentations, []
        return out

    def release(self, binding: Binding | str) -> Binding:
        """Remove a binding (the workload finished or was deleted) and give its resources back."""
        key = binding if isinstance(binding, str) else binding.workload
        self.movable.pop(key, None)
        released = self.state.forget(key)
        self.queue.cluster_changed()
        return released


def _problem_text(exc: ValidationError, workload: str) -> str:
    """The problems of a ValidationError, without the workload's own key as their path."""
    return "; ".join(str(replace(e, path="") if e.path == workload else e) for e in exc.errors)


def _prefilter_error(workload: str, n: int, exc: PreFilterFailed) -> FitError:
    status = exc.status
    if status.code == Code.ERROR:
        raise ValidationError(f"{status.plugin}: {status.message()}", path=workload)
    reason = f"{status.message()} ({status.plugin})"
    return FitError(workload, n, {reason: n}, unresolvable=status.code == Code.UNRESOLVABLE)
