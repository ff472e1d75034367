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
3. FIFO within the tenant: the order of placement among the units its quota admits now.

A unit its tenant's quota does not admit now (hard `quota`, elastic `max` of the tenant or an
ancestor: sched/elastic.py) is set aside, waiting (it does not fail), and the tenant's next unit
is looked at: no unit holds its tenant's others behind it (Kueue's BestEffortFIFO). Units set
aside wait per shape (priority and demand): when capacity is given back or a tenant changes, the
first unit of each shape is checked again and, if admitted, goes back to the front of its
tenant's line; each unit of a shape that is taken lets the next one of its shape follow. A unit
that no release could ever admit (its demand alone over a cap) waits there too, with that reason.
Unschedulable workloads back off (1 s doubling to 10 s, as kube-scheduler) and return when the
cluster's capacity changes. Gang members wait until `minMember` of them are queued, then travel
as one unit.

Cost per pop is O(priorities + tenants), independent of how many workloads are queued (each unit
set aside is moved once; re-checking the set-aside work costs one quota check per shape). Where a
queued workload stands (`reason`) is O(priorities): a line's units carry consecutive tickets.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    #: Where it waits (READY, QUOTA, BACKOFF, PARKED) or TAKEN (handed out by `pop`).
    where: str = ""
    #: The priority line it was put in (its priority then: a gang's may drop as members are deleted).
    lane: int = 0
    #: Consecutive within its line: how many units are ahead of it is its ticket minus the first's.
    ticket: int = 0

    @property
    def tenant(self) -> str:
        return self.workloads[0].tenant

    @property
    def priority(self) -> int:
        return max(w.priority for w in self.workloads)

    @cached_property
    def demand(self) -> dict[str, int]:
        """What the unit will hold once placed (its workloads are fixed: computed once)."""
        return group_demand(self.workloads)


READY, QUOTA, BACKOFF, PARKED, TAKEN = "ready", "quota", "backoff", "parked", "taken"


def gang_reason(members: list[Workload]) -> str:
    """Why the members of an incomplete gang wait."""
    gang = members[0].gang
    name, needed = (gang.name, gang.min_member) if gang is not None else ("?", "?")
    return f"waiting: gang {name} has {len(members)}/{needed} members"


def demand_of(workload: Workload) -> dict[str, int]:
    """What a workload will hold, in the names quotas and DRF count (GPU shortcuts translated)."""
    return translate_gpu_shortcuts(workload.requests)


def group_demand(workloads: Iterable[Workload]) -> dict[str, int]:
    """What `workloads` will hold together once placed."""
    total: dict[str, int] = {}
    for w in workloads:
        for name, amount in demand_of(w).items():
            total[name] = total.get(name, 0) + amount
    return total


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
        #: Units their quota does not admit now: tenant -> (lane, demand) -> units, oldest first.
        self._aside: dict[str, dict[tuple[int, tuple[tuple[str, int], ...]], deque[QueuedUnit]]] = {}
        #: Whether what tenants hold (or their quotas) may have changed since `_aside` was checked.
        self._recheck = False
        #: Every queued workload: its unit, or the members so far of its incomplete gang.
        self._keys: dict[str, QueuedUnit | list[Workload]] = {}

    # Input ---------------------------------------------------------------------------------------------
    def push(self, workload: Workload) -> None:
        """Queue a workload (gang members are held until the gang is complete)."""
        if workload.key in self._keys:
            raise ValueError(f"workload {workload.key} is already queued")
        gang = workload.gang
        if gang is None:
            self._keys[workload.key] = self._new_unit([workload])
            return
        gang_key = f"{workload.namespace}/{gang.name}"
        members = self._gangs.setdefault(gang_key, [])
        members.append(workload)
        self._keys[workload.key] = members
        if len(members) >= gang.min_member:
            del self._gangs[gang_key]
            unit = self._new_unit(members)
            for member in members:
                self._keys[member.key] = unit

    def _new_unit(self, workloads: list[Workload]) -> QueuedUnit:
        unit = QueuedUnit(workloads, next(self._seq))
        unit.lane = unit.priority
        self._activate(unit)
        return unit

    def _activate(self, unit: QueuedUnit) -> None:
        """Put `unit` at the back of its tenant's line."""
        line = self._active.setdefault(unit.lane, {}).setdefault(unit.tenant, deque())
        unit.ticket = line[-1].ticket + 1 if line else 0
        unit.where = READY
        line.append(unit)

    def _activate_front(self, unit: QueuedUnit) -> None:
        """Put `unit` at the front of its tenant's line (set-aside work older than the line's)."""
        line = self._active.setdefault(unit.lane, {}).setdefault(unit.tenant, deque())
        unit.ticket = line[0].ticket - 1 if line else 0
        unit.where = READY
        line.appendleft(unit)

    # Output ------------------------------------------------------------------------------------------------
    def pop(self) -> QueuedUnit | None:
        """The next unit to schedule, or None when nothing is ready (empty, backing off, or over quota)."""
        self._release_backoff(self._clock())
        if self._recheck:
            self._recheck = False
            self._release_aside()
        quotas_empty = self.quotas.empty
        for priority in sorted(self._active, reverse=True):
            tenants = self._active[priority]
            order = list(tenants) if len(tenants) == 1 else sorted(tenants, key=self._drf_key)
            for tenant in order:
                line = tenants[tenant]
                limited = not quotas_empty and self.quotas.limited(tenant)
                while line:
                    unit = line.popleft()
                    if limited and self._quota_check(tenant, unit.demand) is not None:
                        self._hold(unit)  # waits aside: the tenant's next unit is looked at
                        continue
                    if self._aside:
                        self._follow(unit)
                    if not line:
                        del tenants[tenant]
                    if not tenants:
                        del self._active[priority]
                    unit.where = TAKEN
                    return unit
                del tenants[tenant]
                if not tenants:
                    del self._active[priority]
        return None

    # Set aside by quota ------------------------------------------------------------------------------
    @staticmethod
    def _shape(unit: QueuedUnit) -> tuple[int, tuple[tuple[str, int], ...]]:
        return unit.lane, tuple(sorted(unit.demand.items()))

    def _hold(self, unit: QueuedUnit) -> None:
        """Set `unit` aside until its quota may admit it (its shape's units stay oldest first)."""
        unit.where = QUOTA
        units = self._aside.setdefault(unit.tenant, {}).setdefault(self._shape(unit), deque())
        if units and unit.seq < units[0].seq:
            units.appendleft(unit)  # let out first, and still not admitted
        else:
            units.append(unit)

    def _release_aside(self) -> None:
        """Let the first unit of each set-aside shape that its quota admits now back to the front of
        its tenant's line (in order of arrival); the rest of its shape follows it (`_follow`)."""
        for tenant in list(self._aside):
            shapes = self._aside[tenant]
            released = []
            for shape in list(shapes):
                units = shapes[shape]
                if self._quota_check(tenant, units[0].demand) is None:
                    released.append(units.popleft())
                    if not units:
                        del shapes[shape]
            for unit in sorted(released, key=lambda u: u.seq, reverse=True):
                self._activate_front(unit)
            if not shapes:
                del self._aside[tenant]

    def _follow(self, taken: QueuedUnit) -> None:
        """`taken` passed its quota: the next set-aside unit of its shape may pass too, so it goes to
        the front of the line (checked when popped; set aside again if not admitted)."""
        shapes = self._aside.get(taken.tenant)
        if not shapes:
            return
        shape = self._shape(taken)
        units = shapes.get(shape)
        if not units:
            return
        self._activate_front(units.popleft())
        if not units:
            del shapes[shape]
            if not shapes:
                del self._aside[taken.tenant]

    def done(self, unit: QueuedUnit) -> None:
        """The unit was placed; forget its keys (usage is charged separately, per binding)."""
        for w in unit.workloads:
            self._keys.pop(w.key, None)
        self._account(unit.tenant).failures = 0

    def park(self, unit: QueuedUnit, error: FitError) -> None:
        """The unit fits nowhere now: wait for a cluster change, then retry after backoff."""
        unit.attempts += 1
        unit.last_error = error.detached()  # its frames are not kept with it
        unit.where = PARKED
        self._unschedulable.append(unit)
        self._account(unit.tenant).failures += 1

    def cluster_changed(self) -> None:
        """Capacity may have grown: parked units become ready after their backoff."""
        now = self._clock()
        for unit in self._unschedulable:
            doublings = min(unit.attempts - 1, 16)  # the cap is reached long before; no float overflow
            unit.not_before = now + min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2**doublings)
            unit.where = BACKOFF
            self._backoff.append(unit)
        self._unschedulable.clear()
        self._recheck = True  # what was given back may be what a set-aside unit's quota waits for

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
        """Units still not placed, with why: "unschedulable", "quota" (set aside by its quota),
        "queued" (in its tenant's line, not decided yet) or "gang" (incomplete)."""
        out: list[tuple[QueuedUnit, str]] = []
        out += [(u, "unschedulable") for u in self._unschedulable + self._backoff]
        out += [(u, "quota") for shapes in self._aside.values() for units in shapes.values() for u in units]
        for tenants in self._active.values():
            out += [(u, "queued") for units in tenants.values() for u in units]
        out += [(QueuedUnit(ws, -1), "gang") for ws in self._gangs.values()]
        return sorted(out, key=lambda pair: pair[0].seq)

    def has_ready(self) -> bool:
        """Whether a unit waits in a line now (the next `pop` has something to look at)."""
        return bool(self._active)

    # Why a workload waits --------------------------------------------------------------------------
    def reason(self, key: str) -> str | None:
        """Why queued workload `key` waits, from where it is now (None: not queued). O(priorities):
        for one not decided yet, "queued: N ahead of it in tenant T" counts the units before it in
        its tenant's lines (its own line's, by ticket, and those of higher priorities)."""
        entry = self._keys.get(key)
        if entry is None:
            return None
        if isinstance(entry, list):
            return gang_reason(entry)
        return self.unit_reason(entry)

    def unit_reason(self, unit: QueuedUnit) -> str:
        """Why `unit` waits (see `reason`)."""
        if unit.where == READY:
            tenant = unit.tenant
            line = self._active[unit.lane][tenant]
            ahead = unit.ticket - line[0].ticket
            ahead += sum(len(ts[tenant]) for p, ts in self._active.items() if p > unit.lane and tenant in ts)
            return f"queued: {ahead} ahead of it in tenant {tenant}"
        if unit.where == QUOTA:
            return f"waiting: {self.quota_problem(unit.tenant, unit.demand)}"
        if unit.where in (PARKED, BACKOFF) and unit.last_error is not None:
            return unit.last_error.message
        return "being scheduled"

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
                tenants[tenant] = line = deque(u for u in tenants[tenant] if keep(u))
                for ticket, unit in enumerate(line):  # consecutive again (`unit_reason` counts on it)
                    unit.ticket = ticket
                if not tenants[tenant]:
                    del tenants[tenant]
            if not tenants:
                del self._active[priority]
        aside, self._aside = self._aside, {}
        for shapes in aside.values():
            for units in shapes.values():
                for unit in units:
                    if keep(unit):
                        self._hold(unit)  # under its shape now (a gang's demand shrinks with its members)
        self._backoff = [u for u in self._backoff if keep(u)]
        self._unschedulable = [u for u in self._unschedulable if keep(u)]
        for gang_key in list(self._gangs):
            members = self._gangs[gang_key]
            members[:] = [w for w in members if w.key not in gone]  # in place: the keys of the rest point here
            if not members:
                del self._gangs[gang_key]
        # A new table rather than deletions: a dict never shrinks its table as keys leave, so the one
        # that held a flood of keys would keep its size after they were deleted. The pass is O(queue) anyway.
        self._keys = {key: entry for key, entry in self._keys.items() if key not in gone}
        self._recheck = True
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
        self.cluster_changed()  # also re-checks the units set aside by quota

    def charge(self, tenant: str, amounts: Mapping[str, int]) -> None:
        usage = self._account(tenant).usage
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) + amount

    def refund(self, tenant: str, amounts: Mapping[str, int]) -> None:
        usage = self._account(tenant).usage
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) - amount
        self._recheck = True

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

    def _quota_check(self, tenant: str, demand: Mapping[str, int]) -> str | None:
        return self.quotas.problem(tenant, demand, self._held)

    def group_quota_problem(self, workloads: Sequence[Workload]) -> str | None:
        """Why the quota of their tenant does not admit `workloads` placed together now, or None.

        For a driver that places a group at once (a Job's slots) without passing through the queue:
        it holds them to the same caps the queue holds every unit to."""
        tenant = workloads[0].tenant
        if not self.quotas.limited(tenant):
            return None
        return self._quota_check(tenant, group_demand(workloads))

    def quota_problem(self, tenant: str, demand: Mapping[str, int]) -> str:
        """Why `demand` of `tenant` waits for its quota: what no release can ever admit (a cap below
        the demand alone: until an admin raises it), else what is held now, else that it is within."""
        never = self.quotas.never_admits(tenant, demand)
        if never is not None:
            return f"{never}: no release admits it; it waits until the cap is raised"
        return self._quota_check(tenant, demand) or f"tenant {tenant} is within its quota"

    def reclaim_rule(self, tenant: str, demand: Mapping[str, int]) -> ReclaimRule | None:
        """The quota-reclaim rule for a pending workload of `tenant` (sched/elastic.py), or None."""
        return self.quotas.reclaim_rule(tenant, demand, self._held)

    def _account(self, tenant: str) -> _TenantAccount:
        account = self._accounts.get(tenant)
        if account is None:
            account = self._accounts[tenant] = _TenantAccount()
        return account
