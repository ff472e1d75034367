"""DeviceShare's filter shortcuts give what the straightforward code gives:

* on a few changed nodes (a subset batch) the filter, joint scopes included (they reuse the
  per-type fits the filter computed on the same rows), equals the whole-cluster filter (cached
  fit counts and joint verdicts) at those rows;
* a node's cached device layout key (the offer memo's) equals the key rebuilt from its arrays,
  across re-registrations (accepted or refused) and bindings.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState, StateError
from finesched.state.devices import DeviceAccounts


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    """GPUs on sparse minors (some unhealthy, 40 or 80 GiB) and up to three RDMA NICs, on 2 NUMA
    nodes and 3 PCIe switches (some devices without either)."""
    minors = draw(st.lists(st.integers(0, 7), min_size=1, max_size=6, unique=True))
    numa = st.sampled_from([None, 0, 1])
    pcie = st.sampled_from([None, "p0", "p1", "p2"])
    devices: list[dict[str, Any]] = [
        {
            "type": "gpu",
            "minor": m,
            "health": draw(st.sampled_from([True, True, True, False])),
            "numa": draw(numa),
            "pcie": draw(pcie),
            "resources": {
                "gpu-core": 100,
                "gpu-memory-ratio": 100,
                "gpu-memory": draw(st.sampled_from(["40Gi", "80Gi"])),
            },
        }
        for m in minors
    ]
    devices += [
        {"type": "rdma", "minor": r, "numa": draw(numa), "pcie": draw(pcie)} for r in range(draw(st.integers(0, 3)))
    ]
    return Node.model_validate(
        {
            "name": name,
            "allocatable": {"cpu": "64", "memory": "64Gi"},
            "numaZones": [{"id": 0}, {"id": 1}],
            "devices": devices,
        }
    )


#: (requests, joint scope or None)
REQUESTS: list[tuple[dict[str, Any], str | None]] = [
    ({"koordinator.sh/gpu": 25}, None),
    ({"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}, None),
    ({"koordinator.sh/gpu-core": 20, "koordinator.sh/gpu-memory": "10Gi"}, None),
    ({"nvidia.com/gpu": 2}, None),
    ({"koordinator.sh/rdma": 50}, None),
    ({"nvidia.com/gpu": 1, "koordinator.sh/rdma": 100}, "SamePCIe"),
    ({"nvidia.com/gpu": 1, "koordinator.sh/rdma": 50}, "SameNUMA"),
    ({"nvidia.com/gpu": 2, "koordinator.sh/rdma": 100}, "SamePCIe"),
    ({"koordinator.sh/gpu": 50, "koordinator.sh/rdma": 50}, "SameNUMA"),
]


def workload(name: str, asked: int) -> Workload:
    requests, scope = REQUESTS[asked]
    data: dict[str, Any] = {"name": name, "requests": {"cpu": "1", **requests}}
    if scope is not None:
        data["deviceJointAllocate"] = {"deviceTypes": ["gpu", "rdma"], "requiredScope": scope}
    return Workload.model_validate(data)


def assert_layout_keys_fresh(accounts: DeviceAccounts, n: int) -> None:
    for acc in accounts.types.values():
        kept = list(acc.shape_keys)
        for i in range(n):
            if acc.count[i] and kept[i] is not None:  # None: not built yet (or dropped by a reshape)
                acc.shape_keys[i] = None
                assert acc.shape_key(i) == kept[i], (acc.name, i)


@given(
    cluster=st.lists(st.integers(0, 10**6), min_size=1, max_size=6, unique=True).flatmap(
        lambda ids: st.tuples(*(nodes(f"n{k}") for k in ids))
    ),
    placed=st.lists(st.sampled_from(range(len(REQUESTS))), max_size=10),
    asked=st.sampled_from(range(len(REQUESTS))),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_subset_filter_equals_the_whole_cluster_filter(
    cluster: tuple, placed: list[int], asked: int, data: st.DataObject
) -> None:
    state = ClusterState.from_nodes(list(cluster))
    scheduler = Scheduler(state)
    plugin = next(p for p in scheduler.framework.plugins if isinstance(p, DeviceShare))
    assert plugin.accounts is not None
    for k, r in enumerate(placed):
        with contextlib.suppress(FitError):
            scheduler.schedule_one(workload(f"p{k}", r))
    if data.draw(st.booleans()):  # re-register one node with other devices (refused: nothing changes)
        with contextlib.suppress(StateError):
            state.update_node(data.draw(nodes(cluster[data.draw(st.integers(0, len(cluster) - 1))].name)))
    assert_layout_keys_fresh(plugin.accounts, state.n)
    w = workload("w", asked)
    request = scheduler._compiler.compile(w, request_shape(w))
    cycle = CycleState()
    if not plugin.pre_filter(cycle, request, NodeBatch(state)).ok:
        return
    whole = plugin.filter(cycle, request, NodeBatch(state)).mask
    index = np.array(sorted(set(data.draw(st.lists(st.integers(0, state.n - 1), min_size=1)))), dtype=np.intp)
    part = plugin.filter(cycle, request, NodeBatch(state, index=index)).mask
    assert part.tolist() == whole[index].tolist()
