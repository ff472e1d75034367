"""DefaultPreemption: when a workload fits nowhere, evict the fewest, cheapest lower-priority workloads.

The post_filter point (kube-scheduler's DefaultPreemption, with device- and CPU-level precision):

1. Eligible victims: bound (committed) workloads of lower priority; with quota reclaim
   (sched/elastic.py), also equal-priority workloads of tenants borrowing above their `min`. A gang member goes only
   with its whole gang (the gang is one *unit*: its members on other nodes count as victims too).
   A workload whose `preemptionPolicy` is Never preempts nothing.
2. One vectorized pass over all nodes (PreemptionIndex): nodes where free + what eligible
   victims hold covers the request (scalar amounts per node, device amounts per device under
   the allocator's rule), ordered by the lowest priority level whose eviction could suffice.
3. On the first `candidates` of them (default 16; kube-scheduler samples at least 100 nodes in
   arbitrary order, finesched the best by that bound), victims are chosen as kube-scheduler does: evict every
   eligible unit, then re-admit (*reprieve*) units one by one — those whose eviction would break
   a disruption budget first, each group by priority high to low, older first — keeping a unit
   whenever the workload still fits. "Fits" here is a node model with per-device free amounts
   (the allocator's per-GPU fit rule) and scalar free amounts.
4. Nodes are ranked by (budget violations, highest victim priority, sum of victim priorities,
   number of victims, earliest start among the highest-priority victims — later is better, node
   order). Best first, the victims are checked with the profile's real filters, reserve and
   pre_bind on the state minus the victims (`PreemptionHandle.try_without`: exact GPU shares,
   cpusets, NUMA). When the node model's choice fails that check, the node is retried with
   every eligible unit evicted and an exact reprieve.

The result names the node, the victims and the preemptor's exact binding there; the scheduler
applies it (sched/preempt.py). Nothing here changes the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.resources import translate_gpu_shortcuts
from finesched.model.workload import Workload
from finesched.plugins.deviceshare.plugin import DEVICE_REQUEST
from finesched.plugins.deviceshare.request import compile_rule, fit_mask
from finesched.plugins.preemption_index import ANNOTATION_PREEMPTION, Bound, Grant, PreemptionIndex, annotation_for
from finesched.plugins.preemption_model import NodeModel
from finesched.sched.cycle_state import CycleState
from finesched.sched.elastic import ReclaimRule
from finesched.sched.framework import Preemption, PreemptionHandle
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState
from finesched.state.device_types import NodeDevices


@dataclass
class Unit:
    """Workloads evicted together: one workload, or a whole gang."""

    members: list[Bound]
    reason: str
    amounts: dict[str, int] = field(default_factory=dict)  # held on the node being looked at (needed names)
    grants: list[Grant] = field(default_factory=list)  # device grants there
    violating: bool = False
    priority: int = 0  # the highest member priority
    start: int = 0  # the earliest member start

    def __post_init__(self) -> None:
        self.priority = max(m.priority for m in self.members)
        self.start = min(m.seq for m in self.members)


@dataclass
class NodePlan:
    node: int
    victims: list[Unit]
    violations: int
    rank: int

    @property
    def key(self) -> tuple[int, ...]:
        members = [m for u in self.victims for m in u.members]
        top = max(m.priority for m in members)
        earliest_top = min(m.seq for m in members if m.priority == top)
        return (self.violations, top, sum(m.priority for m in members), len(members), -earliest_top, self.rank)

    @property
    def keys(self) -> list[str]:
        return [m.key for u in self.victims for m in u.members]


class DefaultPreemption:
    """The post_filter plugin (module docstring); also records gang, labels and budget on bindings."""

    NAME = "DefaultPreemption"

    def __init__(self, candidates: int = 16):
        self.candidates = candidates
        self.state: ClusterState | None = None
        self.index = PreemptionIndex()

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
        order = self._possible_nodes(cycle, w.priority, need, rule is not None)
        if len(order) == 0:
            return None, "no node would fit even with every lower-priority workload evicted"
        groups = self.index.budget_groups()
        plans = []
        for rank, i in enumerate(order[: self.candidates]):
            plan = self._plan_node(cycle, request, int(i), need, rule, groups, rank)
            if plan is not None:
                plans.append(plan)
        plans.sort(key=lambda p: p.key)
        for plan in plans:
            binding = handle.try_without(cycle, request, plan.node, plan.keys)
            if binding is None:
                plan = self._exact_plan(cycle, request, handle, plan, rule, groups)
                if plan is None:
                    continue
                binding = handle.try_without(cycle, request, plan.node, plan.keys)
                if binding is None:
                    continue
            reasons = {m.key: u.reason for u in plan.victims for m in u.members}
            victims = tuple(m.binding for u in plan.victims for m in u.members)
            return Preemption(w.key, state.names[plan.node], victims, binding, reasons, plan.violations), ""
        return None, f"evicting lower-priority workloads makes it fit on none of the {len(order)} nodes tried"

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

    def _possible_nodes(self, cycle: CycleState, priority: int, need: Mapping[str, int], inclusive: bool) -> np.ndarray:
        """Nodes where evicting every eligible workload could free enough, best lower bound first.

        The bound: the lowest priority level whose eviction (with every level below it) would
        leave enough free — scalar amounts summed per node, device amounts per device under the
        allocator's per-device rule — a lower bound of the highest victim priority on the node.
        """
        state = self.state
        assert state is not None
        n = state.n
        levels = sorted(p for p in self.index.held if p < priority or (inclusive and p == priority))
        if not levels:
            return np.zeros(0, dtype=np.intp)  # nothing bound that this workload may evict
        bound = np.full(n, len(levels), dtype=np.int64)
        cumulative = {name: self._free(name, n).copy() for name in need}
        devices = self._device_inputs(cycle, n)
        if devices is None:
            return np.zeros(0, dtype=np.intp)
        for level, p in enumerate(levels):
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
            bound = np.where((bound == len(levels)) & ok, level, bound)
            if np.count_nonzero(bound <= level) >= self.candidates:
                break  # the first `candidates` nodes in bound order are known: higher levels come after
        # Only the first `candidates` nodes in (bound, index) order are looked at: take them level by level.
        picked: list[np.ndarray] = []
        remaining = self.candidates
        for level in range(len(levels)):
            if remaining <= 0:
                break
            at = np.flatnonzero(bound == level)[:remaining]
            picked.append(at)
            remaining -= len(at)
        return np.concatenate(picked) if picked else np.zeros(0, dtype=np.intp)

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
            reason = _eligible(members, priority, rule)
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
        node: int,
        need: Mapping[str, int],
        rule: ReclaimRule | None,
        groups: list[tuple[Any, set[str]]],
        rank: int,
    ) -> NodePlan | None:
        units = self._units(node, request.workload, rule, need)
        if not units:
            return None
        model = self._model(cycle, node, need)
        for unit in units:
            model.apply(unit.amounts, unit.grants, +1)
        if not model.fits():
            return None
        ordered = _reprieve_order(units, groups)
        victims = []
        for unit in ordered:
            model.apply(unit.amounts, unit.grants, -1)
            if not model.fits():
                model.apply(unit.amounts, unit.grants, +1)
                victims.append(unit)
        if not victims:
            return None  # it fits without evicting anyone: the filters said otherwise, so the model is short
        if not _reclaim_keeps_min(victims, request.workload.priority, rule):
            return None
        return NodePlan(node, victims, _violations(victims, groups), rank)

    def _exact_plan(
        self,
        cycle: CycleState,
        request: ScheduleRequest,
        handle: PreemptionHandle,
        plan: NodePlan,
        rule: ReclaimRule | None,
        groups: list[tuple[Any, set[str]]],
    ) -> NodePlan | None:
        """Every eligible unit evicted, then reprieve checked with the real filters (slow, exact)."""
        need = {n: a for n, a in translate_gpu_shortcuts(request.workload.requests).items() if a > 0}
        units = _reprieve_order(self._units(plan.node, request.workload, rule, need), groups)
        victims = list(units)
        if handle.try_without(cycle, request, plan.node, [m.key for u in victims for m in u.members]) is None:
            return None
        for unit in units:
            rest = [u for u in victims if u is not unit]
            if rest and handle.try_without(cycle, request, plan.node, [m.key for u in rest for m in u.members]):
                victims = rest
        if not _reclaim_keeps_min(victims, request.workload.priority, rule):
            return None
        return NodePlan(plan.node, victims, _violations(victims, groups), plan.rank)


def _eligible(members: list[Bound], priority: int, rule: ReclaimRule | None) -> str | None:
    """Why this unit may be evicted for a workload of `priority`, or None when it may not."""
    top = max(m.priority for m in members)
    if top < priority:
        return f"priority {top} < {priority}"
    if rule is None or top > priority:
        return None
    by_tenant: dict[str, dict[str, int]] = {}
    for m in members:
        amounts = by_tenant.setdefault(m.binding.tenant, {})
        for name, amount in m.amounts.items():
            amounts[name] = amounts.get(name, 0) + amount
    if all(rule.victim_ok(t, a) for t, a in by_tenant.items()):
        tenants = ", ".join(sorted(by_tenant))
        return f"reclaim: tenant {tenants} borrows above its min (priority {top} = {priority})"
    return None


def _reclaim_keeps_min(victims: list[Unit], priority: int, rule: ReclaimRule | None) -> bool:
    """Whether the equal-priority (reclaim) victims, all together, leave every guarantee at its min."""
    if rule is None:
        return True
    by_group: dict[str, tuple[str, dict[str, int]]] = {}
    for unit in victims:
        for m in unit.members:
            if m.priority < priority:
                continue
            tenant = m.binding.tenant
            _, amounts = by_group.setdefault(rule.group(tenant), (tenant, {}))
            for name, amount in m.amounts.items():
                amounts[name] = amounts.get(name, 0) + amount
    return all(rule.victim_ok(t, a) for t, a in by_group.values())


def _reprieve_order(units: list[Unit], groups: list[tuple[Any, set[str]]]) -> list[Unit]:
    """Units in the order they are offered back: budget-violating first, then by priority (high
    first) and start (older first), as kube-scheduler's reprieve."""
    ordered = sorted(units, key=lambda u: (-u.priority, u.start))
    if not groups:
        return ordered
    allowed = {id(budget): len(members) - budget.min_available for budget, members in groups}
    for unit in ordered:
        keys = {m.key for m in unit.members}
        unit.violating = False
        for budget, members in groups:
            hit = len(keys & members)
            if hit:
                if hit > allowed[id(budget)]:
                    unit.violating = True
                allowed[id(budget)] -= hit
    return [u for u in ordered if u.violating] + [u for u in ordered if not u.violating]


def _violations(victims: list[Unit], groups: list[tuple[Any, set[str]]]) -> int:
    keys = {m.key for u in victims for m in u.members}
    return sum(1 for budget, members in groups if len(members - keys) < budget.min_available and members & keys)


def _no_devices(kind: str) -> NodeDevices:
    none, empty = np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.int64)
    return NodeDevices(kind, (), none, np.zeros(0, dtype=bool), none, none, empty, empty)
