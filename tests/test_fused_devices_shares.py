"""DeviceShare's per-decision shortcuts give what the straightforward code gives, bit for bit:

* device shares on a few changed nodes equal the whole-cluster shares (`DeviceAccounts.share_after`)
  at those rows;
* an offer's memoized device-allocated annotation is the one formatted from its grants.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from finesched.model.device_allocated import format_device_allocated
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare
from finesched.plugins.deviceshare.plugin import _RULES
from finesched.plugins.deviceshare.scoring import device_shares
from finesched.sched.cycle_state import CycleState
from finesched.sched.diagnosis import FitError
from finesched.sched.framework import NodeBatch
from finesched.sched.memo import request_shape
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    """GPUs on sparse minors (some unhealthy, 40 or 80 GiB) and up to two RDMA NICs."""
    minors = draw(st.lists(st.integers(0, 5), min_size=3, max_size=6, unique=True))
    devices: list[dict[str, Any]] = [
        {
            "type": "gpu",
            "minor": m,
            "health": draw(st.sampled_from([True, True, True, False])),
            "resources": {
                "gpu-core": 100,
                "gpu-memory-ratio": 100,
                "gpu-memory": draw(st.sampled_from(["40Gi", "80Gi"])),
            },
        }
        for m in minors
    ]
    devices += [{"type": "rdma", "minor": r} for r in range(draw(st.integers(0, 2)))]
    return Node.model_validate({"name": name, "allocatable": {"cpu": "8", "memory": "8Gi"}, "devices": devices})


REQUESTS = [
    {"koordinator.sh/gpu": 25},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 20, "koordinator.sh/gpu-memory": "10Gi"},
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"koordinator.sh/rdma": 50},
    {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 100},
]


@given(
    cluster=st.lists(st.integers(0, 10**6), min_size=1, max_size=5, unique=True).flatmap(
        lambda ids: st.tuples(*(nodes(f"n{k}") for k in ids))
    ),
    placed=st.lists(st.sampled_from(range(len(REQUESTS))), max_size=8),
    asked=st.sampled_from(range(len(REQUESTS))),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_subset_shares_and_annotations_equal_the_straightforward_code(
    cluster: tuple, placed: list[int], asked: int, data: st.DataObject
) -> None:
    state = ClusterState.from_nodes(list(cluster))
    scheduler = Scheduler(state)
    plugin = next(p for p in scheduler.framework.plugins if isinstance(p, DeviceShare))
    for k, r in enumerate(placed):
        workload = Workload.model_validate({"name": f"p{k}", "requests": {"cpu": "1", **REQUESTS[r]}})
        with contextlib.suppress(FitError):
            binding = scheduler.schedule_one(workload)
            assert binding.annotations["scheduling.koordinator.sh/device-allocated"] == format_device_allocated(
                binding.devices
            )
    workload = Workload.model_validate({"name": "w", "requests": {"cpu": "1", **REQUESTS[asked]}})
    cycle = CycleState()
    if plugin.pre_filter(cycle, scheduler._compiler.compile(workload, request_shape(workload)), NodeBatch(state)).ok:
        requests = [tr for tr, _ in cycle.read(_RULES).items]
        full = device_shares(plugin.accounts, requests, NodeBatch(state))  # type: ignore[arg-type]
        index = np.array(data.draw(st.lists(st.integers(0, state.n - 1), min_size=1)), dtype=np.intp)
        subset = device_shares(plugin.accounts, requests, NodeBatch(state, index=index))  # type: ignore[arg-type]
        assert len(full) == len(subset)
        for whole, part in zip(full, subset, strict=True):
            assert whole[index].tobytes() == part.tobytes()
