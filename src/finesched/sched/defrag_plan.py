"""The defragmentation planner: which running workloads to move, and where, so that one waiting
workload fits (see sched/defrag.py for the contract). Pure: state in, plan out, nothing changed.

Steps, each bounded so that a call costs a few milliseconds on thousands of nodes:

1. precheck (numpy): the cluster's idle capacity in total covers the request, else no plan;
2. target nodes: those no filter rejects for a reason moves cannot change, whose held amounts
   could cover what they lack, ranked by a vectorized estimate (how many requested resources
   the node lacks, then the fraction lacked: every resource counts, CPU and memory as much as
   GPU shares), then by the fewest movers a greedy count needs there and their priority; at most
   `candidateNodes` are tried;
3. on a target node: sets of its movers, smallest first and lowest priorities first, checked
   cheaply per resource and per card, then exactly (sched/defrag_trial.py): the waiting
   workload's exact binding without them, each of them placed again by the profile with that
   binding reserved, and an order in which the moves can be made one by one;
4. the first set that works is the plan; none: no move at all, and why.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Protocol

import numpy as np

from finesched.model.workload import Workload
from finesched.sched.cycle_state import CycleState
from finesched.sched.defrag import Defragmenter, DefragPlan, Move
from finesched.sched.defrag_chain import Room
from finesched.sched.defrag_movers import (
    Mover,
    MoveRules,
    Need,
    covers,
    describe,
    greedy_count,
    lack_scores,
    lacks_text,
    movers_on,
    need_of,
    shortfall,
    useful_movers,
)
from finesched.sched.defrag_trial import try_movers
from finesched.sched.diagnosis import unresolvable_nodes
from finesched.sched.framework import NodeBatch
from finesched.sched.preempt import SchedulerView, prepare
from finesched.sched.request import ScheduleRequest

#: Movers considered per node (lowest priority first, then the most useful): bounds the subsets.
MOVERS_PER_NODE = 10
#: Exact trials per call, over all candidate nodes (each is a few filter passes).
EXACT_TRIALS = 8
#: Subsets looked at per node (cheap checks) before giving up on it.
SUBSETS_PER_NODE = 400


class DefragView(SchedulerView, Protocol):
    """What the planner reads of the Scheduler besides what preemption reads."""

    movable: dict[str, Workload]


def find_defragmentation(
    sched: DefragView, workload: Workload, defragmenter: Defragmenter, now: float
) -> tuple[DefragPlan | None, str]:
    """The plan that lets `workload` fit by moving movable workloads, or None and why."""
    state = sched.state
    if workload.key in state.bindings:
        return None, "already bound"
    if state.n == 0:
        return None, "no nodes"
    if workload.gang is not None:
        return None, "a gang member is placed with its gang, never by moving others"
    config = defragmenter.config
    budget = min(config.max_moves_per_plan, defragmenter.moves_left(now))
    if budget <= 0:
        return None, f"the cluster's budget of moves is spent (maxMovesPerMinute {config.max_moves_per_minute})"
    prepared = prepare(sched, workload)
    if isinstance(prepared, str):
        return None, prepared
    request, cycle, skipped = prepared
    if request.unknown:
        return None, f"no node offers {', '.join(request.unknown)}"
    need = need_of(state, request)
    short = shortfall(state, need)
    if short is not None:
        return None, short
    mask, results = sched.framework.run_filter(cycle.clone(), request, NodeBatch(state), skipped)
    if mask.any():
        return None, "it fits without moving anything"
    hopeless = unresolvable_nodes(results, state.n)
    count, frac, possible = lack_scores(state, need)
    eligible = np.flatnonzero(possible & ~hopeless & (count > 0))
    if len(eligible) == 0:
        return None, "no node could hold it even with every movable workload gone"
    order = eligible[np.lexsort((eligible, frac[eligible], count[eligible]))]
    rules = MoveRules(sched, defragmenter, now)
    room = Room(sched, defragmenter, now, workload.key, budget)
    refused: Counter[str] = Counter()
    ranked: list[tuple[tuple[int, int, int], int, list[Mover]]] = []
    for node in order[: 2 * config.candidate_nodes].tolist():
        movers, why_not = movers_on(sched, node, defragmenter, now, workload.key)
        refused.update(why_not)
        useful = useful_movers(state, need, node, movers, MOVERS_PER_NODE)
        moves = greedy_count(state, need, node, useful)
        if moves is None or moves > budget:
            continue
        top = max(m.priority for m in useful[:moves]) if moves else 0
        ranked.append(((moves, top, len(ranked)), node, useful))
        if len(ranked) >= config.candidate_nodes:
            break  # enough viable nodes: the rest of the estimate's order is not looked at
    ranked.sort(key=lambda item: item[0])
    why = "no node's movable workloads hold enough of what it lacks"
    # First every node without chains (the fewest moves), then with them.
    for chains in (False, True) if budget > 1 else (False,):
        trials = [0]
        for _, node, useful in ranked[: config.candidate_nodes]:
            plan, why_node = _plan_node(
                sched, cycle, request, skipped, need, node, useful, rules, room, chains, budget, trials
            )
            if plan is not None:
                return plan, ""
            why = why_node if why_node and (chains or not why_node.startswith("no set")) else why
            if trials[0] >= EXACT_TRIALS:
                break
    if refused and not ranked:
        top = ", ".join(f"{why} ({n})" for why, n in refused.most_common(3))
        why = f"{why}; workloads not movable on the best nodes: {top}"
    return None, why


def _plan_node(
    sched: DefragView,
    cycle: CycleState,
    request: ScheduleRequest,
    skipped: set[str],
    need: Need,
    node: int,
    useful: list[Mover],
    rules: MoveRules,
    room: Room,
    chains: bool,
    budget: int,
    trials: list[int],
) -> tuple[DefragPlan | None, str]:
    """The smallest set of `useful` that makes room on `node` (lowest priorities first); a set
    whose movers cannot go anywhere, even after chain moves (`Room.cost`), is not tried. Without
    `chains`, only sets whose movers fit somewhere as things stand."""
    state = sched.state
    name = state.names[node]
    cards_only = all(int(state.free[r, node]) >= a for r, a in need.rows.items())
    why = ""
    looked = 0
    for size in range(1, min(budget, len(useful)) + 1):
        for subset in itertools.combinations(useful, size):
            looked += 1
            if looked > SUBSETS_PER_NODE or trials[0] >= EXACT_TRIALS:
                return None, why or f"no set of its movers tried on {name} frees enough"
            if not covers(state, need, node, subset):
                continue
            refusal = rules.refusal(subset)
            if refusal is not None:
                why = f"moving {', '.join(m.key for m in subset)} on {name} refused: {refusal}"
                continue
            costs = [room.cost(m, node, cards_only, budget - size if chains else 0) for m in subset]
            stuck = next((c for c in costs if isinstance(c, str)), None)
            if stuck is not None or sum(costs) > budget:  # type: ignore[arg-type]
                why = why or stuck or f"moving {', '.join(m.key for m in subset)} needs more than {budget} moves"
                continue
            trials[0] += 1
            chain_room = room if chains else None
            found = try_movers(
                sched, cycle, request, node, skipped, subset, need=need, room=chain_room, rules=rules, budget=budget
            )
            if isinstance(found, str):
                why = why or found
                continue
            binding, steps = found
            if not steps:
                continue
            key = request.key
            direct = {m.key for m in subset}
            moves = tuple(
                Move(
                    m.key,
                    m.binding.tenant,
                    m.priority,
                    m.binding,
                    target,
                    f"moved from {describe(m.binding)} to {describe(target)} to make room for {key}"
                    + ("" if m.key in direct else f" (room for another workload moved off {name})"),
                )
                for m, target in steps
            )
            chained = len(moves) - len(direct & {m.workload for m in moves})
            lacks = lacks_text(state, need, node)  # the trial left the state as it was
            reason = (
                f"{key} fits on no node as things stand; on {name} it lacked {'; '.join(lacks) or 'room'}: "
                f"moving {len(moves)} workload(s) ({', '.join(m.workload for m in moves)}) frees it"
                + (f" ({chained} of them to make room for the others)" if chained else "")
            )
            return DefragPlan(key, binding, moves, reason), ""
    return None, why or f"no set of at most {budget} of its movers frees enough on {name}"
