"""Managed-memory fractions and quotas (S2.4): specified -> op / group, unknown -> 1/n (or weights),
rounded down so a group's fractions sum to <= 1; quota = floor(fraction x slot managed memory)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from dataflow_builders import MiB, blocking, edge, make_job, op, task, uses
from hypothesis import given
from hypothesis import strategies as st

from finesched.dataflow import compile_job
from finesched.dataflow.fractions import round_down


def test_the_seeds_worked_example() -> None:
    # three operators in one group with managed memory 100, 300 and 700 MiB: the group has 1100 MiB
    ops = [
        op("o1", cpu="1", managedOffHeap="100Mi"),
        op("o2", cpu="1", managedOffHeap="300Mi"),
        op("o3", cpu="1", managedOffHeap="700Mi"),
    ]
    c = compile_job(
        make_job([task("a", ops[0]), task("b", ops[1]), task("c", ops[2])], [edge("a", "b"), edge("b", "c")])
    )
    assert c.groups == {"region-0": frozenset("abc")}
    assert c.slot_requests["region-0"]["managed_off_heap"] == 1100 * MiB
    for name, amount in (("o1", 100), ("o2", 300), ("o3", 700)):
        on, off = c.fractions[name]
        assert on == 0.0  # no operator uses on-heap managed memory
        assert Fraction(off) <= Fraction(amount, 1100)  # rounded down ...
        assert off == pytest.approx(amount / 1100, abs=1e-15)  # ... by less than one float step
    assert sum(f[1] for f in c.fractions.values()) <= 1.0
    # a 1100 MiB slot: floor(fraction x 1100 MiB); the rounding down costs o1 one byte
    quotas = c.quotas(1100 * MiB)
    assert quotas == {op_id: math.floor(c.fractions[op_id][1] * 1100 * MiB) for op_id in ("o1", "o2", "o3")}
    assert quotas == {"o1": 100 * MiB - 1, "o2": 300 * MiB, "o3": 700 * MiB}
    assert sum(quotas.values()) <= 1100 * MiB


@pytest.mark.parametrize(
    ("ops", "want"),
    [
        # unknown specs: 1 / (operators using the pool): on-heap used by x and y -> 1/2 each, off-heap by y only -> 1
        pytest.param(
            [uses("x", on=True), uses("y", on=True, off=True), uses("z")],
            {"x": (0.5, 0.0), "y": (0.5, 1.0), "z": (0.0, 0.0)},
            id="unknown-1-over-n-per-pool",
        ),
        # three users of off-heap: 1/3 each, rounded down (1/3 is not a float; the float below it)
        pytest.param(
            [uses("x", off=True), uses("y", off=True), uses("z", off=True)],
            {k: (0.0, round_down(Fraction(1, 3))) for k in "xyz"},
            id="unknown-thirds",
        ),
        # nobody uses managed memory: every fraction 0
        pytest.param([uses("x"), uses("y")], {"x": (0.0, 0.0), "y": (0.0, 0.0)}, id="unknown-no-users"),
        # specified, both pools: on 100 / (100 + 300) = 0.25 and 300 / 400 = 0.75; off 50 / 50 = 1 and 0
        pytest.param(
            [op("x", cpu="1", managedOnHeap="100Mi", managedOffHeap="50Mi"), op("y", cpu="1", managedOnHeap="300Mi")],
            {"x": (0.25, 1.0), "y": (0.75, 0.0)},
            id="specified-pools-apart",
        ),
        # specified, the group has no managed memory: 0, never a division by zero
        pytest.param([op("x", cpu="1"), op("y", cpu="1")], {"x": (0.0, 0.0), "y": (0.0, 0.0)}, id="specified-none"),
    ],
)
def test_fractions_in_one_group(ops: list[dict[str, object]], want: dict[str, tuple[float, float]]) -> None:
    assert compile_job(make_job([task("t", *ops)])).fractions == want


def test_fractions_count_only_the_operators_of_the_group() -> None:
    # a -> b blocking: two groups; each has one off-heap user, so each gets the whole slot's pool (1), not 1/2
    job = make_job([task("a", uses("x", off=True)), task("b", uses("y", off=True))], [blocking("a", "b")])
    assert compile_job(job).fractions == {"x": (0.0, 1.0), "y": (0.0, 1.0)}


@pytest.mark.parametrize(
    ("option", "want_x"),
    [
        # weights 1 and 3 declared, option unset: weights are used (a weight is never ignored silently): 1/4
        pytest.param(None, 0.25, id="weights-on-when-declared"),
        # the seed's rule on request: 1/2 whatever the weights
        pytest.param(False, 0.5, id="seed-rule-1-over-n"),
    ],
)
def test_weighted_fractions_option(option: bool | None, want_x: float) -> None:
    job = make_job([task("t", uses("x", off=True, weight=1), uses("y", off=True, weight=3))])
    c = compile_job(job, weighted_fractions=option)
    assert c.fractions["x"] == (0.0, want_x)
    assert c.fractions["y"] == (0.0, 1 - want_x)


def test_weights_manifest_flag_off_keeps_the_seeds_rule() -> None:
    job = make_job([task("t", uses("x", off=True, weight=1), uses("y", off=True, weight=3))], weightedFractions=False)
    assert compile_job(job).fractions["x"] == (0.0, 0.5)
    assert compile_job(job, weighted_fractions=True).fractions["x"] == (0.0, 0.25)


@pytest.mark.parametrize(
    ("slot", "want"),
    [
        # one number: split as the group's profile splits managed memory (on 400Mi : off 50Mi = 8 : 1)
        # 900Mi -> on 800Mi, off 100Mi; x = 0.25 x 800 + 1.0 x 100 = 300Mi; y = 0.75 x 800 = 600Mi
        pytest.param(900 * MiB, {"x": 300 * MiB, "y": 600 * MiB}, id="one-number-split-like-the-profile"),
        # a pair is (on-heap, off-heap): x = 0.25 x 400 + 1.0 x 10 = 110Mi; y = 0.75 x 400 = 300Mi
        pytest.param((400 * MiB, 10 * MiB), {"x": 110 * MiB, "y": 300 * MiB}, id="explicit-pools"),
    ],
)
def test_quotas_from_slot_managed_memory(slot: int | tuple[int, int], want: dict[str, int]) -> None:
    ops = [op("x", cpu="1", managedOnHeap="100Mi", managedOffHeap="50Mi"), op("y", cpu="1", managedOnHeap="300Mi")]
    assert compile_job(make_job([task("t", *ops)])).quotas(slot) == want


def test_unknown_specs_quotas_come_from_the_default_slot() -> None:
    # default slot: 512Mi managed off-heap; two off-heap users -> 256Mi each, the non-user 0
    c = compile_job(make_job([task("t", uses("x", off=True), uses("y", off=True), uses("z"))]))
    assert c.group_quotas("region-0") == {"x": 256 * MiB, "y": 256 * MiB, "z": 0}
    assert c.quotas(1000) == {"x": 500, "y": 500, "z": 0}


@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=12), st.integers(0, 2**42))
def test_fractions_never_sum_above_one_and_quotas_never_exceed_the_slot(amounts: list[int], slot: int) -> None:
    ops = [op(f"o{i}", cpu="1", managedOffHeap=str(a)) for i, a in enumerate(amounts)]
    c = compile_job(make_job([task("t", *ops)]))
    fractions = [c.fractions[f"o{i}"][1] for i in range(len(amounts))]
    total = sum(amounts)
    for f, amount in zip(fractions, amounts, strict=True):
        assert Fraction(f) <= (Fraction(amount, total) if total else 0)
    assert sum(fractions) <= 1.0 and math.fsum(fractions) <= 1.0
    assert sum(c.quotas(slot).values()) <= slot


@given(st.integers(1, 40), st.integers(0, 2**42))
def test_one_over_n_never_sums_above_one(n: int, slot: int) -> None:
    c = compile_job(make_job([task("t", *(uses(f"o{i}", on=True) for i in range(n)))]))
    assert sum(f[0] for f in c.fractions.values()) <= 1.0
    assert sum(c.quotas((slot, 0)).values()) <= slot


@pytest.mark.parametrize("n", [3, 49, 1000, 2001])
def test_many_operators_fractions_stay_within_one_float_step_below_exact_and_sum_to_at_most_one(n: int) -> None:
    # float addition of n copies of round_down(1/n) drifts; the largest gives back the excess
    c = compile_job(make_job([task("t", *(uses(f"o{i}", off=True) for i in range(n)))]))
    fractions = [c.fractions[f"o{i}"][1] for i in range(n)]
    assert sum(fractions) <= 1.0 and math.fsum(fractions) <= 1.0
    assert all(Fraction(f) <= Fraction(1, n) for f in fractions)
    assert sorted(fractions)[1] == round_down(Fraction(1, n))  # all but at most one are the plain rounded-down 1/n


@pytest.mark.parametrize(
    ("ops", "want"),
    [
        # only on-heap users: the whole 1000 bytes are the on-heap pool: 1/2 x 1000 each
        pytest.param([uses("x", on=True), uses("y", on=True)], {"x": 500, "y": 500}, id="one-pool-on-heap"),
        # both pools used, the default slot has off-heap managed memory only: all 1000 bytes are off-heap,
        # x = 1/1 of on-heap 0 = 0 (the plan warns), y = 1/1 of off-heap = 1000
        pytest.param([uses("x", on=True), uses("y", off=True)], {"x": 0, "y": 1000}, id="both-pools-slot-has-one"),
        # both pools used and the slot has both (256Mi on : 768Mi off = 1 : 3): 250 on-heap, 750 off-heap
        pytest.param(
            [uses("x", on=True), uses("y", off=True)], {"x": 250, "y": 750}, id="both-pools-split-like-the-slot"
        ),
    ],
)
def test_one_number_goes_to_the_pools_the_group_uses(
    request: pytest.FixtureRequest, ops: list[dict[str, object]], want: dict[str, int]
) -> None:
    slot = {"managedOnHeap": "256Mi", "managedOffHeap": "768Mi"} if "split-like" in request.node.name else {}
    assert compile_job(make_job([task("t", *ops)], defaultSlot=slot)).quotas(1000) == want


@pytest.mark.parametrize(
    ("ops", "want"),
    [
        # nobody declares usesManagedMemory: every operator counts, in both pools (Flink's weight 1 each): 1/3
        pytest.param(
            [{"id": "x"}, {"id": "y"}, {"id": "z"}],
            {k: (round_down(Fraction(1, 3)),) * 2 for k in "xyz"},
            id="none-declared-all-count",
        ),
        # once one operator declares it, the declarations are complete: z uses nothing, x and y 1/2 of off-heap
        pytest.param(
            [uses("x", off=True), uses("y", off=True), {"id": "z"}],
            {"x": (0.0, 0.5), "y": (0.0, 0.5), "z": (0.0, 0.0)},
            id="declared-somewhere-undeclared-uses-none",
        ),
    ],
)
def test_undeclared_managed_memory_use_is_all_or_none_per_job(
    ops: list[dict[str, object]], want: dict[str, tuple[float, float]]
) -> None:
    assert compile_job(make_job([task("t", *ops)])).fractions == want


def test_undeclared_users_share_the_slots_managed_memory_without_warnings() -> None:
    # three operators, nothing declared, the default slot's 512Mi off-heap: floor(512Mi x 1/3) each
    c = compile_job(make_job([task("a", op("x"), op("y")), task("b", op("z"))], [edge("a", "b")]))
    assert c.warnings == []
    third = math.floor(round_down(Fraction(1, 3)) * 512 * MiB)
    assert c.group_quotas("region-0") == {"x": third, "y": third, "z": third}
    assert c.quotas(1100 * MiB) == {k: math.floor(c.fractions[k][1] * 1100 * MiB) for k in "xyz"}


def test_users_of_a_pool_the_default_slot_lacks_are_warned_about() -> None:
    c = compile_job(make_job([task("t", uses("x", on=True), uses("y", off=True))]))
    assert c.warnings == [
        "group region-0: operators x use on-heap managed memory, but the default slot has none "
        "(set defaultSlot.managedOnHeap); their quota is 0"
    ]
    assert c.group_quotas("region-0") == {"x": 0, "y": 512 * MiB}
    given = compile_job(make_job([task("t", uses("x", on=True))], defaultSlot={"managedOnHeap": "256Mi"}))
    assert given.warnings == [] and given.group_quotas("region-0") == {"x": 256 * MiB}
