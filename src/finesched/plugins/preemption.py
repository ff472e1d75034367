"""DefaultPreemption: when a workload fits nowhere, evict the fewest, cheapest lower-priority workloads.

The post_filter point (kube-scheduler's DefaultPreemption, with device- and CPU-level precision;
the rules themselves are in plugins/preemption_rules.py):

1. Eligible victims: bound (committed) workloads of lower priority; with quota reclaim
   (sched/elastic.py), also equal-priority workloads of tenants borrowing above their `min`. A gang member goes only
   with its whole gang (the gang is one *unit*: its members on other nodes count as victims too).
   A workload whose `preemptionPolicy` is Never preempts nothing.
2. Candidate nodes: one vectorized pass over all nodes (PreemptionIndex) finds where free + what
   eligible victims hold covers the request (scalar amounts per node, device amounts per device
   under the allocator's per-device rule), ordered by the lowest priority level whose eviction
   could suffice. Nodes where the workload could not fit even with every workload gone are
   *unresolvable* (`PreemptionHandle.unresolvable`: a property of the node alone, e.g. no card
   with enough memory, a node selector it does not match) and are skipped, as kube-scheduler
   skips UnschedulableAndUnresolvable nodes. The first `candidates` of the rest (default 16;
   kube-scheduler samples at least 100 nodes in arbitrary order, finesched the best by that
   bound) are looked at.
3. Victims on a candidate, as kube-scheduler's SelectVictimsOnNode: evict every eligible unit,
   then re-admit (*reprieve*) units one by one — budget-violating first, each group by priority
   high to low, older first — keeping a unit whenever the workload still fits. "Fits" is the
   fast node model (plugins/preemption_model.py: scalar free amounts, per-device fit) when it
   states every constraint of the request on that node; otherwise (an exclusive cpuset, a
   strict NUMA policy, a device hint, a joint allocation) the *exact path*: the profile's real
   filters and reserve on the state minus the victims (`PreemptionHandle.try_without`), with the
   model only skipping checks it already answers no to (it is a relaxation of the exact step).
4. Nodes are ranked as pickOneNodeForPreemption does (preemption_rules.NodePlan.key). Best
   first, the victims are checked with the real filters, reserve and pre_bind; when a model
   plan fails that check, the node is planned again on the exact path and ranked again with
   its exact victims.

The result names the node, the victims and the preemptor's exact binding there; the scheduler
applies it (sched/preempt.py). Nothing here changes the state.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.resources import translate_gpu_shortcuts
from finesched.model.workload import Workload
from finesched.plugins.deviceshare.plugin import DEVICE_REQUEST
from finesched.plugins.deviceshare.request import compile_rule, fit_mask
from finesched.plugins.preemption_index import ANNOTATION_PREEMPTION, PreemptionIndex, annotation_for
from finesched.plugins.preemption_model import NodeModel, expresses
from finesched.plugins.preemption_rules import NodePlan, Unit, eligible, reclaim_keeps_min, reprieve_order
from finesched.sched.cycle_state import CycleState
from finesched.sched.elastic import ReclaimRule
from finesched.sched.framework import Preemption, PreemptionHandle
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState
from finesched.state.device_types import NodeDevices

#: Request shapes whose unresolvable verdicts are kept (all dropped when full).
_VERDICT_SHAPES = 256


class DefaultPreemption:
    """The post_filter plugin (module docstring); also records gang, labels and budget on bindings."""

    NAME = "DefaultPreemption"

    def __init__(self, candidates: int = 16):
        self.candidates = candidates
        self.state: ClusterState | None = None
        self.index = PreemptionIndex()
        #: Unresolvable verdicts per request shape (int8 per node: -1 not asked yet, 0 no, 1 yes). A
        #: verdict reads only the node's own fixed properties (diagnosis.unresolvable_nodes), never
        #: what is bound, so it holds until the node set changes (`nodes_version`).
        self._verdicts: dict[Hashable, npt.NDArray[np.int8]] = {}
        self._verdicts_version = -1

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> DefaultPreemption:
        unknown = set(args) - {"candidates"}
        if unknown:
            raise ValidationError("unknown argument; valid: candidates", path=f"args.{sorted(unknown)[0]}")
        value = args.get("candidates", 16)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValidationError("must be an integer >= 1", path="args.candidates", value=value)
        return cls(value)

    def attach(self, state: ClusterState) -> None:
        self.state = state
        self.index = state.attach(PreemptionIndex())

    # pre_bind: what later preemptions need to know about this workload ------------------------------
    def pre_bind(self, cycle: CycleState, request: ScheduleRequest, node: int, binding: Binding) -> Binding:
        w = request.workload
        budget = w.disruption_budget
        text = annotation_for(
            f"{w.namespace}/{w.gang.name}" if w.gang else None,
            w.labels,
            None if budget is None else {"minAvailable": budget.min_available, "selector": dict(budget.selector)},
        )
        if text is None:
            return binding
        return binding.model_copy(update={"annotations": {**binding.annotations, ANNOTATION_PREEMPTION: text}})

    # post_filter -------------------------------------------------------------------------------------
    def post_filter(
        self, cycle: CycleState, request: ScheduleRequest, handle: PreemptionHandle
    ) -> tuple[Preemption | None, str]:
        w = request.workload
        if w.preemption_policy == "Never":
            return None, "preemptionPolicy is Never"
        state = self.state
        if state is None or state.n == 0:
            return None, "no nodes"
        rule = handle.reclaim_rule(w)
        need = {n: a for n, a in translate_gpu_shortcuts(w.requests).items() if a > 0}
        order = self._candidates(cycle, request, handle, self._ranked_nodes(cycle, w.priority, need, rule is not None))
        if not order:
            return None, "no node would fit even with every lower-priority workload evicted"
        groups = self.index.budget_groups()
        dreq = cycle.get(DEVICE_REQUEST)
        plans = []
        for rank, i in enumerate(order):
            exact = not expresses(cycle, state, dreq, i)
            plan = self._plan_node(cycle, request, handle, i, need, rule, groups, rank, exact)
            if plan is not None:
                plans.append(plan)
        heap = [(plan.key, plan) for plan in plans]  # keys are unique: the rank ends each
        heapq.heapify(heap)
        while heap:
            _, plan = heapq.heappop(heap)
            binding = plan.binding or handle.try_without(cycle, request, plan.node, plan.keys)
            if binding is None:
                if not plan.exact:  # the model missed a constraint: plan the node exactly, rank it again
                    exact = self._plan_node(cycle, request, handle, plan.node, need, rule, groups, plan.rank, True)
                    if exact is not None:
                        heapq.heappush(heap, (exact.key, exact))
                continue
            reasons = {m.key: u.reason for u in plan.victims for m in u.members}
            victims = tuple(m.binding for u in plan.victims for m in u.members)
            return Preemption(w.key, state.names[plan.node], victims, binding, reasons, plan.violations), ""
        return None, f"evicting lower-priority workloads makes it fit on none of the {len(order)} nodes tried"

    def _candidates(
        self, cycle: CycleState, request: ScheduleRequest, handle: PreemptionHandle, ranked: Iterator[int]
    ) -> list[int]:
        """The first `candidates` nodes of `ranked` that are not unresolvable for the request.

        Asked in growing chunks (16, 32, ...): usually the first chunk has no unresolvable node
        and one small filter pass decides.
        """
        verdicts = self._verdicts_of(request)
        picked: list[int] = []
        chunk = self.candidates
        allowed = handle.allowed  # a topology gang's domain, or None
        while len(picked) < self.candidates:
            nodes = np.fromiter(itertools.islice(ranked, chunk), dtype=np.intp)
            if len(nodes) == 0:
                break
            if allowed is not None:
                nodes = nodes[allowed[nodes]]
            unknown = nodes[verdicts[nodes] < 0]
            if len(unknown):
                verdicts[unknown] = handle.unresolvable(cycle, request, unknown)
            picked += nodes[verdicts[nodes] == 0].tolist()
            chunk *= 2
        return picked[: self.candidates]

    def _verdicts_of(self, request: ScheduleRequest) -> npt.NDArray[np.int8]:
        """The unresolvable verdicts kept for the request's shape (a fresh array when it has none)."""
        state = self.state
        assert state is not None
        if self._verdicts_version != state.nodes_version:
            self._verdicts, self._verdicts_version = {}, state.nodes_version
        if request.shape is None:
            return np.full(state.n, -1, dtype=np.int8)
        verdicts = self._verdicts.get(request.shape)
        if verdicts is None:
            if len(self._verdicts) >= _VERDICT_SHAPES:
                self._verdicts.clear()
            verdicts = self._verdicts[request.shape] = np.full(state.n, -1, dtype=np.int8)
        return verdicts

    def _free(self, name: str, n: int) -> np.ndarray:
        state = self.state
        assert state is not None
        r = state.res_index.get(name)
        if r is not None:
            return state.free[r, :n]
        capacity = self.index.device_capacity.get(name)
        if capacity is None:
            return np.zeros(n, dtype=np.int64)
        return capacity[:n] - self.index.used(name, n)

    def _free_at(self, name: str, node: int) -> int:
        """`_free` on one node."""
        state = self.state
        assert state is not None
        r = state.res_index.get(name)
        if r is not None:
            return int(state.free[r, node])
        capacity = self.index.device_capacity.get(name)
        if capacity is None:
            return 0
        held = sum(int(cols[name][node]) for cols in self.index.held.values() if name in cols)
        return int(capacity[node]) - held

    def _ranked_nodes(
        self, cycle: CycleState, priority: int, need: Mapping[str, int], inclusive: bool
    ) -> Iterator[int]:
        """Nodes where evicting every eligible workload could free enough, best lower bound first.

        The bound: the lowest priority level whose eviction (with every level below it) would
        leave enough free — scalar amounts summed per node, device amounts per device under the
        allocator's per-device rule — a lower bound of the highest victim priority on the node.
        Lazy: a level is computed only when the caller wants more nodes than the lower levels gave.
        """
        state = self.state
        assert state is not None
        n = state.n
        levels = sorted(p for p in self.index.held if p < priority or (inclusive and p == priority))
        devices = self._device_inputs(cycle, n)
        if not levels or devices is None:
            return  # nothing bound that this workload may evict, or a device type no node has
        cumulative = {name: self._free(name, n).copy() for name in need}
        seen = np.zeros(n, dtype=bool)
        for p in levels:
            ok = np.ones(n, dtype=bool)
            for name, amount in need.items():
                column = self.index.held[p].get(name)
                if column is not None:
                    cumulative[name] += column[:n]
                ok &= cumulative[name] >= amount
            for tr, acc, free in devices:
                for k, dim in enumerate(acc.dims):
                    held = self.index.device_held_upto((p,), tr.type, dim, n, free.shape[2])
                    if held is not None:
                        free[k] += held
                rule = compile_rule(tr, acc.dims)
                ok &= fit_mask(rule, free, acc.total[:, :n], acc.healthy[:n]).sum(axis=1) >= tr.count
            fresh = ok & ~seen
            seen |= ok
            yield from map(int, np.flatnonzero(fresh))  # lazily: the caller takes a few

    def _device_inputs(self, cycle: CycleState, n: int) -> list[tuple[Any, Any, np.ndarray]] | None:
        """(type request, type accounts, a copy of free [K, n, D]) per requested device type; None
        when a requested type exists on no node."""
        request = cycle.get(DEVICE_REQUEST)
        if request is None:
            return []
        accounts = self.state.extras.get("devices") if self.state is not None else None
        out = []
        for tr in request.types.values():
            acc = accounts.types.get(tr.type) if accounts is not None else None  # type: ignore[attr-defined]
            if acc is None:
                return None
            out.append((tr, acc, acc.free[:, :n].copy()))
        return out

    def _units(self, node: int, w: Workload, rule: ReclaimRule | None, need: Mapping[str, int]) -> list[Unit]:
        """The eligible victim units on `node` that hold something the workload needs (evicting
        any other could never help, so reprieve would always keep it).

        Only committed bindings are victims: one still in flight (assumed, its driver has not
        made it durable yet, e.g. decided earlier in the same batch) is not evicted under it.
        """
        assert self.state is not None
        committed = self.state.is_committed
        units, seen = [], set()
        priority = w.priority
        for bound in list(self.index.on_node[node].values()):
            if bound.key in seen:
                continue
            if not bound.grants and not any(n in need for n in bound.amounts):
                continue
            if not committed(bound.key):
                continue
            if bound.gang is None:
                if bound.priority < priority:
                    amounts = {n: a for n, a in bound.amounts.items() if n in need}
                    reason = f"priority {bound.priority} < {priority}"
                    units.append(Unit([bound], reason, amounts, list(bound.grants)))
                    continue
                members = [bound]
            else:
                members = self.index.gang_members(bound)
                seen.update(m.key for m in members)
            reason = eligible(members, priority, rule)
            if reason is None or not all(committed(m.key) for m in members):
                continue
            unit = Unit(members, reason)
            for m in members:
                if m.node != node:
                    continue
                for name, amount in m.amounts.items():
                    if name in need:
                        unit.amounts[name] = unit.amounts.get(name, 0) + amount
                unit.grants += m.grants
            units.append(unit)
        return units

    def _model(self, cycle: CycleState, node: int, need: Mapping[str, int]) -> NodeModel:
        state = self.state
        assert state is not None
        free = {name: self._free_at(name, node) for name in need}
        devices = []
        request = cycle.get(DEVICE_REQUEST)
        accounts = state.extras.get("devices")
        if request is not None and accounts is not None:
            for tr in request.types.values():
                nd = accounts.node_devices(node, tr.type)  # type: ignore[attr-defined]
                if nd is None:
                    devices.append((tr, _no_devices(tr.type)))
                else:
                    devices.append((tr, nd))
        return NodeModel(free, need, devices)

    def _plan_node(
        self,
        cycle: CycleState,
        request: ScheduleRequest,
        handle: PreemptionHandle,
        node: int,
        need: Mapping[str, int],
        rule: ReclaimRule | None,
        groups: list[tuple[Any, set[str]]],
        rank: int,
        exact: bool,
    ) -> NodePlan | None:
        """The victims on `node` (module docstring, step 3), or None when no eviction there helps.

        Every eligible unit out, then each offered back in reprieve order. With the model alone a
        unit stays out when the model says the workload no longer fits; on the exact path it
        stays out unless the real filters and reserve accept the state without it (a model "no"
        needs no exact check: the model is a relaxation). A model plan that evicts nothing means
        the model missed a constraint the filters saw: the node is planned on the exact path.
        """
        units = self._units(node, request.workload, rule, need)
        if not units:
            return None
        model = self._model(cycle, node, need)
        for unit in units:
            model.apply(unit.amounts, unit.grants, +1)
        if not model.fits():
            return None
        ordered = reprieve_order(units, groups)
        binding = None
        if exact:
            found = self._reprieve_exactly(cycle, request, handle, node, ordered, model)
            if found is None:
                return None
            victims, binding = found
        else:
            victims = []
            for unit in ordered:
                model.apply(unit.amounts, unit.grants, -1)
                if not model.fits():
                    model.apply(unit.amounts, unit.grants, +1)
                    victims.append(unit)
            if not victims:  # the model fits it with nobody evicted, which the filters refused
                return self._plan_node(cycle, request, handle, node, need, rule, groups, rank, True)
        if not reclaim_keeps_min(victims, request.workload.priority, rule):
            return None
        return NodePlan(node, victims, rank, binding, exact)

    @staticmethod
    def _reprieve_exactly(
        cycle: CycleState,
        request: ScheduleRequest,
        handle: PreemptionHandle,
        node: int,
        ordered: list[Unit],
        model: NodeModel,
    ) -> tuple[list[Unit], Binding] | None:
        """SelectVictimsOnNode with the real filters: (victims, the preemptor's binding without them),
        or None when it does not fit even with every unit out. `model` has every unit out; a unit
        the model says cannot come back stays out without an exact check."""
        binding = handle.try_without(cycle, request, node, [k for u in ordered for k in u.keys])
        if binding is None:
            return None
        reprieved: set[int] = set()  # ids of the units offered back and kept
        for unit in ordered:
            model.apply(unit.amounts, unit.grants, -1)
            trial = None
            if model.fits():
                rest = [k for u in ordered if u is not unit and id(u) not in reprieved for k in u.keys]
                trial = handle.try_without(cycle, request, node, rest) if rest else None
            if trial is None:
                model.apply(unit.amounts, unit.grants, +1)
            else:
                reprieved.add(id(unit))
                binding = trial
        return [u for u in ordered if id(u) not in reprieved], binding


def _no_devices(kind: str) -> NodeDevices:
    none, empty = np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.int64)
    return NodeDevices(kind, (), none, np.zeros(0, dtype=bool), none, none, empty, empty)
