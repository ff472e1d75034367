"""Why a workload fits nowhere, as a table: requests x cluster shapes -> the exact reason. Every
reason of every filter that rejected a node counts on that node (kube-scheduler's NodeResourcesFit
reports each insufficient resource of a node), so no shortfall is hidden behind another."""

from __future__ import annotations

import pytest

from builders import make_node, make_workload
from finesched import ClusterState, Scheduler
from finesched.model.node import Node
from finesched.sched.diagnosis import FitError


def three_shapes() -> list[Node]:
    """A node with memory and 2 GPUs, one with 8 GPUs and less memory, one without GPUs."""
    return [
        make_node("a").cpu("32").memory("2Ti").gpus(2, memory="80Gi").obj(),
        make_node("b").cpu("32").memory("256Gi").gpus(8, memory="80Gi").obj(),
        make_node("c").cpu("32").memory("256Gi").obj(),
    ]


def zoned() -> list[Node]:
    return [
        make_node("small").cpu("2").memory("4Gi").obj(),
        make_node("big").cpu("16").memory("64Gi").label("zone", "a").obj(),
    ]


CASES = [
    # the example: cpu, memory and the GPU shortfall all counted
    (
        three_shapes,
        {"cpu": "64", "memory": "1Ti", "nvidia.com/gpu": "4"},
        {},
        "0/3 nodes available: 3 insufficient cpu, 2 insufficient memory, 1 insufficient free GPUs, 1 node has no gpu",
    ),
    (
        three_shapes,
        {"cpu": "64", "memory": "1Ti"},
        {},
        "0/3 nodes available: 3 insufficient cpu, 2 insufficient memory",
    ),
    (
        three_shapes,
        {"cpu": "1", "nvidia.com/gpu": "9"},
        {},
        "0/3 nodes available: 2 insufficient free GPUs, 1 node has no gpu",
    ),
    (
        three_shapes,
        {"cpu": "1", "memory": "3Ti", "nvidia.com/gpu": "3"},
        {},
        "0/3 nodes available: 3 insufficient memory, 1 insufficient free GPUs, 1 node has no gpu",
    ),
    # a selector and a resource: a node rejected by both counts under both
    (
        zoned,
        {"cpu": "4"},
        {"zone": "b"},
        "0/2 nodes available: 2 node(s) didn't match node selector, 1 insufficient cpu",
    ),
    (
        zoned,
        {"cpu": "32", "memory": "128Gi"},
        {"zone": "a"},
        "0/2 nodes available: 2 insufficient cpu, 2 insufficient memory, 1 node(s) didn't match node selector",
    ),
]


@pytest.mark.parametrize(("shape", "requests", "selector", "message"), CASES)
def test_every_failed_filter_is_counted(shape, requests, selector, message) -> None:  # type: ignore[no-untyped-def]
    builder = make_workload("w")
    for name, amount in requests.items():
        builder = builder.request(name, amount)
    if selector:
        builder = builder.selector(**selector)
    with pytest.raises(FitError) as info:
        Scheduler(ClusterState.from_nodes(shape())).schedule_one(builder.obj())
    assert info.value.message == message
    assert all(0 < count <= len(shape()) for count in info.value.reasons.values())
