"""Topology-aware gang placement: choose one network domain for a gang, then place it there.

A gang with `gang.topology` (model/topology.py) is placed in four steps, per decision:

1. **Members in index order**: by name, numbers compared as numbers (``w-2`` before ``w-10``), so
   consecutive ranks (which talk most) go together, slice by slice.
2. **How many members each domain holds**, with the real per-node fit: members are grouped by
   request shape; per shape one pre_filter + filter pass over all nodes (the memoized one of
   `Scheduler._evaluate`), then per node how many copies fit (`Framework.run_count`: GPU shares
   on each card, MIG, partitions, exclusive cpusets), summed up the tree with one `np.add.at` per
   level (`DomainIndex.sum`). With `slice: {size, required}` each slice-level domain holds
   ``count // size`` slices (for mixed shapes ``min_s count_s * slices // members_s``), summed up
   to the gang's level. A domain *holds* the gang when it holds every slice and, per shape, at
   least that shape's members: an upper bound the placement then verifies. (These counts, and
   the reasons a waiting gang is given, are in sched/topology_fit.py.)
3. **Which domain**: the profile's `topologyPolicy` orders the domains that hold it (`order_domains`):
   BestFit (Kueue's, the default) takes the tightest fit; KeepDomainsWhole keeps large domains
   whole for the gang sizes still to come (the formula is in `keep_whole_loss`).
4. **Placement inside it**, all or nothing: members in index order with the profile's normal
   filters and scores, restricted to the domain's nodes (with slices: each slice's consecutive
   members restricted to the slice-level sub-domain chosen for it by Kueue's descent). A member
   that does not fit undoes what the gang took there and the next domain is tried (at most
   `MAX_DOMAIN_TRIES`). A required level that no domain holds fails with a FitError naming the
   level and the closest domain's shortfall, never spilling; a preferred level tries the next
   level up, and at last anywhere.

Nothing here loops over nodes in Python: per decision it is one filter pass per member shape,
array arithmetic per level, and one restricted placement per member.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.model.topology import GangTopology, Topology
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.topology_fit import (
    Level,
    ShapeFit,
    TopologyHost,
    ancestors,
    domain_reasons,
    level_fits,
    need_of,
    shape_fits,
)
from finesched.state.topology import DomainIndex, DomainIndexCache

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Domains tried per level before the gang is reported as not placed (each try places members).
MAX_DOMAIN_TRIES = 8
#: Gang sizes remembered for KeepDomainsWhole when nothing waits in the queue.
HISTORY = 256
#: KeepDomainsWhole reads the sizes of the gangs waiting in the queue once per this many decisions.
TYPICAL_REFRESH = 64
#: The reason counted on the nodes a member could take but that lie outside its domain.
OUTSIDE_DOMAIN = "outside the gang's topology domain"
_DIGITS = re.compile(r"(\d+)")


def member_key(workload: Workload) -> tuple[object, ...]:
    """Sort key of a gang member: its name with numbers compared as numbers (w-2 before w-10)."""
    parts = _DIGITS.split(workload.name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def member_order(workloads: Sequence[Workload]) -> list[Workload]:
    """A gang's members in index order (the member index is the position)."""
    return sorted(workloads, key=member_key)


#: Places one member, only on `allowed` nodes, and returns what `undo` takes back (raises FitError).
PlaceMember = Callable[[Workload, BoolArray], object]
Undo = Callable[[object], None]


class TopologyPlacer:
    """The scheduler's topology step (module docstring); one per Scheduler."""

    def __init__(self, scheduler: TopologyHost):
        self.scheduler = scheduler
        self.indexes = DomainIndexCache()
        #: Sizes of the gangs placed so far (newest last), for KeepDomainsWhole.
        self.history: deque[int] = deque(maxlen=HISTORY)
        #: The waiting gangs' sizes as last read from the queue, and how many decisions ago.
        self._waiting_sizes: Counter[int] | None = None
        self._waiting_age = 0

    # Entry ------------------------------------------------------------------------------------------
    def domains(self, topology: Topology) -> DomainIndex:
        """The domain index of `topology` over the scheduler's state (built once per node set; the
        views of this state read it here too)."""
        return self.indexes.index(self.scheduler.state, topology)

    def resolve(self, workloads: Sequence[Workload]) -> tuple[GangTopology, Topology, DomainIndex]:
        """The gang's request, its Topology and domain index; FitError when it names an unknown
        topology or level (the gang waits: `Scheduler.set_topologies` wakes it)."""
        first = workloads[0]
        gang = first.gang
        assert gang is not None and gang.topology is not None
        ask = gang.topology
        topology = self.scheduler.topologies.get(ask.name)
        problems = ask.problems_in(topology)
        if problems or topology is None:
            text = "; ".join(f"{'.'.join(map(str, loc))}: {msg} ({value})" for loc, msg, value in problems)
            n = self.scheduler.state.n
            raise FitError(
                first.key,
                n,
                {f"topology {ask.name}: {text}": n},
                detail=f"gang {gang.name}: topology {ask.name}: {text}",
            )
        return ask, topology, self.domains(topology)

    def place(
        self, workloads: Sequence[Workload], place: PlaceMember, undo: Undo, *, evicting: bool = False
    ) -> list[object]:
        """Place the topology gang `workloads` all or nothing (module docstring); the steps `place`
        returned, in member order. `evicting`: `place` may preempt, so domains are tried even where
        the counts say the gang does not fit now (in the policy's order of what they hold)."""
        members = member_order(workloads)
        ask, topology, index = self.resolve(members)
        gang = members[0].gang
        assert gang is not None
        fits = shape_fits(self.scheduler, members, index)
        depth = topology.depth_of(ask.level)
        assert depth is not None
        slice_depth = topology.depth_of(ask.slice.required) if ask.slice is not None else None
        size = ask.slice.size if ask.slice is not None else 1
        depths = [depth] if ask.required is not None else [*range(depth, -1, -1), -1]
        tried: list[tuple[str, FitError]] = []
        for d in depths:
            level = level_fits(self.scheduler, members, fits, index, d, slice_depth, size)
            above = self._held_above(members, fits, index, d, slice_depth, size)
            order = self.order_domains(level, len(members), evicting=evicting, above=above)
            for domain in order[:MAX_DOMAIN_TRIES]:
                try:
                    steps = self._place_in(
                        members, fits, index, d, int(domain), level, slice_depth, size, place, undo, evicting
                    )
                except FitError as exc:
                    tried.append((self._name(index, d, int(domain)), exc))
                    continue
                self.history.append(len(members))
                return steps
        raise self._failure(members, ask, topology, index, fits, depth, slice_depth, size, tried)

    # Counts -----------------------------------------------------------------------------------------
    # Policies -----------------------------------------------------------------------------------------
    def order_domains(
        self, level: Level, members: int, *, evicting: bool = False, above: Sequence[IntArray] = ()
    ) -> IntArray:
        """The domains to try, best first: those that hold the gang in the profile's policy order
        (BestFit: smallest measure >= needed, then most allocated, then name; KeepDomainsWhole:
        least `keep_whole_loss` summed over the domain and its ancestors (`above`: per level above,
        the members each domain's ancestor holds), then as BestFit). `evicting`: the others follow,
        most held first."""
        ids = np.arange(len(level.holds))
        fit = ids[level.holds]
        keys = [fit, -level.allocated[fit], level.measure[fit]]
        if self.scheduler.profile.topology_policy == "KeepDomainsWhole" and len(fit) > 1:
            typical = self.typical_sizes(members)
            loss = keep_whole_loss(level.members[fit], members, typical)
            for held in above:
                loss = loss + keep_whole_loss(held[fit], members, typical)
            keys.append(loss)
        order = fit[np.lexsort(keys)]
        if evicting:
            rest = ids[~level.holds]
            order = np.concatenate([order, rest[np.lexsort([rest, -level.members[rest]])]])
        return order

    def _held_above(
        self,
        members: list[Workload],
        fits: list[ShapeFit],
        index: DomainIndex,
        depth: int,
        slice_depth: int | None,
        size: int,
    ) -> list[IntArray]:
        """For KeepDomainsWhole: per level above `depth`, the members the ancestor of each domain of
        `depth` holds, so a rack is judged with its block (a gang taken from a block that is whole
        for the large gangs costs more than from a block that is broken already)."""
        if self.scheduler.profile.topology_policy != "KeepDomainsWhole" or depth <= 0:
            return []
        out = []
        for up in range(depth):
            held = level_fits(self.scheduler, members, fits, index, up, slice_depth, size).members
            out.append(held[ancestors(index, depth, up)])
        return out

    def typical_sizes(self, own: int) -> dict[int, int]:
        """Gang sizes (members) -> weight: those still waiting in the queue, else the ones placed
        so far (the last `HISTORY`), else the gang's own size.

        Reading the queue's waiting gangs walks the whole queue, so it is done once every
        `TYPICAL_REFRESH` decisions that need it, not on each: one tenant's flood of queued work
        must not make every other gang's decision as slow as the flood is long."""
        if self._waiting_sizes is None or self._waiting_age >= TYPICAL_REFRESH:
            self._waiting_sizes = Counter(
                len(unit.workloads)
                for unit, why in self.scheduler.queue.waiting()
                if why != "gang" and unit.workloads[0].gang is not None
            )
            self._waiting_age = 0
        self._waiting_age += 1
        waiting = self._waiting_sizes
        if waiting:
            return dict(waiting)
        if self.history:
            return dict(Counter(self.history))
        return {own: 1}

    # Placement --------------------------------------------------------------------------------------
    def _place_in(
        self,
        members: list[Workload],
        fits: list[ShapeFit],
        index: DomainIndex,
        depth: int,
        domain: int,
        level: Level,
        slice_depth: int | None,
        size: int,
        place: PlaceMember,
        undo: Undo,
        evicting: bool = False,
    ) -> list[object]:
        """All members inside `domain` of `depth` (slices in their sub-domains), or none (FitError).

        Without slices, consecutive members are first offered the same finest-level domain (a host
        with `kubernetes.io/hostname` last): Kueue's descent assigns the members, in index order, to
        the finest domains that hold the most of them, so ranks that talk most share a node and the
        gang uses as few nodes as it can. That is a preference: a member the assigned domain cannot
        take (counts are upper bounds where a plugin's are) goes anywhere in the gang's domain. Not
        while evicting, where a narrower offer could evict for nothing."""
        state = self.scheduler.state
        whole = np.ones(state.n, dtype=bool) if depth < 0 else self._mask(index, depth, domain)
        near: list[BoolArray | None] = [None] * len(members)
        if slice_depth is None:
            masks = [whole] * len(members)
            finest = len(index.topology.levels) - 1
            if finest > depth and not evicting:
                try:
                    subs = self._slice_domains(members, fits, index, depth, domain, finest, 1)
                    near = [self._mask(index, finest, sub) for sub in subs]
                except FitError:
                    pass  # the finest domains' counts do not add up: no preference
        else:
            subs = self._slice_domains(members, fits, index, depth, domain, slice_depth, size, evicting)
            masks = [self._mask(index, slice_depth, subs[i // size]) for i in range(len(members))]
        steps: list[object] = []
        try:
            for workload, mask, offer in zip(members, masks, near, strict=True):
                if offer is not None:
                    try:
                        steps.append(place(workload, offer))
                        continue
                    except FitError:
                        pass  # the assigned finest domain cannot take it: anywhere in the domain
                steps.append(place(workload, mask))
        except (FitError, ValidationError):
            for step in reversed(steps):
                undo(step)
            raise
        return steps

    def _mask(self, index: DomainIndex, depth: int, domain: int) -> BoolArray:
        """[state.n] the nodes of `domain` of `depth` (the index covers the state's nodes)."""
        mask = np.zeros(self.scheduler.state.n, dtype=bool)
        mask[: index.n] = index.ids[depth] == domain
        return mask

    def _slice_domains(
        self,
        members: list[Workload],
        fits: list[ShapeFit],
        index: DomainIndex,
        depth: int,
        domain: int,
        slice_depth: int,
        size: int,
        evicting: bool = False,
    ) -> list[int]:
        """The slice-level domain of each slice, in slice order (Kueue's descent): the sub-domains of
        `domain` sorted by slices held (most first, then fewest members, then name), filled greedily,
        the last one the tightest that holds what is left; FitError when they hold too few slices.
        `evicting`: slices the sub-domains do not hold now each go to one more sub-domain of
        `domain` (by name), where evicting lower-priority work may make room."""
        m = len(members)
        slices = m // size
        need = np.array([len(f.members) for f in fits], dtype=np.int64)
        counts = np.stack([index.sum(f.count, slice_depth) for f in fits])  # [S, sub-domains]
        caps = (counts * slices // need[:, None]).min(axis=0)
        held = (counts * m // need[:, None]).min(axis=0)
        anc = ancestors(index, slice_depth, depth)
        ours = anc == (0 if depth < 0 else domain)
        subs = np.flatnonzero(ours & (caps > 0))
        subs = subs[np.lexsort([subs, held[subs], -caps[subs]])]  # most slices, then fewest members, name
        out: list[int] = []
        left = slices
        pool = [int(x) for x in subs]
        while left > 0 and pool:
            head = pool[0]
            if caps[head] >= left:  # the last one: the tightest that holds what is left
                tight = min((x for x in pool if caps[x] >= left), key=lambda x: (caps[x], held[x], x))
                out += [tight] * left
                left = 0
                break
            out += [head] * int(caps[head])
            left -= int(caps[head])
            pool.pop(0)
        if left > 0 and evicting:
            spare = [int(x) for x in np.flatnonzero(ours & (caps == 0))][:left]
            out += spare
            left -= len(spare)
        if left > 0:
            first = members[0]
            n = self.scheduler.state.n
            raise FitError(
                first.key,
                n,
                {},
                detail=f"its {index.topology.labels[slice_depth]} domains hold {slices - left} of {slices} slices",
            )
        return out

    # Failure ------------------------------------------------------------------------------------------
    def _name(self, index: DomainIndex, depth: int, domain: int) -> str:
        return "the whole cluster" if depth < 0 else index.name(depth, domain)

    def _failure(
        self,
        members: list[Workload],
        ask: GangTopology,
        topology: Topology,
        index: DomainIndex,
        fits: list[ShapeFit],
        depth: int,
        slice_depth: int | None,
        size: int,
        tried: list[tuple[str, FitError]],
    ) -> FitError:
        """The FitError of a gang no tried domain took (required: names the closest domain's shortfall)."""
        gang = members[0].gang
        assert gang is not None
        n = self.scheduler.state.n
        label = topology.labels[depth]
        head = f"gang {gang.name}: topology {topology.name}"
        if tried:
            name, exc = tried[-1] if ask.required is None else tried[0]
            more = f" (at most {MAX_DOMAIN_TRIES} per level)" if len(tried) >= MAX_DOMAIN_TRIES else ""
            detail = (
                f"{head}: placing failed in {len(tried)} domain(s) tried{more}; in {name}: {exc.message}; none placed"
            )
            return FitError(members[0].key, n, exc.reasons, detail=detail)
        if index.count(depth) == 0:
            detail = f"{head}: no node has the level's label {label}; none placed"
            return FitError(members[0].key, n, {f"no {label} label": n}, detail=detail)
        level = level_fits(self.scheduler, members, fits, index, depth, slice_depth, size)
        best = int(np.lexsort([np.arange(len(level.measure)), -level.measure])[0])
        m = len(members)
        held = int(level.members[best])
        if slice_depth is not None:
            what = f"{int(level.measure[best])} of {m // size} slices of {size} ({topology.labels[slice_depth]})"
        else:
            what = f"{held} of {m} members"
        reasons = domain_reasons(self.scheduler, fits, index, self._mask(index, depth, best))
        need = ", ".join(need_of(r) for r, _ in reasons.most_common(3))
        if not need:
            need = f"room for {size} on one {topology.labels[slice_depth]}" if slice_depth is not None else "room"
        short = max(m - held, 1)
        detail = f"{head}: best {label} {index.name(depth, best)} holds {what}: {short} need {need}"
        return FitError(
            members[0].key, n, dict(reasons) or {f"{label} {index.name(depth, best)} full": n}, detail=detail
        )


def keep_whole_loss(held: IntArray, members: int, typical: dict[int, int]) -> IntArray:
    """KeepDomainsWhole's score of each candidate domain (lower is better): how many of the
    typical gangs the domain could hold before minus after taking this gang (FGD one level up).

    With ``c_j`` the members domain j holds (of this gang's shape) and typical sizes ``s_k`` of
    weight ``w_k``:  ``loss_j = sum_k w_k * (floor(c_j / s_k) - floor(max(c_j - m, 0) / s_k))``,
    where ``m`` is this gang's size. Vectorized over domains and sizes ([D, K]).
    """
    sizes = np.array(list(typical), dtype=np.int64)
    weights = np.array(list(typical.values()), dtype=np.int64)
    before = held[:, None] // sizes[None, :]
    after = np.maximum(held - members, 0)[:, None] // sizes[None, :]
    return ((before - after) * weights[None, :]).sum(axis=1)
