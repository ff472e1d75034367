"""Pipelined regions (S2.2): pipelined edges join, blocking edges split, cyclic region dependencies merge,
all sources in one region when asked; connected components."""

from __future__ import annotations

import itertools

import pytest
from dataflow_builders import blocking, chain, edge, make_job, task

from finesched.dataflow import compile_job
from finesched.dataflow.graph import JobGraph
from finesched.dataflow.regions import connected_components, pipelined_regions, pointwise_links


def regions_of(ids: str, edges: list[dict[str, str]], same_region: bool = True) -> list[set[str]]:
    job = make_job(chain(*ids.split()), edges)
    return [set(r) for r in pipelined_regions(JobGraph.from_job(job), same_region)]


@pytest.mark.parametrize(
    ("ids", "edges", "want"),
    [
        # a -> b -> c, all pipelined: one region
        pytest.param("a b c", [edge("a", "b"), edge("b", "c")], [{"a", "b", "c"}], id="pipelined-chain"),
        # a -> b blocking: the consumer can start after the producer finished: two regions
        pytest.param("a b", [blocking("a", "b")], [{"a"}, {"b"}], id="blocking-splits"),
        # a -> b -> c with only b -> c blocking: {a, b}, {c}
        pytest.param("a b c", [edge("a", "b"), blocking("b", "c")], [{"a", "b"}, {"c"}], id="blocking-in-the-middle"),
        # diamond a -> b, a -> c, b -> d, c -> d, all pipelined: one region
        pytest.param(
            "a b c d",
            [edge("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d")],
            [{"a", "b", "c", "d"}],
            id="diamond-pipelined",
        ),
        # diamond whose a -> b is blocking: b still reaches a through b -> d -> c -> a pipelined: one region
        pytest.param(
            "a b c d",
            [blocking("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d")],
            [{"a", "b", "c", "d"}],
            id="diamond-one-blocking-side-rejoins",
        ),
        # diamond, all blocking: every task its own region (no cycle among them: a before b, c before d)
        pytest.param(
            "a b c d",
            [blocking("a", "b"), blocking("a", "c"), blocking("b", "d"), blocking("c", "d")],
            [{"a"}, {"b"}, {"c"}, {"d"}],
            id="diamond-all-blocking",
        ),
        # a -> b pipelined, a -> c blocking, c -> b blocking: {c} reads {a, b} and {a, b} reads {c}: merge
        pytest.param(
            "a b c",
            [edge("a", "b"), blocking("a", "c"), blocking("c", "b")],
            [{"a", "b", "c"}],
            id="cyclic-region-dependency-merges",
        ),
        # two cycles through one region: {a, d} <-> {b} and {a, d} <-> {c}: all one region; e stays apart
        pytest.param(
            "a b c d e",
            [
                edge("a", "d"),
                blocking("a", "b"),
                blocking("b", "d"),
                blocking("a", "c"),
                blocking("c", "d"),
                blocking("d", "e"),
            ],
            [{"a", "b", "c", "d"}, {"e"}],
            id="two-cycles-one-region",
        ),
        # pointwise pipelined edges join at the task level like all-to-all ones
        pytest.param(
            "a b c", [edge("a", "b", pattern="pointwise"), blocking("b", "c")], [{"a", "b"}, {"c"}], id="pointwise"
        ),
        # pointwise blocking splits like all-to-all blocking
        pytest.param("a b", [edge("a", "b", "blocking", "pointwise")], [{"a"}, {"b"}], id="pointwise-blocking"),
    ],
)
def test_regions(ids: str, edges: list[dict[str, str]], want: list[set[str]]) -> None:
    assert regions_of(ids, edges) == want


@pytest.mark.parametrize(
    ("same_region", "want"),
    [
        # a virtual source feeds s1 and s2: {s1, x, s2, y}
        pytest.param(True, [{"s1", "x", "s2", "y"}], id="all-sources-together"),
        pytest.param(False, [{"s1", "x"}, {"s2", "y"}], id="sources-apart"),
    ],
)
def test_all_sources_in_same_region(same_region: bool, want: list[set[str]]) -> None:
    assert regions_of("s1 x s2 y", [edge("s1", "x"), edge("s2", "y")], same_region) == want


def test_virtual_source_joins_sources_only_not_across_blocking_edges() -> None:
    # s1 -> x and s2 -> y blocking: the sources share a region, their consumers do not
    got = regions_of("s1 x s2 y", [blocking("s1", "x"), blocking("s2", "y")], True)
    assert got == [{"s1", "s2"}, {"x"}, {"y"}]


@pytest.mark.parametrize(
    ("mode", "option", "want_regions"),
    [
        pytest.param("streaming", None, 1, id="streaming-default-together"),
        pytest.param("batch", None, 2, id="batch-default-apart"),
        pytest.param("batch", True, 1, id="batch-user-says-together"),
        pytest.param("streaming", False, 2, id="streaming-user-says-apart"),
    ],
)
def test_all_sources_default_follows_mode_unless_set(mode: str, option: bool | None, want_regions: int) -> None:
    spec = {"mode": mode} if option is None else {"mode": mode, "allSourcesInSameRegion": option}
    job = make_job(chain("s1", "x", "s2", "y"), [edge("s1", "x"), edge("s2", "y")], **spec)
    assert len(compile_job(job).regions) == want_regions
    # the compile option overrides the manifest either way
    assert len(compile_job(job, all_sources_in_same_region=want_regions == 2).regions) == 3 - want_regions


def test_connected_components_ignore_direction_and_edge_type() -> None:
    job = make_job(chain("a", "b", "c", "d", "e"), [blocking("a", "b"), edge("c", "b"), edge("d", "e")])
    assert connected_components(JobGraph.from_job(job)) == [frozenset("abc"), frozenset("de")]


def test_long_chains_do_not_hit_the_recursion_limit() -> None:
    ids = [f"t{i}" for i in range(3000)]
    edges = [blocking(a, b) for a, b in itertools.pairwise(ids)]
    job = make_job(chain(*ids), edges)
    assert len(compile_job(job).regions) == 3000


@pytest.mark.parametrize(
    ("producers", "consumers", "want"),
    [
        pytest.param(3, 3, [(0, 0), (1, 1), (2, 2)], id="equal-one-to-one"),
        # fan-in 4 -> 2: consumer j reads producers [2j, 2j + 2)
        pytest.param(4, 2, [(0, 0), (1, 0), (2, 1), (3, 1)], id="fan-in"),
        # fan-out 2 -> 3: consumer j reads producer j * 2 // 3 = 0, 0, 1 (producer 0 feeds ceil(3/2) = 2)
        pytest.param(2, 3, [(0, 0), (0, 1), (1, 2)], id="fan-out"),
    ],
)
def test_pointwise_links(producers: int, consumers: int, want: list[tuple[int, int]]) -> None:
    assert pointwise_links(producers, consumers) == want


def _subtask_regions(tasks: list[dict[str, object]], edges: list[dict[str, str]]) -> list[set[str]]:
    regions = compile_job(make_job(tasks, edges, allSourcesInSameRegion=False)).subtask_regions()
    return [{f"{t}{i}" for t, i in region} for region in regions]


@pytest.mark.parametrize(
    ("tasks", "edges", "want"),
    [
        # a (2) -> b (2) pointwise: the task level has one region, the subtask level two
        pytest.param(
            [task("a", p=2), task("b", p=2)],
            [edge("a", "b", pattern="pointwise")],
            [{"a0", "b0"}, {"a1", "b1"}],
            id="pointwise-splits-per-subtask",
        ),
        # all-to-all joins every subtask
        pytest.param([task("a", p=2), task("b", p=2)], [edge("a", "b")], [{"a0", "a1", "b0", "b1"}], id="all-to-all"),
        # fan-in 4 -> 2 pointwise: {a0, a1, b0}, {a2, a3, b1}
        pytest.param(
            [task("a", p=4), task("b", p=2)],
            [edge("a", "b", pattern="pointwise")],
            [{"a0", "a1", "b0"}, {"a2", "a3", "b1"}],
            id="fan-in",
        ),
        # {a0, b0} and {a1, b1} both feed c0 (blocking) and both read from c0 (c -> b blocking): one cycle, one region
        pytest.param(
            [task("a", p=2), task("b", p=2), task("c", p=1)],
            [edge("a", "b", pattern="pointwise"), blocking("a", "c"), blocking("c", "b")],
            [{"a0", "a1", "b0", "b1", "c0"}],
            id="cyclic-dependency-merges",
        ),
        # blocking pointwise: every subtask alone
        pytest.param(
            [task("a", p=2), task("b", p=2)],
            [edge("a", "b", "blocking", "pointwise")],
            [{"a0"}, {"a1"}, {"b0"}, {"b1"}],
            id="blocking-pointwise",
        ),
    ],
)
def test_subtask_regions(tasks: list[dict[str, object]], edges: list[dict[str, str]], want: list[set[str]]) -> None:
    assert _subtask_regions(tasks, edges) == want
