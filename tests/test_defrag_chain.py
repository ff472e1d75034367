"""Chains of moves (sched/defrag_chain.py, sched/defrag_trial.py): a mover that fits nowhere else
is moved after a smaller share leaves the card it takes, within maxMovesPerPlan.

n1 (3 cards, 16 CPUs, 64Gi): the movable whole-GPU workload `big` (4 CPUs, 48Gi) on GPU 0, a fixed
whole-GPU workload on GPU 1, GPU 2 idle; 16Gi free. n2: fixed whole-GPU workloads with 5 CPUs each
on GPU 0 and 1, the movable 60 % share `small` (1 CPU) on GPU 2. n3 (2 CPUs, 8Gi, 1 card): idle. The
waiting workload asks half a card, 7 CPUs and 40Gi: n1 has the card but not the memory, n2 has the
memory but neither half a card nor 7 CPUs (6 without `small`), n3 too little of everything. Only
moving `big` frees the memory, and `big` fits on no other node (no whole card is free where 48Gi are):
it fits on n2's GPU 2 once `small` moves (to n3 or n1's other card).
"""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched.model.binding import Binding
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from test_defrag_plan import MOVABLE, WHOLE_GPU, apply_checked, card_grant, plan_for


def bind(s: Scheduler, name: str, node: str, minor: int, core: int, cpu: int, memory: int, movable: bool) -> None:
    """Bind `name` on `node` holding `core` % of card `minor`, `cpu` CPUs and `memory` Gi, committed."""
    gpu = WHOLE_GPU if core == 100 else {"gpu": str(core)}
    fields = MOVABLE if movable else {}
    w = make_workload(name).req(cpu=str(cpu), memory=f"{memory}Gi", **gpu).set(**fields).obj()
    requests = {"cpu": str(cpu), "memory": memory * 2**30, "pods": 1}
    binding = Binding(
        workload=w.key, node=node, priority=0, tenant=w.tenant, qos=w.qos or "LS",
        requests=requests, devices={"gpu": [card_grant(minor, core)]},
    )  # fmt: skip
    s.state.assume(binding)
    s.state.commit(w.key)
    s.remember_movable(w)


def chain_cluster() -> Scheduler:
    nodes = [
        make_node("n1").cpu("16").memory("64Gi").gpus(3).obj(),
        make_node("n2").cpu("16").memory("64Gi").gpus(3).obj(),
        make_node("n3").cpu("2").memory("8Gi").gpus(1).obj(),
    ]
    s = Scheduler(ClusterState.from_nodes(nodes))
    bind(s, "big", "n1", 0, 100, 4, 48, movable=True)
    bind(s, "fixed-1", "n1", 1, 100, 1, 0, movable=False)
    bind(s, "fixed-2", "n2", 0, 100, 5, 0, movable=False)
    bind(s, "fixed-3", "n2", 1, 100, 5, 0, movable=False)
    bind(s, "small", "n2", 2, 60, 1, 0, movable=True)
    s.state.check_invariants()
    return s


def waiting() -> object:
    return make_workload("wait").req(cpu="7", memory="40Gi", gpu="50").obj()


def test_a_big_mover_fits_after_a_small_share_moves_off_its_card() -> None:
    s = chain_cluster()
    w = waiting()
    with pytest.raises(FitError):
        s.schedule_one(w)  # type: ignore[arg-type]
    plan, why = plan_for(s, w)  # type: ignore[arg-type]
    assert plan is not None, why
    assert plan.binding.node == "n1"
    moves = {m.workload: m for m in plan.moves}
    assert sorted(moves) == ["default/big", "default/small"]
    big = moves["default/big"]
    assert big.target.node == "n2" and big.target.device_minors("gpu") == [2]
    assert moves["default/small"].target.node != "n2"
    # `small` leaves GPU 2 of n2 before `big` takes it; the waiting workload comes last.
    assert plan.mover_keys.index("default/small") < plan.mover_keys.index("default/big")
    assert "room for another workload moved off n1" in moves["default/small"].reason
    assert "1 of them to make room for the others" in plan.reason
    apply_checked(s, plan)


def test_without_room_for_the_chain_no_move_is_made_and_the_why_names_the_stuck_mover() -> None:
    s = chain_cluster()
    plan, why = plan_for(s, waiting(), max_moves_per_plan=1)  # type: ignore[arg-type]
    assert plan is None
    assert "default/big fits on no other node" in why


def test_a_fixed_small_share_leaves_no_chain() -> None:
    s = chain_cluster()
    s.movable.pop("default/small")
    plan, why = plan_for(s, waiting())  # type: ignore[arg-type]
    assert plan is None
    assert "default/big fits on no other node" in why
