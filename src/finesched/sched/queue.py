"""The scheduling queue: priority first, then Dominant Resource Fairness between tenants (seed S4.5).

Order of `pop`:
1. the highest priority that has a ready workload;
2. among tenants with ready workloads at that priority, the one with the lowest
   *dominant share / weight*, where a tenant's dominant share is max over resources of
   (what its bindings hold / cluster capacity) — Ghodsi et al., NSDI 2011; ties by tenant name.
   A tenant whose last FAILING_AFTER units in a row fitted nowhere comes after the tenants whose
   work fits, until one of its units is placed: a flood of work that fits nowhere (which holds
   nothing, so its share stays 0) does not make every other tenant wait while each of its
   units is tried;
3. FIFO within the tenant.

A tenant whose next workload would take it over its quota (hard `quota`, elastic `max`, or
borrowing what other tenants' `min` guarantees: sched/elastic.py) is passed over (the workload
waits and does not fail). Unschedulable workloads back off (1 s doubling to 10 s, as kube-scheduler)
and return when the cluster's capacity changes. Gang members wait until `minMember` of them are
queued, then travel as one unit.

Cost per pop is O(priorities + tenants), independent of how many workloads are queued.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from finesched.model.resources import PODS, translate_gpu_shortcuts
from finesched.model.tenant import Tenant
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.elastic import QuotaTree, ReclaimRule

INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
#: Units in a row of one tenant that fitted nowhere, after which its work goes after the others'.
FAILING_AFTER = 8


@dataclass
class QueuedUnit:
    """One workload, or all members of a gang, waiting to be scheduled together."""

    workloads: list[Workload]
    seq: int
    attempts: int = 0
    not_before: float = 0.0
    last_error: FitError | None = None

    @property
    def tenant(self) -> str:
        return self.workloads[0].tenant

    @property
    def priority(self) -> int:
        return max(w.priority for w in self.workloads)

    @cached_property
    def demand(self) -> dict[str, int]:
        """What the unit will hold once placed (its workloads are fixed: computed once)."""
        total: dict[str, int] = {}
        for w in self.workloads:
            for name, amount in demand_of(w).items():
                total[name] = total.get(name, 0) + amount
        return total


def demand_of(workload: Workload) -> dict[str, int]:
    """What a workload will hold, in the names quotas and DRF count (GPU shortcuts translated)."""
    return translate_gpu_shortcuts(workload.requests)


@dataclass
class _TenantAccount:
    weight: float = 1.0
    quota: Mapping[str, int] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    failures: int = 0  # units in a row that fitted nowhere


class SchedulingQueue:
    """Priority + weighted DRF + FIFO, with quota waits, gangs and backoff (see the module docstring)."""

    def __init__(
        self,
        tenants: Iterable[Tenant] = (),
        capacity: Callable[[], Mapping[str, int]] = dict,
        clock: Callable[[], float] = time.monotonic,
        usage: Callable[[str], Mapping[str, int]] | None = None,
    ):
        """`usage(tenant)`, when given, is what the tenant holds (the Scheduler passes the cluster
        state's `TenantUsage`, which follows every binding); without it the queue keeps its own
        tally through `charge` and `refund`.

        Raises ValidationError for a tenant tree with an unknown parent or a cycle."""
        tenants = list(tenants)
        self.quotas = QuotaTree(tenants)
        self._accounts: dict[str, _TenantAccount] = {t.name: _TenantAccount(t.weight, t.quota) for t in tenants}
        self._usage_of = usage
        self._capacity = capacity
        self._clock = clock
        self._seq = itertools.count()
        self._active: dict[int, dict[str, deque[QueuedUnit]]] = {}
        self._gangs: dict[str, list[Workload]] = {}
        self._backoff: list[QueuedUnit] = []
        self._unschedulable: list[QueuedUnit] = []
        self._keys: set[str] = set()

    # Input ---------------------------------------------------------------------------------------------
    def push(self, workload: Workload) -> None:
        """Queue a workload (gang members are held until the gang is complete)."""
        if workload.key in self._keys:
            raise ValueError(f"workload {workload.key} is already queued")
        self._keys.add(workload.key)
        gang = workload.gang
        if gang is None:
            self._activate(QueuedUnit([workload], next(self._seq)))
            return
        gang_key = f"{workload.namespace}/{gang.name}"
        members = self._gangs.setdefault(gang_key, [])
        members.append(workload)
        if len(members) >= gang.min_member:
            del self._gangs[gang_key]
            self._activate(QueuedUnit(members, next(self._seq)))

    def _activate(self, unit: QueuedUnit) -> None:
        self._active.setdefault(unit.priority, {}).setdefault(unit.tenant, deque()).append(unit)

    # Output ------------------------------------------------------------------------------------------------
    def pop(self) -> QueuedUnit | None:
        """The next unit to schedule, or None when nothing is ready (empty, backing off, or over quota)."""
        self._release_backoff(self._clock())
        quotas_empty = self.quotas.empty
        for priority in sorted(self._active, reverse=True):
            tenants = self._active[priority]
            order = tenants if len(tenants) == 1 else sorted(tenants, key=self._drf_key)
            for tenant in order:
                unit = tenants[tenant][0]
                if not quotas_empty and self._over_quota(tenant, unit.demand):
                    continue
                tenants[tenant].popleft()
                if not tenants[tenant]:
                    del tenants[tenant]
                if not tenants:
                    del self._active[priority]
                return unit
        return None

    def done(self, unit: QueuedUnit) -> None:
        """The unit was placed; forget its keys (usage is charged separately, per binding)."""
        for w in unit.workloads:
            self._keys.discard(w.key)
        self._account(unit.tenant).failures = 0

    def park(self, unit: QueuedUnit, error: FitError) -> None:
        """The unit fits nowhere now: wait for a cluster change, then retry after backoff."""
        unit.attempts += 1
        unit.last_error = error.detached()  # its frames are not kept with it
        self._unschedulable.append(unit)
        self._account(unit.tenant).failures += 1

    def cluster_changed(self) -> None:
        """Capacity may have grown: parked units become ready after their backoff."""
        now = self._clock()
        for unit in self._unschedulable:
            doublings = min(unit.attempts - 1, 16)  # the cap is reached long before; no float overflow
            unit.not_before = now + min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2**doublings)
            self._backoff.append(unit)
        self._unschedulable.clear()

    def flush_backoff(self) -> None:
        """Make every backing-off unit ready now (offline runs do not wait for wall-clock time)."""
        self._release_backoff(float("inf"))

    def _release_backoff(self, now: float) -> None:
        if not self._backoff:
            return
        waiting = []
        for unit in self._backoff:
            if unit.not_before <= now:
                self._activate(unit)
            else:
                waiting.append(unit)
        self._backoff = waiting

    def waiting(self) -> list[tuple[QueuedUnit, str]]:
        """Units still not placed, with why: unschedulable, over quota, or an incomplete gang."""
        out: list[tuple[QueuedUnit, str]] = []
        out += [(u, "unschedulable") for u in self._unschedulable + self._backoff]
        for tenants in self._active.values():
            out += [(u, "quota") for units in tenants.values() for u in units]
        out += [(QueuedUnit(ws, -1), "gang") for ws in self._gangs.values()]
        return sorted(out, key=lambda pair: pair[0].seq)

    def forget(self, keys: Iterable[str]) -> int:
        """Drop queued workloads that no longer exist (deleted), wherever they wait: ready, backing off,
        parked or in an incomplete gang. One pass over the queue for any number of keys; how many
        were dropped. A gang that loses members goes on with the others."""
        gone = {key for key in keys if key in self._keys}
        if not gone:
            return 0

        def keep(unit: QueuedUnit) -> bool:
            if not any(w.key in gone for w in unit.workloads):
                return True
            unit.workloads = [w for w in unit.workloads if w.key not in gone]
            unit.__dict__.pop("demand", None)  # a cached_property: its workloads changed
            return bool(unit.workloads)

        for priority in list(self._active):
            tenants = self._active[priority]
            for tenant in list(tenants):
                tenants[tenant] = deque(u for u in tenants[tenant] if keep(u))
                if not tenants[tenant]:
                    del tenants[tenant]
            if not tenants:
                del self._active[priority]
        self._backoff = [u for u in self._backoff if keep(u)]
        self._unschedulable = [u for u in self._unschedulable if keep(u)]
        for gang_key in list(self._gangs):
            self._gangs[gang_key] = [w for w in self._gangs[gang_key] if w.key not in gone]
            if not self._gangs[gang_key]:
                del self._gangs[gang_key]
        # A new set rather than `-=`: a set never shrinks its table as keys leave, so the one that
        # held a flood of keys would keep its size after they were deleted. The pass is O(queue) anyway.
        self._keys = self._keys - gone
        return len(gone)

    def __len__(self) -> int:
        return len(self._keys)

    def holds(self, key: str) -> bool:
        """Whether workload `key` is queued (waiting, backing off, parked or in an incomplete gang)."""
        return key in self._keys

    # Accounting -------------------------------------------------------------------------------------
    def set_tenant(self, tenant: Tenant) -> None:
        """Add a tenant or change its weight and quota (a long-running driver's tenants change); work
        waiting on the old quota is looked at again."""
        quotas = self.quotas.with_tenant(tenant)  # checked first: an invalid tree changes nothing
        account = self._account(tenant.name)
        account.weight, account.quota = tenant.weight, tenant.quota
        self.quotas = quotas
        self.cluster_changed()

    def charge(self, tenant: str, amounts: Mapping[str, int]) -> None:
        usage = self._account(tenant).usage
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) + amount

    def refund(self, tenant: str, amounts: Mapping[str, int]) -> None:
        usage = self._account(tenant).usage
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) - amount

    def usage(self, tenant: str) -> dict[str, int]:
        return dict(self._held(tenant))

    def _held(self, tenant: str) -> Mapping[str, int]:
        return self._usage_of(tenant) if self._usage_of is not None else self._account(tenant).usage

    def _drf_key(self, tenant: str) -> tuple[bool, float, str]:
        account = self._account(tenant)
        return account.failures >= FAILING_AFTER, self.dominant_share(tenant) / account.weight, tenant

    def dominant_share(self, tenant: str) -> float:
        """max over resources of usage / cluster capacity (pods not counted)."""
        capacity = self._capacity()
        usage = self._held(tenant)
        shares = (amount / capacity[name] for name, amount in usage.items() if name != PODS and capacity.get(name))
        return max(shares, default=0.0)

    def _over_quota(self, tenant: str, demand: Mapping[str, int]) -> bool:
        if not self.quotas.limited(tenant):
            return False
        return self._quota_check(tenant, demand) is not None

    def _quota_check(self, tenant: str, demand: Mapping[str, int]) -> str | None:
        return self.quotas.problem(tenant, demand, self._held)

    def quota_problem(self, tenant: str, demand: Mapping[str, int]) -> str:
        return self._quota_check(tenant, demand) or f"tenant {tenant} is within its quota"

    def reclaim_rule(self, tenant: str, demand: Mapping[str, int]) -> ReclaimRule | None:
        """The quota-reclaim rule for a pending workload of `tenant` (sched/elastic.py), or None."""
        return self.quotas.reclaim_rule(tenant, demand, self._held)

    def _account(self, tenant: str) -> _TenantAccount:
        account = self._accounts.get(tenant)
        if account is None:
            account = self._accounts[tenant] = _TenantAccount()
        return account
