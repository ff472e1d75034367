"""BucketFit (seed S4): each embodiment with worked numbers, the filter contract, end to end, args."""

from __future__ import annotations

import types
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.errors import ValidationError
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.bucket_fit import BucketFit, dominant_row, search_order
from finesched.plugins.node_selector import NodeSelector
from finesched.plugins.resources_fit import ResourcesFit
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NodeBatch
from finesched.sched.request import compile_request
from finesched.sched.scheduler import Scheduler
from finesched.state.buckets import BucketIndex, BucketSpec
from finesched.state.cluster import ClusterState

GI = 2**30
CPU4 = {"cpu": BucketSpec.equal(0, 2000, 4)}  # [0,2) [2,4) [4,6) [6,∞) cpu
CPU6 = {"cpu": BucketSpec.equal(0, 2000, 6)}  # [0,2) [2,4) [4,6) [6,8) [8,10) [10,∞) cpu


def cluster(*nodes: Node | str) -> ClusterState:
    """Nodes n0, n1, ...: a string is a cpu amount with 64Gi memory (memory never decides)."""
    built = [n if isinstance(n, Node) else make_node(f"n{i}").cpu(n).memory("64Gi").obj() for i, n in enumerate(nodes)]
    return ClusterState.from_nodes(built)


def order(state: ClusterState, workload: Workload, plugin: BucketFit | None = None) -> list[str]:
    """Names in BucketFit's order over the nodes passing NodeSelector + ResourcesFit (the full filter)."""
    plugin = plugin or BucketFit(CPU4)
    plugin.attach(state)
    request = compile_request(workload, state)
    cycle, batch = CycleState(), NodeBatch(state)
    mask = ResourcesFit().filter(cycle, request, batch).mask
    if workload.node_selector:
        mask &= NodeSelector().filter(cycle, request, batch).mask
    chosen = list(plugin.select(cycle, request, NodeBatch(state, mask), np.zeros(state.n, dtype=np.int64)))
    return [state.names[i] for i in chosen]


def ask(cpu: str, memory: str = "1Gi", **selector: str) -> Workload:
    builder = make_workload("w").req(cpu=cpu, memory=memory)
    return builder.selector(**selector).obj() if selector else builder.obj()


# S4.2 (embodiment 1): demand X selects bucket K; in K the node closest to X first -----------------------------
@pytest.mark.parametrize(
    ("cpus", "demand", "want"),
    [
        # K = bucket of 4 = [4,6) holds n1 (4.5) and n0 (5): n1 is closest to 4; then K+1 = [6,∞): n2
        pytest.param(["5", "4.5", "7", "1"], "4", ["n1", "n0", "n2"], id="best-fit-in-K"),
        # demand 4.6: n1 (4.5) is in K but too small; n0 (5) is the best fit
        pytest.param(["5", "4.5", "7", "1"], "4.6", ["n0", "n2"], id="K-node-below-demand-skipped"),
        # an exact fit leaves no fragment: n2 (4) before n0 (5)
        pytest.param(["5", "4.5", "4", "1"], "4", ["n2", "n1", "n0"], id="exact-fit-first"),
        # equal remainders: lowest index first
        pytest.param(["5", "5", "5"], "4", ["n0", "n1", "n2"], id="ties-by-index"),
    ],
)
def test_s4_2_best_fit_in_bucket_k(cpus: list[str], demand: str, want: list[str]) -> None:
    assert order(cluster(*cpus), ask(demand)) == want


# S4.3 (embodiment 2): K empty (or nothing in K fits) -> K+1 ... upward, smallest remainder first --------------
@pytest.mark.parametrize(
    ("nodes", "workload", "want"),
    [
        # demand 4.5 -> K = [4,6) is empty; K+1 = [6,8): n0 (7); K+2 = [8,10): n1 (9); n2 (1) never
        pytest.param(["7", "9", "1"], ask("4.5"), ["n0", "n1"], id="K-empty-next-bucket"),
        # K and K+1 empty: K+2 = [8,10) holds n1 (9) and n0 (9.5): smallest first
        pytest.param(["9.5", "9", "1"], ask("4.5"), ["n1", "n0"], id="K-and-K+1-empty"),
        # K holds n0 (5) but its zone fails the node selector: skipped, upward to n1 (7)
        pytest.param(
            [
                make_node("n0").cpu("5").memory("64Gi").label("zone", "b").obj(),
                make_node("n1").cpu("7").memory("64Gi").label("zone", "a").obj(),
            ],
            ask("4.5", zone="a"),
            ["n1"],
            id="K-node-fails-selector",
        ),
        # K holds n0 (5 cpu) but only 1Gi memory for a 2Gi request: skipped, upward to n1
        pytest.param(
            [make_node("n0").cpu("5").memory("1Gi").obj(), make_node("n1").cpu("7").memory("64Gi").obj()],
            ask("4.5", memory="2Gi"),
            ["n1"],
            id="K-node-short-of-another-resource",
        ),
    ],
)
def test_s4_3_upward_search(nodes: Sequence[Node | str], workload: Workload, want: list[str]) -> None:
    assert order(cluster(*nodes), workload, BucketFit(CPU6)) == want


# S4.3 (embodiment 3, patent 004 step 208 -> step 209 and the claims): K+1..K+maxUp all empty -> from the
# largest bucket M down to the first non-empty bucket P; inside P the node whose remainder is closest to X
# (the "preset condition" of every step: the smallest difference between remainder and demand) -----------
FAR = ["2", "8.5", "9", "11", "12"]  # buckets: n0 -> 1, n1 and n2 -> 4, n3 and n4 -> 5 = M


@pytest.mark.parametrize(
    ("cpus", "max_up", "want"),
    [
        # demand 2.5 -> K = [2,4): n0 (2) too small; K+1 = [4,6) empty (maxUp 1).
        # Step 208: down from M = [10,∞) = P, non-empty. Step 209 in P: |11-2.5| = 8.5 < |12-2.5| = 9.5
        # -> n3 (11) then n4 (12); then [8,10): n1 (8.5, diff 6) before n2 (9, diff 6.5); [6,8) empty.
        pytest.param(FAR, 1, ["n3", "n4", "n1", "n2"], id="maxUp-1-downward-closest-first"),
        pytest.param(FAR, 0, ["n3", "n4", "n1", "n2"], id="maxUp-0-straight-to-downward"),
        # maxUp 2 reaches [6,8) (empty) only: the same downward order from M
        pytest.param(FAR, 2, ["n3", "n4", "n1", "n2"], id="maxUp-2-still-empty"),
        # maxUp 3 reaches [8,10): smallest first n1 (8.5), n2 (9); then down: M = [10,∞) n3, n4
        pytest.param(FAR, 3, ["n1", "n2", "n3", "n4"], id="maxUp-3-finds-bucket-4"),
        # default maxUp (all buckets above K): plain upward best fit
        pytest.param(FAR, None, ["n1", "n2", "n3", "n4"], id="default-maxUp-no-downward"),
        # M empty: P = M-1 = [8,10), closest to 2.5 first: n1 (8.5), n2 (9)
        pytest.param(["2", "8.5", "9"], 1, ["n1", "n2"], id="M-empty-P-is-M-1"),
        # the largest remainder is *not* the rule inside P: in P = [10,∞) holding 30, 10.5 and 16,
        # 10.5 is closest to 2.5 (diff 8), then 16 (13.5), then 30 (27.5)
        pytest.param(["2", "30", "10.5", "16"], 0, ["n2", "n3", "n1"], id="P-closest-not-largest"),
    ],
)
def test_s4_3_downward_search(cpus: list[str], max_up: int | None, want: list[str]) -> None:
    assert order(cluster(*cpus), ask("2.5"), BucketFit(CPU6, max_up=max_up)) == want


# S4.4: the dominant resource picks the buckets; every resource's buckets follow the allocation -------------
MEM_EDGES = {"memory": BucketSpec.explicit([0, 8 * GI, 16 * GI, 24 * GI]), **CPU4}


def multi() -> ClusterState:
    # totals: cpu 8 + 4 + 6 = 18 cpu, memory 16 + 32 + 12 = 60Gi
    return cluster(
        make_node("n0").cpu("8").memory("16Gi").obj(),
        make_node("n1").cpu("4").memory("32Gi").obj(),
        make_node("n2").cpu("6").memory("12Gi").obj(),
    )


def test_s4_4_dominant_resource_chooses_the_buckets() -> None:
    state = multi()
    plugin = BucketFit(MEM_EDGES)
    # 1 cpu / 18 = 0.056 < 10Gi / 60Gi = 0.167: memory dominates; K = [8Gi,16Gi) holds n2 (12Gi)
    # and n0 (16Gi is on the edge -> [16Gi,24Gi)); memory best fit n2, then n0, then n1 (32Gi).
    # (By cpu best fit, n1 with 4 cpu would have come first.)
    assert order(state, ask("1", memory="10Gi"), plugin) == ["n2", "n0", "n1"]
    # 3.5 cpu / 18 = 0.194 > 1Gi / 60Gi: cpu dominates; K = [2,4) empty; [4,6): n1 (4); [6,∞): n2 (6), n0 (8)
    assert order(state, ask("3.5", memory="1Gi"), plugin) == ["n1", "n2", "n0"]


def test_s4_4_every_resource_bucket_updated_after_placement() -> None:
    state = multi()
    scheduler = Scheduler(
        state,
        {
            "name": "b",
            "plugins": [
                {"name": "NodeSelector"},
                {"name": "ResourcesFit"},
                {
                    "name": "BucketFit",
                    "args": {
                        "resources": {
                            "cpu": {"width": "2", "count": 4},
                            "memory": {"edges": [0, "8Gi", "16Gi", "24Gi"]},
                        }
                    },
                },
            ],
        },
    )
    index = state.extras["buckets"]
    assert isinstance(index, BucketIndex)
    assert index.members("cpu", 3) == [(6000, 2), (8000, 0)] and index.members("memory", 1) == [(12 * GI, 2)]
    binding = scheduler.schedule_one(ask("1", memory="10Gi"))  # memory dominant -> n2 (see above)
    assert binding.node == "n2"
    # n2: memory 12Gi - 10Gi = 2Gi -> bucket 0; and the non-dominant cpu 6 - 1 = 5 -> bucket 2
    assert index.members("memory", 0) == [(2 * GI, 2)] and index.members("memory", 1) == []
    assert index.members("cpu", 2) == [(4000, 1), (5000, 2)] and index.members("cpu", 3) == [(8000, 0)]
    assert index.violations() == []
    scheduler.release(binding)
    assert index.members("cpu", 3) == [(6000, 2), (8000, 0)] and index.members("memory", 1) == [(12 * GI, 2)]


@pytest.mark.parametrize(
    ("rows", "amounts", "capacity", "want"),
    [
        # 2000/32000 = 1/16 < 8Gi/64Gi = 1/8 -> memory (row 1)
        pytest.param([0, 1], [2000, 8 * GI], [32000, 64 * GI], 1, id="memory-dominant"),
        # 4000/32000 = 1/8 = 8Gi/64Gi: a tie -> the lowest row (cpu), in whatever order requested
        pytest.param([1, 0], [8 * GI, 4000], [32000, 64 * GI], 0, id="tie-lowest-row"),
        # row 3 no node offers (capacity 0): it dominates (nothing fits anyway)
        pytest.param([0, 3], [1000, 1], [32000, 64 * GI, 110, 0], 3, id="unoffered-dominates"),
        pytest.param([], [], [32000], None, id="nothing-requested"),
    ],
)
def test_dominant_row(rows: list[int], amounts: list[int], capacity: list[int], want: int | None) -> None:
    assert dominant_row(rows, amounts, capacity) == want


def test_nothing_requested_falls_back_to_lowest_index_over_feasible() -> None:
    state = cluster(
        make_node("n0").cpu("1").memory("1Gi").label("zone", "b").obj(),
        make_node("n1").cpu("8").memory("64Gi").label("zone", "a").obj(),
        make_node("n2").cpu("2").memory("8Gi").label("zone", "a").obj(),
    )
    assert order(state, make_workload("w").selector(zone="a").obj()) == ["n1", "n2"]


# The select contract: lazy, feasible only, each node once, exactly the S4 order ---------------------------
def test_select_is_lazy() -> None:
    state = cluster("5", "4.5", "7")
    plugin = BucketFit(CPU4)
    plugin.attach(state)
    request = compile_request(ask("4"), state)
    chosen = plugin.select(CycleState(), request, NodeBatch(state, np.ones(3, dtype=bool)), np.zeros(3, np.int64))
    assert isinstance(chosen, types.GeneratorType)
    assert next(chosen) == 1


def reference_order(
    free: list[int], mask: list[bool], edges: tuple[int, ...], demand: int, max_up: int | None
) -> list[int]:
    """S4.2-S4.3 by brute force: one sort key per feasible node that fits the demand (up to `top`:
    bucket then remainder ascending; above it: bucket descending, then remainder ascending, step 209)."""
    spec = BucketSpec(edges)
    k, last = spec.bucket_of(demand), spec.count - 1
    top = last if max_up is None else min(last, k + max_up)
    keys = []
    for i, value in enumerate(free):
        if not mask[i] or value < demand:
            continue
        b = spec.bucket_of(value)
        keys.append(((0, b, value, i) if b <= top else (1, -b, value, i), i))
    return [i for _key, i in sorted(keys)]


@given(
    cpus=st.lists(st.integers(0, 20), min_size=1, max_size=12),
    mask_bits=st.lists(st.booleans(), min_size=12, max_size=12),
    edges=st.lists(st.integers(0, 20), min_size=1, max_size=6, unique=True).map(lambda e: tuple(sorted(e))),
    demand=st.integers(1, 20),
    max_up=st.none() | st.integers(0, 6),
)
def test_select_matches_reference(cpus, mask_bits, edges, demand, max_up) -> None:
    state = ClusterState.from_nodes([make_node(f"n{i}").cpu(c).memory("1Gi").obj() for i, c in enumerate(cpus)])
    plugin = BucketFit({"cpu": BucketSpec(tuple(1000 * e for e in edges))}, max_up=max_up)
    plugin.attach(state)
    request = compile_request(make_workload("w").req(cpu=demand).obj(), state)
    mask = np.array(mask_bits[: len(cpus)]) & (state.free[0] >= demand * 1000)
    got = list(plugin.select(CycleState(), request, NodeBatch(state, mask), np.zeros(len(cpus), np.int64)))
    milli_edges = tuple(1000 * e for e in edges)
    want = reference_order([1000 * c for c in cpus], mask.tolist(), milli_edges, demand * 1000, max_up)
    assert got == want
    assert len(set(got)) == len(got) and all(mask[i] for i in got)
    # with the full feasible mask, the order is a permutation of every fitting node
    fits = np.flatnonzero(state.free[0] >= demand * 1000).tolist()
    assert sorted(search_order(plugin.index(state), "cpu", demand * 1000, max_up)) == fits


# End to end through the "buckets" profile ----------------------------------------------------------------
def test_end_to_end_buckets_profile_packs_best_fit() -> None:
    state = ClusterState.from_nodes(
        [
            Node(name="n0", allocatable={"cpu": "8", "memory": "16Gi"}, labels={"zone": "a"}),
            Node(name="n1", allocatable={"cpu": "8", "memory": "16Gi"}, labels={"zone": "a"}),
            Node(name="n2", allocatable={"cpu": "8", "memory": "16Gi"}, labels={"zone": "b"}),
        ]
    )
    scheduler = Scheduler(state, profile="buckets")  # default specs: cpu width 500m, memory width 1Gi
    placed = [
        # 3 cpu / 24 = 1/8 > 1Gi / 48Gi: cpu; K = [3000,3500) empty; all nodes in the last bucket -> n0
        scheduler.schedule_one(Workload(name="w1", requests={"cpu": "3", "memory": "1Gi"})),
        # 4.5 cpu: K = [4500,5000) empty; [5000,5500) holds n0 (5 left): best fit packs n0, not n1
        scheduler.schedule_one(Workload(name="w2", requests={"cpu": "4.5", "memory": "1Gi"})),
        # 1 cpu: n0 has 0.5 left (too small) -> the 8-cpu nodes, lowest index n1
        scheduler.schedule_one(Workload(name="w3", requests={"cpu": "1", "memory": "1Gi"})),
        # 2Gi / 48Gi > 0.1 / 24: memory; zone b only -> n2, though n0 (14Gi left) fits memory best
        scheduler.schedule_one(
            Workload(name="w4", requests={"cpu": "100m", "memory": "2Gi"}, nodeSelector={"zone": "b"})
        ),
        # 7 cpu: n1 has exactly 7 left (K = [7000,7500)) -> n1 before n2 (7.9)
        scheduler.schedule_one(Workload(name="w5", requests={"cpu": "7", "memory": "1Gi"})),
    ]
    assert [b.node for b in placed] == ["n0", "n0", "n1", "n2", "n1"]
    index = state.extras["buckets"]
    assert isinstance(index, BucketIndex) and index.violations() == []
    state.check_invariants()
    # both packed nodes in the lowest buckets: n1 0 left -> [0,500), n0 500 left -> [500,1000)
    assert index.members("cpu", 0) == [(0, 1)] and index.members("cpu", 1) == [(500, 0)]


def test_index_attached_after_snapshot_survives_restore() -> None:
    state = cluster("5", "4.5")
    snap = state.snapshot()
    scheduler = Scheduler(state, profile="buckets")
    index = state.extras["buckets"]
    state.restore(snap)  # the index was attached after the snapshot: restore keeps and refills it
    assert state.extras["buckets"] is index and index.violations() == []
    assert scheduler.schedule_one(ask("4")).node == "n1"
    assert index.violations() == []


def test_second_plugin_with_other_specs_refused() -> None:
    state = cluster("8")
    BucketFit(CPU4).attach(state)
    BucketFit(CPU4).attach(state)  # same specs: shares the index
    with pytest.raises(ValidationError, match="different bucket specs"):
        BucketFit(CPU6).attach(state)


# Args -----------------------------------------------------------------------------------------------------
def test_args_parse_quantities() -> None:
    plugin = BucketFit.from_args(
        {
            "resources": {"cpu": {"lower": "500m", "width": 1, "count": 3}, "memory": {"edges": [0, "4Gi", "16Gi"]}},
            "maxUp": 2,
        }
    )
    # cpu in millicores: 500, 1500, 2500; memory in bytes
    assert plugin.specs == {"cpu": BucketSpec((500, 1500, 2500)), "memory": BucketSpec((0, 4 * GI, 16 * GI))}
    assert plugin.max_up == 2
    assert BucketFit.from_args({}).specs == {} and BucketFit.from_args({}).max_up is None
    aliased = BucketFit.from_args({"resources": {"koordinator.sh/gpu-core": {"edges": [0, 50]}}})
    assert aliased.specs == {"gpu-core": BucketSpec((0, 50))}


@pytest.mark.parametrize(
    ("args", "path"),
    [
        pytest.param({"resources": {"cpu": {"width": 0, "count": 4}}}, "args.resources.cpu.width", id="zero-width"),
        pytest.param(
            {"resources": {"cpu": {"width": "2x", "count": 4}}}, "args.resources.cpu.width", id="bad-quantity"
        ),
        pytest.param({"resources": {"cpu": {"width": "1"}}}, "args.resources.cpu.count", id="missing-count"),
        pytest.param({"resources": {"cpu": {"width": "1", "count": 0}}}, "args.resources.cpu.count", id="zero-count"),
        pytest.param(
            {"resources": {"cpu": {"lower": "-1", "width": "1", "count": 2}}},
            "args.resources.cpu.lower",
            id="negative-lower",
        ),
        pytest.param(
            {"resources": {"memory": {"edges": ["4Gi", "1Gi"]}}}, "args.resources.memory.edges.1", id="edges-descending"
        ),
        pytest.param({"resources": {"memory": {"edges": []}}}, "args.resources.memory.edges", id="edges-empty"),
        pytest.param({"resources": {"cpu": {"edges": [0], "width": 1}}}, "args.resources.cpu", id="both-forms"),
        pytest.param({"resources": {"cpu": {"step": 1}}}, "args.resources.cpu.step", id="unknown-field"),
        pytest.param({"resources": {"bad name!": {"edges": [0]}}}, "args.resources.bad name!", id="bad-resource-name"),
        pytest.param({"maxUp": -1}, "args.maxUp", id="negative-maxUp"),
        pytest.param({"maxUp": "two"}, "args.maxUp", id="maxUp-not-int"),
        pytest.param({"buckets": {}}, "args.buckets", id="unknown-arg"),
    ],
)
def test_bad_args_name_the_field(args: dict, path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        BucketFit.from_args(args)
    assert path in [e.path for e in caught.value.errors]


def test_bad_args_through_a_profile() -> None:
    bad = {"resources": {"cpu": {"width": 0, "count": 2}}}
    profile = {"name": "b", "plugins": [{"name": "ResourcesFit"}, {"name": "BucketFit", "args": bad}]}
    with pytest.raises(ValidationError) as caught:
        Scheduler(cluster("8"), profile)
    assert [e.path for e in caught.value.errors] == ["plugins[1].args.resources.cpu.width"]
