"""Which card a GPU share lands on: seed S0.5's two rules and who chooses between them.

S0.5 (seed 000, patent CN111381957A): on the chosen node, the *least used* device (balance) or the
*most used device that still fits* (keeps big devices free for big requests). Precedence, first set
wins (README "Which card"): the workload's deviceAllocateStrategy; the node's (policies, else the
label finesched.io/device-allocate-strategy); the profile's DeviceShare ``strategy`` — MostAllocated
in the built-in ``binpack`` profile (it packs nodes *and* their devices), LeastAllocated elsewhere.

Every case: one node, two 80Gi GPUs; GPU 0 already holds a 50 % share. Then a 30 % share arrives.
MostAllocated: GPU 0 (50 % used, 30 % still fits) -> minor 0. LeastAllocated: GPU 1 (idle) -> minor 1.
"""

from __future__ import annotations

from typing import Any

import pytest

from builders import make_node, make_workload
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.resources import ResourceVector
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

GI = 1 << 30
SHARE_30 = {"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory-ratio": "30"}


def chosen_card(profile: Any, node_fields: dict[str, Any], workload_fields: dict[str, Any]) -> int:
    node = make_node("n1").cpu("8").memory("16Gi").gpus(2).set(**node_fields).obj()
    state = ClusterState.from_nodes([node])
    s = Scheduler(state, profile)
    half = ResourceVector({"gpu-core": 50, "gpu-memory-ratio": 50, "gpu-memory": 40 * GI})
    state.assume(
        Binding(
            workload="default/first",
            node="n1",
            tenant="default",
            requests=ResourceVector({"cpu": 1000, "pods": 1}),
            devices={"gpu": [DeviceGrant(minor=0, resources=half)]},
        )
    )
    binding = s.schedule_one(make_workload("w").req(cpu="1", **SHARE_30).set(**workload_fields).obj())
    (grant,) = binding.devices["gpu"]
    return grant.minor


LEAST = {"deviceAllocateStrategy": "LeastAllocated"}
MOST = {"deviceAllocateStrategy": "MostAllocated"}
CUSTOM_MOST = {
    "name": "packing-cards",
    "plugins": [{"name": "ResourcesFit"}, {"name": "DeviceShare", "args": {"strategy": "MostAllocated"}}],
}

CASES = [
    # the profile decides when nobody else does
    pytest.param("binpack", {}, {}, 0, id="binpack-most-used-that-fits"),
    pytest.param("default", {}, {}, 1, id="default-least-used"),
    pytest.param("spread", {}, {}, 1, id="spread-least-used"),
    pytest.param("buckets", {}, {}, 1, id="buckets-least-used"),
    pytest.param(CUSTOM_MOST, {}, {}, 0, id="custom-profile-arg"),
    # the node's strategy wins over the profile
    pytest.param("binpack", {"policies": LEAST}, {}, 1, id="binpack-node-policy-least"),
    pytest.param(
        "binpack",
        {"labels": {"finesched.io/device-allocate-strategy": "LeastAllocated"}},
        {},
        1,
        id="binpack-node-label-least",
    ),
    pytest.param("default", {"policies": MOST}, {}, 0, id="default-node-policy-most"),
    # the workload's wins over both
    pytest.param("binpack", {}, LEAST, 1, id="binpack-workload-least"),
    pytest.param("default", {}, MOST, 0, id="default-workload-most"),
    pytest.param("binpack", {"policies": LEAST}, MOST, 0, id="workload-over-node"),
]


@pytest.mark.parametrize(("profile", "node_fields", "workload_fields", "minor"), CASES)
def test_card_choice_precedence(profile: Any, node_fields: dict, workload_fields: dict, minor: int) -> None:
    assert chosen_card(profile, node_fields, workload_fields) == minor
