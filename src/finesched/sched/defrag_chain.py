"""Chains: room for a mover that fits nowhere else, made by moving other movers first.

At high allocation the workloads that hold what a waiting one lacks (often memory or CPU on a node
whose cards have room) are GPU holders for which no card anywhere has room: moving them alone can
never work. A chain first moves a smaller movable workload off another node (or card) so that the
mover fits there, and that workload may itself need a chain (depth bounded by CHAIN_DEPTH); all
moves count against `maxMovesPerPlan`, and the plan is still made one step at a time
(sched/defrag_trial.py orders the moves so each target is free when it is taken).

`Room` belongs to one planner call: each mover's request in state coordinates (cached), a cheap
pre-check (numpy) of whether a mover can go somewhere as things stand or after one chain move, so
exact trials are spent on sets whose movers can move, and the chain options an exact trial tries
(nodes where the mover lacks the least, and the movers there that hold what it lacks).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.sched.defrag import Defragmenter
from finesched.sched.defrag_movers import (
    Mover,
    Need,
    covers,
    fits_now,
    greedy_count,
    lack_scores,
    movers_on,
    need_of,
    useful_movers,
)
from finesched.sched.memo import request_shape
from finesched.state.devices import device_types

#: How deep a chain goes: 1 = a mover's room is made by moving others; 2 = theirs too.
CHAIN_DEPTH = 2
#: Nodes looked at for one mover's room (those where it lacks the least).
CHAIN_NODES = 4
#: Movers per such node considered for the chain.
CHAIN_MOVERS = 6
#: Exact chain attempts per trial (each places a mover and its chain by the profile).
CHAIN_TRIALS = 12


class Room:
    """Where movers could go, for one planner call (see the module docstring)."""

    def __init__(self, sched: Any, defragmenter: Defragmenter, now: float, waiting: str, budget: int):
        self.sched = sched
        #: The most chain moves a pre-check looks for (a plan's budget less its first mover).
        self.chain_budget = max(0, budget - 1)
        self.defragmenter = defragmenter
        self.now = now
        self.waiting = waiting
        self._needs: dict[str, Need] = {}
        #: (mover, target node) -> the fewest chain moves that make room for it (0: none needed;
        #: None: none within `chain_budget`).
        self._chains: dict[tuple[str, int], int | None] = {}
        #: (mover, target node) -> whether it fits somewhere as things stand.
        self._fit: dict[tuple[str, int], bool] = {}
        #: Node -> its movers (the pre-check's, on the unchanged state).
        self._on: dict[int, list[Mover]] = {}
        #: Mover -> the nodes with room for it as things stand (the pre-check's state: unchanged).
        self._fits: dict[str, npt.NDArray[np.int64]] = {}

    def need(self, mover: Mover) -> Need:
        """The mover's request in state coordinates (as the waiting workload's, sched/defrag_movers.py)."""
        need = self._needs.get(mover.key)
        if need is None:
            w = mover.workload
            need = self._needs[mover.key] = need_of(self.sched.state, self.sched._compiler.compile(w, request_shape(w)))
        return need

    def cost(self, mover: Mover, target: int, cards_only: bool, left: int) -> int | str:
        """Moves it takes to move `mover` off `target` (where the waiting workload goes): 1 when some
        node has room for it as things stand, 1 + k when moving k others (at most `left`, each of
        which fits somewhere as things stand) makes room, else why not. `cards_only`: `target` lacks
        only cards, so the mover may stay on it on another card."""
        key = (mover.key, target)
        state = self.sched.state
        fits = self._fit.get(key)
        if fits is None:
            ok = fits_now(state, self.need(mover))
            ok[target] &= cards_only and mover.binding.node == state.names[target]
            fits = self._fit[key] = bool(ok.any())
        if fits:
            return 1
        k = None
        if left > 0:  # the chain search only when chains may be used
            if key not in self._chains:
                self._chains[key] = self._chain(mover, self.need(mover), target)
            k = self._chains[key]
        if k is not None and k <= left:
            return 1 + k
        held = needs_text(state, self.need(mover))
        return f"{mover.key} fits on no other node, nor after moving {left} other workload(s) (it holds {held})"

    def _chain(self, mover: Mover, need: Need, target: int) -> int | None:
        """The fewest other movers (at most `chain_budget`, each fitting elsewhere as things stand)
        whose move makes room for `mover` on some node; None: none found."""
        state = self.sched.state
        best = None
        left = self.chain_budget
        for node, useful in self.options(need, {mover.key}, left, avoid=target, cached=True):
            for k in range(1, min(left, len(useful)) + 1):
                if best is not None and k >= best:
                    break
                for subset in itertools.combinations(useful, k):
                    if not covers(state, need, node, subset):
                        continue
                    if all(self._fits_elsewhere(c, (node, target)) for c in subset):
                        best = k
                        break
            if best == 1:
                break
        return best

    def _fits_elsewhere(self, mover: Mover, avoid: tuple[int, ...]) -> bool:
        fits = self._fits.get(mover.key)
        if fits is None:
            fits = self._fits[mover.key] = np.flatnonzero(fits_now(self.sched.state, self.need(mover)))
        return any(node not in avoid for node in fits[: len(avoid) + 1].tolist())

    def options(
        self, need: Need, taken: Collection[str], left: int, avoid: int = -1, cached: bool = False
    ) -> list[tuple[int, list[Mover]]]:
        """Nodes where moving at most `left` movers (none of `taken`) could make room for `need`, the
        least lacking first, each with its movers that hold what it lacks (at most CHAIN_NODES).
        `cached`: the state is the planner call's, unchanged (the pre-check), so movers per node are
        kept; an exact trial's state changes as it goes."""
        state = self.sched.state
        count, frac, possible = lack_scores(state, need)
        nodes = np.flatnonzero(possible & (count > 0))
        keys = (nodes, -_best_card(state, need)[nodes], frac[nodes], count[nodes], ~_card_may_empty(state, need)[nodes])
        nodes = nodes[np.lexsort(keys)]
        out: list[tuple[int, list[Mover]]] = []
        for node in nodes[: 4 * CHAIN_NODES].tolist():
            if node == avoid:
                continue
            movers = self._on.get(node) if cached else None
            if movers is None:
                movers, _ = movers_on(self.sched, node, self.defragmenter, self.now, self.waiting)
                if cached:
                    self._on[node] = movers
            movers = [m for m in movers if m.key not in taken]
            useful = useful_movers(state, need, node, movers, CHAIN_MOVERS)
            k = greedy_count(state, need, node, useful)
            if k is not None and k <= left:
                out.append((node, useful))
                if len(out) >= CHAIN_NODES:
                    break
        return out


def _best_card(state: Any, need: Need) -> npt.NDArray[np.float64]:
    """Per node: how close its best card comes to the per-card request (1: it fits; breaks ties
    between nodes that lack a card, so the card with the least to move off comes first)."""
    best = np.zeros(state.n, dtype=np.float64)
    types = device_types(state)
    for kind, (_, per_card) in need.per_card.items():
        acc = types[kind]
        ratio = np.ones(acc.free.shape[1:], dtype=np.float64)[: state.n]
        for dim, amount in per_card.items():
            ratio = np.minimum(ratio, acc.free[acc.dim_index[dim], : state.n, :] / max(amount, 1))
        best += np.where(acc.healthy[: state.n, : acc.free.shape[2]], ratio, 0).max(axis=1)
    return best


def _card_may_empty(state: Any, need: Need) -> npt.NDArray[np.bool_]:
    """Per node: whether one of its cards holds no more of each dimension than the largest free
    fragment of any card in the cluster (so its holders might fit elsewhere; nodes whose cards are
    all fuller than any fragment come after: emptying a card there needs a chain of its own)."""
    n = state.n
    out = np.ones(n, dtype=bool)
    types = device_types(state)
    for kind in need.per_card:
        acc = types[kind]
        healthy = acc.healthy[:n, : acc.free.shape[2]]
        ok = healthy.copy()
        for k in range(acc.free.shape[0]):
            free = acc.free[k, :n, :]
            used = acc.total[k, :n, :] - free
            fragment = int(np.where(healthy, free, 0).max(initial=0))
            ok &= used <= fragment
        out &= ok.any(axis=1)
    return out


def needs_text(state: Any, need: Need) -> str:
    """`cpu 11900, memory 49392123904, 1 gpu card(s) with 100 gpu-core`: a request, for reasons."""
    parts = [f"{state.resources[r]} {a}" for r, a in need.rows.items() if state.resources[r] != "pods"]
    for kind, (cards, per_card) in need.per_card.items():
        parts.append(f"{cards} {kind} card(s) with {', '.join(f'{a} {d}' for d, a in per_card.items())}")
    return ", ".join(parts)
