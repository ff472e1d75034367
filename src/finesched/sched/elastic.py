"""Quotas: the hard `quota`, and elastic `min`/`max` quotas in a tenant tree, with borrowing and reclaim.

Rules (model/tenant.py says what users write):

* hard quota: what a tenant holds plus what it asks must stay within `quota`; nothing else;
* max: the same for the tenant and every ancestor, over the ancestor's whole subtree;
* borrowing: above its `min` a tenant may use any capacity that is free right now, including
  what other tenants' `min` guarantees but they do not use (up to its `max`); it is lent, not
  given — reclaim takes it back;
* reclaim: a tenant whose holdings plus a pending workload's demand stay within its `min` (in
  every demanded resource its `min` names, at least one) — or, for a tenant without one, whose
  nearest ancestor's subtree does — may preempt *borrowers* at equal priority: workloads of
  tenants outside that subtree whose own guarantee (nearest `min` up their tree) holds more than
  its `min` of a resource the workload needs, and keeps at least its `min` after the eviction. A
  tenant under its `min` is never such a victim. A tenant with no `min` anywhere up its tree
  counts as `min` 0: all it holds is borrowed.

Amounts are translated (`nvidia.com/gpu: 1` = gpu-core 100 + gpu-memory-ratio 100), so quotas
count in the same names as requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from finesched.errors import ErrorDetail, ValidationError
from finesched.model.resources import PODS, human_amount, resource_kind, translate_gpu_shortcuts
from finesched.model.tenant import Tenant
from finesched.quantity import format_quantity

Amounts = Mapping[str, int]


@dataclass(frozen=True)
class ReclaimRule:
    """Which victims a workload of `tenant` may evict at its own priority (quota reclaim)."""

    tenant: str
    needs: frozenset[str]
    victim_ok: Callable[[str, Amounts], bool]
    #: The guarantee a victim tenant's holdings count against (victims are checked together per group).
    group: Callable[[str], str] = str


class QuotaTree:
    """Every tenant's quotas, translated, with the parent links checked (see the module docstring)."""

    def __init__(self, tenants: Iterable[Tenant]):
        tenants = list(tenants)
        self.tenants = {t.name: t for t in tenants}
        self.names = {t.name for t in tenants}
        self.hard: dict[str, dict[str, int]] = {}
        self.min: dict[str, dict[str, int]] = {}
        self.max: dict[str, dict[str, int]] = {}
        self.parent: dict[str, str] = {}
        errors: list[ErrorDetail] = []
        for t in tenants:
            if t.quota is not None:
                self.hard[t.name] = translate_gpu_shortcuts(t.quota)
            if t.min is not None:
                self.min[t.name] = translate_gpu_shortcuts(t.min)
            if t.max is not None:
                self.max[t.name] = translate_gpu_shortcuts(t.max)
            if t.parent is not None:
                if t.parent not in self.names:
                    errors.append(ErrorDetail("parent", "names no tenant", t.parent, f"tenant {t.name}"))
                else:
                    self.parent[t.name] = t.parent
        errors += self._cycles()
        if errors:
            raise ValidationError(errors)
        self.children: dict[str, list[str]] = {}
        for child, parent in self.parent.items():
            self.children.setdefault(parent, []).append(child)
        self._elastic_roots = {self.root(t) for t in (*self.min, *self.max)}

    def with_tenant(self, tenant: Tenant) -> QuotaTree:
        """The tree with `tenant` added or replaced (raises ValidationError, changing nothing, if invalid)."""
        return QuotaTree([*(t for t in self.tenants.values() if t.name != tenant.name), tenant])

    def _cycles(self) -> list[ErrorDetail]:
        errors = []
        for start in sorted(self.parent):
            seen, at = [start], self.parent.get(start)
            while at is not None and at not in seen:
                seen.append(at)
                at = self.parent.get(at)
            if at == start:
                path = " -> ".join([*seen, start])
                errors.append(ErrorDetail("parent", f"makes a cycle ({path})", self.parent[start], f"tenant {start}"))
        return errors

    @property
    def empty(self) -> bool:
        return not (self.hard or self.min or self.max)

    def limited(self, tenant: str) -> bool:
        """Whether admitting work of `tenant` needs any check at all (fast path for the queue)."""
        return tenant in self.hard or self.root(tenant) in self._elastic_roots

    def root(self, tenant: str) -> str:
        while tenant in self.parent:
            tenant = self.parent[tenant]
        return tenant

    def ancestors(self, tenant: str) -> list[str]:
        """`tenant` and its ancestors, nearest first."""
        out = [tenant]
        while out[-1] in self.parent:
            out.append(self.parent[out[-1]])
        return out

    def subtree(self, tenant: str) -> list[str]:
        out, stack = [], [tenant]
        while stack:
            t = stack.pop()
            out.append(t)
            stack += self.children.get(t, ())
        return out

    def subtree_held(self, tenant: str, held: Callable[[str], Amounts]) -> dict[str, int]:
        total: dict[str, int] = {}
        for t in self.subtree(tenant):
            for name, amount in held(t).items():
                total[name] = total.get(name, 0) + amount
        return total

    # Admission ---------------------------------------------------------------------------------------
    def problem(
        self,
        tenant: str,
        demand: Amounts,
        held: Callable[[str], Amounts],
    ) -> str | None:
        """Why admitting `demand` for `tenant` now would break a quota, or None when it may go."""
        mine = held(tenant)
        hard = self.hard.get(tenant)
        if hard:
            over = [
                _excess(n, mine.get(n, 0), demand.get(n, 0), "quota", limit)
                for n, limit in hard.items()
                if mine.get(n, 0) + demand.get(n, 0) > limit
            ]
            if over:
                return f"tenant {tenant} would exceed its quota: " + ", ".join(over)
        if self.root(tenant) not in self._elastic_roots:
            return None
        for t in self.ancestors(tenant):
            limit = self.max.get(t)
            if not limit:
                continue
            sub = self.subtree_held(t, held) if t in self.children else dict(held(t))
            over = [
                _excess(n, sub.get(n, 0), demand.get(n, 0), "max", cap)
                for n, cap in limit.items()
                if sub.get(n, 0) + demand.get(n, 0) > cap
            ]
            if over:
                return f"tenant {t} would exceed its max: " + ", ".join(over)
        return None

    def never_admits(self, tenant: str, demand: Amounts) -> str | None:
        """Why `demand` alone exceeds a cap of `tenant` — its hard `quota`, or the `max` of it or of an
        ancestor — so that no release of anything held ever admits it (only an admin raising the cap
        does), as Kubernetes' ResourceQuota message says it; None when some state of the cluster
        admits it. `min` guarantees and what others hold are not caps and do not count here."""
        caps = [("quota", tenant, self.hard.get(tenant))]
        caps += [("max", t, self.max.get(t)) for t in self.ancestors(tenant)]
        for kind, owner, limit in caps:
            over = sorted(n for n, cap in (limit or {}).items() if demand.get(n, 0) > cap)
            if over:
                assert limit is not None
                who = f"tenant {owner}" if owner == tenant else f"tenant {owner} (an ancestor of {tenant})"
                return f"exceeded quota: {who}, requested: {_listed(demand, over)}, {kind}: {_listed(limit, over)}"
        return None

    # Reclaim -----------------------------------------------------------------------------------------
    def reclaim_rule(self, tenant: str, demand: Amounts, held: Callable[[str], Amounts]) -> ReclaimRule | None:
        """The reclaim rule for a pending workload of `tenant`, or None when it is not under a min.

        The guarantee that reclaims is the nearest of `tenant` and its ancestors whose subtree stays
        within its `min` with the demand added (a team without its own `min` reclaims under its
        department's). A victim must be outside that subtree, and its own nearest guarantee (its
        tenant's or an ancestor's `min`, else 0) must be borrowed above before the eviction and
        still be held after it.
        """
        owner = next((a for a in self.ancestors(tenant) if self._within_min(a, demand, held)), None)
        if owner is None:
            return None
        inside = set(self.subtree(owner))
        needs = frozenset(n for n, a in demand.items() if a > 0 and n != PODS)

        def victim_ok(victim_tenant: str, amounts: Amounts) -> bool:
            if victim_tenant in inside:
                return False
            guard = self._guarantee_of(victim_tenant)
            floor = self.min.get(guard, {}) if guard is not None else {}
            has = self.subtree_held(guard, held) if guard is not None else dict(held(victim_tenant))
            borrowing = any(has.get(n, 0) > floor.get(n, 0) for n in needs)
            keeps_min = all(has.get(n, 0) - amounts.get(n, 0) >= floor.get(n, 0) for n in needs)
            return borrowing and keeps_min

        def group(victim_tenant: str) -> str:
            return self._guarantee_of(victim_tenant) or victim_tenant

        return ReclaimRule(tenant, needs, victim_ok, group)

    def _within_min(self, tenant: str, demand: Amounts, held: Callable[[str], Amounts]) -> bool:
        mins = self.min.get(tenant)
        if not mins:
            return False
        named = [n for n, a in demand.items() if a > 0 and n in mins]
        if not named:
            return False
        sub = self.subtree_held(tenant, held) if tenant in self.children else held(tenant)
        return all(sub.get(n, 0) + demand[n] <= mins[n] for n in named)

    def _guarantee_of(self, tenant: str) -> str | None:
        """The nearest of `tenant` and its ancestors with a `min` (None: nothing guaranteed)."""
        if tenant not in self.names:
            return None
        return next((a for a in self.ancestors(tenant) if a in self.min), None)


def _excess(name: str, holds: int, asks: int, bound: str, limit: int) -> str:
    """``cpu (holds 4, asks 8, max 4)``: amounts in a reason as every view shows them (`human_amount`)."""
    holds_, asks_, limit_ = (human_amount(name, v) for v in (holds, asks, limit))
    return f"{name} (holds {holds_}, asks {asks_}, {bound} {limit_})"


def _listed(amounts: Amounts, names: Iterable[str]) -> str:
    """``cpu=8,memory=64Gi``: the amounts of `names` as quantities (the form of a ResourceQuota's message)."""
    return ",".join(f"{n}={format_quantity(amounts.get(n, 0), resource_kind(n))}" for n in names)
