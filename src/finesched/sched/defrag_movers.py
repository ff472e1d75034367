"""Who the defragmenter may move, and where moving them could make room (cheap, numpy).

Movers are bound workloads that opted in (`Scheduler.movable`), committed (a binding still in
flight is not moved under its driver), never a gang member, never qos LSE/LSR, never holding a
cpuset, never within their cool-down (`Defragmenter.refusal`). Which *sets* of movers may move
together is decided by `MoveRules` (disruption budgets, per-tenant budget).

`Need` is what the waiting workload asks, split into state rows (scalar amounts) and device
dimensions with a per-card estimate; `NodeEstimate` says what a node lacks of it and what its
movers could give back. The estimate only ranks and prunes: the exact answer is always the
profile's own filters and reserve (sched/defrag_trial.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.resources import GPU_CORE, device_dimension, translate_gpu_shortcuts
from finesched.model.workload import EXCLUSIVE_QOS, Workload
from finesched.sched.defrag import Defragmenter
from finesched.sched.preempt import INDEX_NAME
from finesched.sched.request import ScheduleRequest
from finesched.state.devices import device_types

if TYPE_CHECKING:
    from finesched.state.cluster import ClusterState

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Mover:
    """A bound workload the defragmenter may move (every per-workload rule passed)."""

    key: str
    workload: Workload
    binding: Binding
    #: State row -> amount it holds (scalar requests).
    rows: dict[int, int]
    #: (device type, slot, dimension) -> amount it holds on that card.
    cards: dict[tuple[str, int, str], int]

    @property
    def priority(self) -> int:
        return self.binding.priority

    @property
    def size(self) -> int:
        """For ordering re-placements: the biggest first (GPU share first, then CPU)."""
        gpu = sum(a for (_, _, dim), a in self.cards.items() if dim == GPU_CORE)
        return gpu * 10**12 + sum(self.rows.values()) // 1000


def mover_refusal(sched: Any, binding: Binding, defragmenter: Defragmenter, now: float) -> str | None:
    """Why the bound workload of `binding` may not move (None: it may)."""
    key = binding.workload
    workload = sched.movable.get(key)
    if workload is None:
        return "it did not opt in (spec.migration)"
    if not sched.state.is_committed(key):
        return "its binding is still in flight"
    if workload.gang is not None:
        return "it is a gang member"
    if binding.qos in EXCLUSIVE_QOS:
        return f"its qos is {binding.qos}"
    if binding.cpuset:
        return "it holds a cpuset"
    return defragmenter.refusal(key, now)


@dataclass
class Need:
    """What the waiting workload asks: scalar rows, device dimensions, and a per-card estimate."""

    #: State row -> amount (pods included).
    rows: dict[int, int]
    #: Device type -> dimension -> total amount asked.
    devices: dict[str, dict[str, int]]
    #: Device type -> (cards, per-card amount per dimension): an estimate of the allocator's rule.
    per_card: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)


def need_of(state: ClusterState, request: ScheduleRequest) -> Need:
    """The waiting workload's request in state coordinates (devices by the device accounts' dims)."""
    rows = {int(r): int(a) for r, a in request.pairs}
    types = device_types(state)
    devices: dict[str, dict[str, int]] = {}
    for name, amount in translate_gpu_shortcuts(request.workload.requests).items():
        if amount <= 0 or name in request.scalar:
            continue
        dim = device_dimension(name)
        for kind, acc in types.items():
            if dim in acc.dim_index:
                devices.setdefault(kind, {})[dim] = amount
                break
    need = Need(rows, devices)
    for kind, dims in devices.items():
        core = dims.get(GPU_CORE, 0)
        cards = core // 100 if core >= 100 else 1  # whole cards: 100 gpu-core each
        need.per_card[kind] = (cards, {d: a // cards for d, a in dims.items()})
    return need


def shortfall(state: ClusterState, need: Need) -> str | None:
    """Why the cluster as a whole has too little idle capacity for the workload (None: enough)."""
    n = state.n
    free = state.free
    for r, amount in need.rows.items():
        total = int(free[r, :n].sum())
        if total < amount:
            return f"the cluster's free {state.resources[r]} is {total}, the workload needs {amount}"
    types = device_types(state)
    for kind, dims in need.devices.items():
        acc = types[kind]
        for dim, amount in dims.items():
            total = int(acc.hfree[acc.dim_index[dim], :n].sum())
            if total < amount:
                return f"the cluster's free {dim} is {total}, the workload needs {amount}"
    return None


def lack_scores(state: ClusterState, need: Need) -> tuple[Int64Array, npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Per node: how many requested resources it lacks, the fraction of the request it lacks
    (summed over resources), and whether everything held there could cover it (an upper bound)."""
    n = state.n
    count = np.zeros(n, dtype=np.int64)
    frac = np.zeros(n, dtype=np.float64)
    possible = np.ones(n, dtype=bool)
    free, alloc = state.free, state.allocatable
    for r, amount in need.rows.items():
        lack = np.maximum(0, amount - free[r, :n])
        count += lack > 0
        frac += lack / max(amount, 1)
        possible &= alloc[r, :n] >= amount
    types = device_types(state)
    for kind, (cards, per_card) in need.per_card.items():
        acc = types[kind]
        dmax = acc.free.shape[2]
        fits_free = acc.healthy[:n, :dmax].copy()
        fits_total = fits_free.copy()
        for dim, amount in per_card.items():
            k = acc.dim_index[dim]
            fits_free &= acc.free[k, :n, :] >= amount
            fits_total &= acc.total[k, :n, :] >= amount
        short = np.maximum(0, cards - fits_free.sum(axis=1))
        count += short > 0
        frac += short / cards
        possible &= fits_total.sum(axis=1) >= cards
    return count, frac, possible


def movers_on(
    sched: Any, node: int, defragmenter: Defragmenter, now: float, exclude: str
) -> tuple[list[Mover], Counter[str]]:
    """The movers bound on `node`, and a count of why the others may not move."""
    state = sched.state
    types = device_types(state)
    out: list[Mover] = []
    refused: Counter[str] = Counter()
    for binding in state.bindings_on(state.names[node]):
        if binding.workload == exclude:
            continue
        why = mover_refusal(sched, binding, defragmenter, now)
        if why is not None:
            refused[why] += 1
            continue
        rows = {state.res_index[nm]: a for nm, a in binding.requests.items() if nm in state.res_index and a}
        cards: dict[tuple[str, int, str], int] = {}
        for kind, grants in binding.devices.items():
            acc = types.get(kind)
            if acc is None:
                continue
            minors = acc.minor[node].tolist()
            for grant in grants:
                if grant.minor not in minors:
                    continue
                slot = minors.index(grant.minor)
                for name, amount in grant.resources.items():
                    dim = device_dimension(name)
                    cards[(kind, slot, dim)] = cards.get((kind, slot, dim), 0) + amount
        out.append(Mover(binding.workload, sched.movable[binding.workload], binding, rows, cards))
    return out, refused


class MoveRules:
    """Which sets of movers may move together: disruption budgets and the per-tenant budget."""

    def __init__(self, sched: Any, defragmenter: Defragmenter, now: float):
        self.defragmenter = defragmenter
        self.now = now
        self._tenant_left: dict[str, int] = {}
        self.groups = budget_groups(sched)

    def tenant_left(self, tenant: str) -> int:
        left = self._tenant_left.get(tenant)
        if left is None:
            left = self._tenant_left[tenant] = self.defragmenter.tenant_moves_left(tenant, self.now)
        return left

    def refusal(self, movers: Sequence[Mover]) -> str | None:
        """Why these movers may not all move now (None: they may)."""
        tenants = Counter(m.binding.tenant for m in movers)
        for tenant, count in tenants.items():
            if count > self.tenant_left(tenant):
                return f"tenant {tenant or '-'}'s budget of moves per minute is spent"
        keys = {m.key for m in movers}
        for min_available, members in self.groups:
            moved = len(keys & members)
            if moved and len(members) - moved < min_available:
                return f"a disruption budget keeps {min_available} of {len(members)} bound"
        return None


def budget_groups(sched: Any) -> list[tuple[int, set[str]]]:
    """(minAvailable, bound keys) of every disruption budget: the preemption plugin's record when the
    profile has it, else the movable workloads' own budgets over the movable workloads."""
    state = sched.state
    index = state.extras.get(INDEX_NAME)
    if index is not None:
        return [(b.min_available, keys) for b, keys in index.budget_groups()]
    movable = {k: w for k, w in sched.movable.items() if k in state.bindings}
    groups = []
    for key, w in movable.items():
        budget = w.disruption_budget
        if budget is None:
            continue
        if budget.selector:
            members = {
                k
                for k, m in movable.items()
                if m.namespace == w.namespace and all(m.labels.get(a) == b for a, b in budget.selector.items())
            }
        else:
            members = {key}
        groups.append((budget.min_available, members))
    return groups


def describe(binding: Binding) -> str:
    """`n1 (GPU 0)`: a binding's node and cards, for reasons."""
    cards = [f"{kind.upper()} {','.join(str(m) for m in binding.device_minors(kind))}" for kind in binding.devices]
    return f"{binding.node} ({'; '.join(cards)})" if cards else binding.node


def same_place(a: Binding, b: Binding) -> bool:
    """Whether two bindings of one workload hold exactly the same things (a move to it is no move)."""
    return a.node == b.node and a.devices == b.devices and a.cpuset == b.cpuset and a.numa == b.numa


def lacks_text(state: ClusterState, need: Need, node: int) -> list[str]:
    """What `node` lacks of the request, in words."""
    out = []
    for r, amount in need.rows.items():
        free = int(state.free[r, node])
        if free < amount:
            out.append(f"{state.resources[r]} {amount} ({free} free)")
    for kind, (cards, per_card) in need.per_card.items():
        have = roomy_cards(state, kind, per_card, node)
        if have < cards:
            amounts = ", ".join(f"{a} {d}" for d, a in per_card.items())
            out.append(f"{cards} {kind} card(s) with {amounts} free ({have} such)")
    return out


def keys_of(movers: Iterable[Mover]) -> list[str]:
    return [m.key for m in movers]


def cards_free(state: ClusterState, need: Need, node: int) -> bool:
    """Whether `node` already has enough cards with the per-card amounts free (scalars aside)."""
    return all(roomy_cards(state, kind, per_card, node) >= cards for kind, (cards, per_card) in need.per_card.items())


def roomy_cards(state: ClusterState, kind: str, per_card: Mapping[str, int], node: int) -> int:
    """How many healthy `kind` cards of `node` have every per-card amount free."""
    acc = device_types(state)[kind]
    ok = acc.healthy[node].copy()
    for dim, amount in per_card.items():
        ok &= acc.free[acc.dim_index[dim], node, :] >= amount
    return int(ok.sum())


def useful_movers(state: ClusterState, need: Need, node: int, movers: list[Mover], limit: int) -> list[Mover]:
    """The movers on `node` holding something `need` lacks there, at most `limit`: lowest priority
    first, then the most useful (largest share of the lack; a card counts only where the node lacks
    free cards), then those holding no card where only scalar rows are lacking (a CPU-only workload
    goes to a CPU-only node; a GPU holder needs a card elsewhere)."""
    lack_rows = {r: a - int(state.free[r, node]) for r, a in need.rows.items() if int(state.free[r, node]) < a}
    kinds = set() if cards_free(state, need, node) else set(need.per_card)
    best = _nearest_cards(state, need, node, movers) if kinds else {}

    def use(m: Mover) -> float:
        gain = sum(min(m.rows.get(r, 0), lack) / lack for r, lack in lack_rows.items())
        slots = {(kind, slot) for (kind, slot, _) in m.cards if kind in kinds}
        return gain + sum(10.0 if slot in best.get(kind, ()) else 1.0 for kind, slot in slots)

    scored = [(m, use(m)) for m in movers]
    scored = [(m, u) for m, u in scored if u > 0]
    scored.sort(key=lambda mu: (mu[0].priority, bool(mu[0].cards) and not kinds, -mu[1], mu[0].key))
    return [m for m, _ in scored[:limit]]


def _nearest_cards(state: ClusterState, need: Need, node: int, movers: list[Mover]) -> dict[str, set[int]]:
    """Per device type, the cards of `node` that would hold the per-card request once their movable
    holders leave, the fewest holders first (as many as the request needs cards): a card's holders
    come first, rather than shares scattered over several cards that free none."""
    types = device_types(state)
    out: dict[str, set[int]] = {}
    for kind, (cards, per_card) in need.per_card.items():
        acc = types[kind]
        slots = acc.free.shape[2]
        holders: list[list[Mover]] = [[] for _ in range(slots)]
        for m in movers:
            for slot in {slot for (k, slot, _) in m.cards if k == kind}:
                holders[slot].append(m)
        fitting = []
        for slot in range(slots):
            if not acc.healthy[node, slot]:
                continue
            held = {dim: sum(m.cards.get((kind, slot, dim), 0) for m in holders[slot]) for dim in per_card}
            ok = all(int(acc.free[acc.dim_index[d], node, slot]) + held[d] >= a for d, a in per_card.items())
            if ok:
                fitting.append((len(holders[slot]), slot))
        out[kind] = {slot for _, slot in sorted(fitting)[:cards]}
    return out


def covers(state: ClusterState, need: Need, node: int, movers: Sequence[Mover]) -> bool:
    """Cheap check: with `movers` gone, every requested row and enough cards would be free."""
    free = state.free
    for r, amount in need.rows.items():
        have = int(free[r, node])
        if have < amount and have + sum(m.rows.get(r, 0) for m in movers) < amount:
            return False
    if not need.per_card:
        return True
    types = device_types(state)
    for kind, (cards, per_card) in need.per_card.items():
        acc = types[kind]
        ok = acc.healthy[node].copy()
        for dim, amount in per_card.items():
            k = acc.dim_index[dim]
            card_free = acc.free[k, node, :].copy()
            for m in movers:
                for (mk, slot, mdim), a in m.cards.items():
                    if mk == kind and mdim == dim:
                        card_free[slot] += a
            ok &= card_free >= amount
        if int(ok.sum()) < cards:
            return False
    return True


def greedy_count(state: ClusterState, need: Need, node: int, useful: Sequence[Mover]) -> int | None:
    """How many of `useful` (in order) a greedy takes before `covers` passes (None: never)."""
    for k in range(1, len(useful) + 1):
        if covers(state, need, node, useful[:k]):
            return k
    return None


def fits_now(state: ClusterState, need: Need) -> npt.NDArray[np.bool_]:
    """Per node: every requested row and enough cards are free as things stand (cheap, numpy)."""
    n = state.n
    ok = np.ones(n, dtype=bool)
    free = state.free
    for r, amount in need.rows.items():
        ok &= free[r, :n] >= amount
    types = device_types(state)
    for kind, (cards, per_card) in need.per_card.items():
        acc = types[kind]
        fits = acc.healthy[:n, : acc.free.shape[2]].copy()
        for dim, amount in per_card.items():
            fits &= acc.free[acc.dim_index[dim], :n, :] >= amount
        ok &= fits.sum(axis=1) >= cards
    return ok
