"""MIG instances for DeviceShare: the request, the filter over many nodes, and the exact choice of
card *and* placement on one node (state/mig_slices.py keeps the slice counters).

A workload asks ``nvidia.com/mig-<profile>: N`` (one or more profiles). The filter passes a node
when, for every profile, its cards can give N instances at once (`MIGSlices.fit`, exact for one
profile; with several profiles on one node the exact search decides, per node).

**Choice** (`choose_mig`): instances are placed largest profile first; each goes to the grantable
placement (an unheld existing instance, or on a dynamic card a new placement) whose *loss* is
smallest, in the spirit of FGD (../shared/reference/FGD-PROTOCOL.md) over MIG profiles: the loss of
placing on card c is the drop in how many instances of each of c's profiles stay placeable,
compared largest profile first (so a choice that keeps a 7g, then a 4g, then a 3g placeable wins);
ties go to the fuller card (fewer free slices), then to an existing instance over a new one, then
to the lowest minor and start. A later instance that no longer fits backtracks (bounded search).
`first_fit=True` is DRA's rule (first device in slice order, MIG.md §5): lowest minor, lowest start.

Example, an H100 80GB card with a 1g.10gb at slice 6 and a request for a 2g.20gb: first fit takes
start 0, after which no 3g.40gb fits (3g starts at 0 or 4; slice 6 blocks 4). The loss at start 0
is (7g 0, 4g 1, 3g 1, ...), at start 4 it is (0, 0, 0, ...): the scored choice takes start 4 and
keeps 3g.40gb at 0 placeable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import DeviceGrant
from finesched.model.mig import MIGPlacement, mig_profile_of
from finesched.model.resources import ResourceVector
from finesched.sched.framework import Code
from finesched.state.mig_cards import MIGCard
from finesched.state.mig_slices import MIGSlices

BoolArray = npt.NDArray[np.bool_]
#: Largest number of partial placements the exact search visits before giving up on a node.
SEARCH_LIMIT = 20000


@dataclass(frozen=True, slots=True)
class MIGRequest:
    """Instances asked per profile, ((profile, count), ...) sorted by profile name."""

    wants: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.wants)

    def describe(self) -> str:
        return ", ".join(f"{n} x {p}" for p, n in self.wants)


def mig_request(requests: Mapping[str, int]) -> MIGRequest | None:
    """The MIG part of a workload's requests (None: it asks for none). Names are checked by the
    Workload model (model/workload.py), so a name here is a valid profile."""
    wants = sorted((p, n) for name, n in requests.items() if n > 0 and (p := mig_profile_of(name)) is not None)
    return MIGRequest(tuple(wants)) if wants else None


# Filter --------------------------------------------------------------------------------------------------
def mig_mask(slices: MIGSlices, request: MIGRequest, n: int, index: npt.NDArray[np.intp] | None) -> BoolArray:
    """[batch] nodes whose MIG cards can give every instance of `request` at once."""
    rows: Any = slice(0, n) if index is None else index
    size = n if index is None else len(index)
    ok = np.ones(size, dtype=bool)
    for profile, count in request.wants:
        col = slices.profile_column(profile)
        if col is None:
            return np.zeros(size, dtype=bool)
        ok &= slices.fit[rows, col] >= count
    if len(request.wants) > 1:  # several profiles share slices: the exact search decides
        ids = np.arange(n)[ok] if index is None else index[ok]
        ok[ok] = [choose_mig(slices.cards[i], request) is not None for i in ids.tolist()]
    return ok


def explain_mig(slices: MIGSlices, request: MIGRequest, node_ids: Sequence[int]) -> dict[str, tuple[BoolArray, Code]]:
    """Why nodes cannot give `request`: reason -> (mask over `node_ids`, code), from the counters."""
    ids = np.asarray(node_ids, dtype=np.intp)
    failing = ~mig_mask(slices, request, slices.capacity, ids)
    out: dict[str, tuple[BoolArray, Code]] = {}

    def add(reason: str, mask: BoolArray, code: Code) -> None:
        if mask.any():
            out[reason] = (mask.copy(), code)  # `covered` grows in place below

    covered = failing & (slices.card_count[ids] == 0)
    add("node has no MIG GPU", covered, Code.UNRESOLVABLE)
    dynamic = slices.any_dynamic[ids]
    for profile, count in request.wants:
        col = slices.profile_column(profile)
        offers = np.zeros(len(ids), dtype=bool) if col is None else slices.profile_slices[ids, col] > 0
        lacks = failing & ~covered & ~offers
        add(f"no MIG GPU of the node has profile {profile}", lacks, Code.UNRESOLVABLE)
        covered |= lacks
        short = failing & ~covered & (slices.fit[ids, col] < count) if col is not None else np.zeros_like(failing)
        add(f"insufficient free {profile} MIG instances (static MIG GPUs)", short & ~dynamic, Code.UNSCHEDULABLE)
        add(f"insufficient free slices for {profile} MIG instances", short & dynamic, Code.UNSCHEDULABLE)
        covered |= short
    add(f"no MIG layout fits {request.describe()} together", failing & ~covered, Code.UNSCHEDULABLE)
    return out


def mig_share(
    slices: MIGSlices, request: MIGRequest, n: int, index: npt.NDArray[np.intp] | None
) -> npt.NDArray[np.float64]:
    """[batch] share of the node's MIG memory slices held after placement (0 without MIG cards);
    a profile takes its slices on the node's first card offering it (`MIGSlices.profile_slices`)."""
    rows: Any = slice(0, n) if index is None else index
    total = slices.slices_total[rows]
    asked = np.zeros(len(total), dtype=np.int64)
    for profile, count in request.wants:
        col = slices.profile_column(profile)
        if col is not None:
            asked += count * slices.profile_slices[rows, col]
    return np.where(total > 0, (slices.slices_used[rows] + asked) / np.maximum(total, 1), 0.0)


# Exact choice --------------------------------------------------------------------------------------------
def capacities(card: MIGCard) -> tuple[int, ...]:
    """How many instances of each of the card's profiles stay placeable, largest profile first."""
    return tuple(card.capacity(k) for k in card.geometry.by_size)


def placement_key(card: MIGCard, j: int) -> tuple[Any, ...]:
    """The scored order of placing instance j on `card` (module docstring); smaller is better."""
    before, after = capacities(card), capacities(card.with_held(j))
    loss = tuple(b - a for b, a in zip(before, after, strict=True))
    reuse = 0 if card.unheld >> j & 1 else 1
    return (loss, card.free_slices(), reuse, card.minor, card.geometry.placements[j][1])


def _first_fit_key(card: MIGCard, j: int) -> tuple[Any, ...]:
    return (card.minor, card.geometry.placements[j][1], j)


def _profile_size(cards: Sequence[MIGCard], profile: str) -> tuple[int, int]:
    for card in cards:
        k = card.geometry.profile_index(profile)
        if k is not None:
            p = card.geometry.profiles[k]
            return p.memory, p.compute
    return 0, 0


def choose_mig(
    cards: Sequence[MIGCard], request: MIGRequest, *, first_fit: bool = False
) -> tuple[tuple[int, int], ...] | None:
    """(card index, placement index) per instance, or None when the node cannot give them all."""
    todo = sorted(
        (p for p, n in request.wants for _ in range(n)), key=lambda p: (*(-x for x in _profile_size(cards, p)), p)
    )
    key = _first_fit_key if first_fit else placement_key
    budget = [SEARCH_LIMIT]

    def search(state: tuple[MIGCard, ...], step: int) -> list[tuple[int, int]] | None:
        if step == len(todo):
            return []
        profile = todo[step]
        options = []
        for c, card in enumerate(state):
            k = card.geometry.profile_index(profile)
            if k is None:
                continue
            for j in card.geometry.of_profile[k]:
                if card.grantable(j):
                    options.append((key(card, j), c, j))
        options.sort()
        for _, c, j in options:
            budget[0] -= 1
            if budget[0] < 0:
                return None
            nxt = list(state)
            nxt[c] = state[c].with_held(j)
            rest = search(tuple(nxt), step + 1)
            if rest is not None:
                return [(c, j), *rest]
            if first_fit:
                return None  # first fit does not look back
        return None

    found = search(tuple(cards), 0)
    return None if found is None else tuple(found)


def mig_grants(cards: Sequence[MIGCard], choice: Sequence[tuple[int, int]]) -> tuple[DeviceGrant, ...]:
    """The binding's gpu grants for a choice: one per instance, minor then start order."""
    out = []
    for c, j in choice:
        card = cards[c]
        k, start = card.geometry.placements[j]
        placement = MIGPlacement(profile=card.geometry.profiles[k].name, start=start, uuid=card.uuid_of(j))
        out.append(DeviceGrant.model_construct(minor=card.minor, resources=ResourceVector(), mig=placement))
    return tuple(sorted(out, key=lambda g: (g.minor, g.mig.start if g.mig else 0)))
