"""A plan taken back (its write failed or conflicted) costs neither budget nor cool-down."""

from __future__ import annotations

from builders import make_node, make_workload
from finesched.model.binding import Binding
from finesched.sched.profile import Defragmentation, resolve_profile
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

ONE_MOVE_A_MINUTE = resolve_profile("default").model_copy(
    update={"defragmentation": Defragmentation(max_moves_per_minute=1, cooldown_seconds=600)}
)


def test_undo_gives_the_budget_and_the_cool_down_back() -> None:
    nodes = [make_node(n).cpu("4").memory("8Gi").obj() for n in ("n1", "n2")]
    s = Scheduler(ClusterState.from_nodes(nodes), ONE_MOVE_A_MINUTE)
    s.clock = lambda: 10.0
    for name in ("a", "b"):
        s.submit([make_workload(name).req(cpu="2").set(migration={"allowed": True}).obj()])
    assert all(isinstance(r, Binding) for r in s.run())
    assert s.state.bindings["default/a"].node != s.state.bindings["default/b"].node
    waiting = make_workload("w").req(cpu="4").obj()
    s.submit([waiting])
    s.run()
    [plan] = s.take_defragmentations()
    defragmenter = s.defragmenter
    assert defragmenter is not None
    assert defragmenter.moves_left(10.0) == 0
    assert defragmenter.refusal(plan.mover_keys[0], 10.0) is not None
    s.undo_defragmentation(plan)
    assert defragmenter.moves_left(10.0) == 1
    assert defragmenter.refusal(plan.mover_keys[0], 10.0) is None
    assert "default/w" not in s.state.bindings
    s.state.check_invariants()
