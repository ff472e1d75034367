"""kube-scheduler's preemption rules on finesched's victim units: eligibility, reprieve order, node order.

The rules follow pkg/scheduler/framework/preemption/preemption.go and
plugins/defaultpreemption/default_preemption.go:

* reprieve order (`reprieve_order`, SelectVictimsOnNode): the node's eligible victims sorted by
  importance (priority high first, then older first), those whose eviction would break a
  disruption budget before the others (filterPodsWithPDBViolation: walking the victims in that
  order, each one a budget covers takes one of the budget's allowed disruptions; once none is
  left, the victim is *violating*);
* budget violations of a node (`NodePlan.violations`): the number of violating victims that were
  not reprieved — each victim counts one, however many budgets it breaks (numViolatingVictim);
* node order (`NodePlan.key`, pickOneNodeForPreemption): fewest violations, lowest highest victim
  priority, smallest sum of victim priorities each offset by MaxInt32 + 1 (so that with negative
  or zero priorities more victims still weigh more), fewest victims, latest start among the
  highest-priority victims, then candidate rank.

A *unit* is what is evicted together: one workload, or a whole gang (its members on other nodes
count as victims too). Quota reclaim (sched/elastic.py) adds equal-priority units of tenants that
borrow above their min.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finesched.model.binding import Binding
from finesched.plugins.preemption_index import Bound, Grant
from finesched.sched.elastic import ReclaimRule

#: pickOneNodeForPreemption adds MaxInt32 + 1 to every victim priority before summing.
PRIORITY_OFFSET = 2**31


@dataclass
class Unit:
    """Workloads evicted together: one workload, or a whole gang."""

    members: list[Bound]
    reason: str
    amounts: dict[str, int] = field(default_factory=dict)  # held on the node being looked at (needed names)
    grants: list[Grant] = field(default_factory=list)  # device grants there
    #: Members whose eviction breaks a disruption budget (set by `reprieve_order`).
    violating: int = 0
    priority: int = 0  # the highest member priority
    start: int = 0  # the earliest member start

    def __post_init__(self) -> None:
        self.priority = max(m.priority for m in self.members)
        self.start = min(m.seq for m in self.members)

    @property
    def keys(self) -> list[str]:
        return [m.key for m in self.members]


@dataclass
class NodePlan:
    """The victims chosen on one candidate node."""

    node: int
    victims: list[Unit]
    rank: int
    #: The preemptor's exact binding on the node minus the victims, when the exact path found it.
    binding: Binding | None = None
    #: Whether the victims come from the exact path (the real filters), not the node model.
    exact: bool = False

    @property
    def violations(self) -> int:
        """Violating victims evicted (kube-scheduler's NumPDBViolations: one per victim)."""
        return sum(u.violating for u in self.victims)

    @property
    def key(self) -> tuple[int, ...]:
        """pickOneNodeForPreemption's order, smallest first (module docstring)."""
        members = [m for u in self.victims for m in u.members]
        top = max(m.priority for m in members)
        earliest_top = min(m.seq for m in members if m.priority == top)
        offset_sum = sum(m.priority + PRIORITY_OFFSET for m in members)
        return (self.violations, top, offset_sum, len(members), -earliest_top, self.rank)

    @property
    def keys(self) -> list[str]:
        return [k for u in self.victims for k in u.keys]


def eligible(members: list[Bound], priority: int, rule: ReclaimRule | None) -> str | None:
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


def reclaim_keeps_min(victims: list[Unit], priority: int, rule: ReclaimRule | None) -> bool:
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


def reprieve_order(units: list[Unit], groups: list[tuple[Any, set[str]]]) -> list[Unit]:
    """Units in the order they are offered back (module docstring), each unit's `violating` set.

    A budget allows ``len(covered) - minAvailable`` disruptions. Example: budget minAvailable 1
    over {a, b} (1 allowed), victims a (priority 5) then b (priority 3): a takes the one allowed
    disruption, b finds none left: b is violating and is offered back first.
    """
    ordered = sorted(units, key=lambda u: (-u.priority, u.start))
    if not groups:
        return ordered  # units are built fresh for each node: `violating` is 0
    allowed = [len(members) - budget.min_available for budget, members in groups]
    for unit in ordered:
        unit.violating = 0
        for m in sorted(unit.members, key=lambda m: (-m.priority, m.seq)):
            broken = False
            for g, (_, members) in enumerate(groups):
                if m.key in members:
                    allowed[g] -= 1
                    broken |= allowed[g] < 0
            unit.violating += broken
    return [u for u in ordered if u.violating] + [u for u in ordered if not u.violating]
