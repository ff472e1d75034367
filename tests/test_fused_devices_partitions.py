"""The partition filter tests every node against its own table in one padded pass
(`PartitionTables.plan_matrix`, plugins/deviceshare/partitions.py). On random clusters (tables,
Honor/Prefer/none, busy GPUs) and random whole-GPU requests with or without a gpu-partition-spec,
its mask over all nodes and over a subset of rows equals the per-table loop it replaced (kept here
as the reference), and the scheduler's decisions stay what the reference filter gives."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from finesched.model.binding import Binding, DeviceGrant
from finesched.model.node import Node
from finesched.model.resources import GPU
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare
from finesched.plugins.deviceshare.partitions import _bandwidth, combined, partition_mask, partition_request
from finesched.plugins.deviceshare.request import compile_rule, fit_mask, normalize_device_request
from finesched.state.cluster import ClusterState
from finesched.state.devices import node_rows
from test_gpu_partitions import TABLE

SMALL: dict[str, list[dict[str, Any]]] = {
    "2": [{"minors": [0, 1], "allocationScore": 1, "ringBusBandwidth": "400Gi"}],
    "1": [{"minors": [m], "allocationScore": 1} for m in range(4)],
}
SPECS = [
    None,
    {"allocatePolicy": "Restricted"},
    {"allocatePolicy": "BestEffort"},
    {"ringBusBandwidth": "300Gi"},
    {"allocatePolicy": "Restricted", "ringBusBandwidth": "100Gi"},
]


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    gpus = draw(st.sampled_from([4, 8]))
    table = draw(st.sampled_from([None, SMALL, TABLE] if gpus == 8 else [None, SMALL]))
    data: dict[str, Any] = {
        "name": name,
        "allocatable": {"cpu": "64", "memory": "512Gi"},
        "devices": [{"type": "gpu", "minor": m, "resources": {"gpu-memory": "80Gi"}} for m in range(gpus)],
    }
    if table is not None:
        data["gpuPartitions"] = table
    policy = draw(st.sampled_from([None, "Honor", "Prefer"]))
    if policy is not None:
        data["policies"] = {"gpuPartitionPolicy": policy}
    return Node.model_validate(data)


def reference_mask(state: ClusterState, plugin: DeviceShare, dreq: Any, rule: Any, rows: Any) -> np.ndarray:
    """The per-table loop the padded pass replaced."""
    tables, acc = plugin.partitions, plugin.accounts.types[GPU]  # type: ignore[union-attr]
    tr = partition_request(dreq)
    spec = dreq.partition
    restricted = spec is not None and spec.allocate_policy == "Restricted"
    tid = tables.table_id[rows]
    honor = tables.honor[rows] | (spec is not None)
    ok = ~honor
    if combined(dreq) or not honor.any():
        return ok
    fits = fit_mask(rule, *node_rows(acc, rows))
    bits = (fits.astype(np.int64) << np.arange(fits.shape[1], dtype=np.int64)).sum(axis=1)
    for t in np.unique(tid[honor & (tid >= 0)]).tolist():
        sel = honor & (tid == t)
        plan = tables.tables[t].plans.get(tr.count)
        if plan is None:
            continue
        masks = plan.masks[plan.allowed(restricted, _bandwidth(spec))]
        ok[sel] = ((bits[sel, None] & masks[None, :]) == masks[None, :]).any(axis=1)
    return ok


@given(
    cluster=st.lists(st.integers(0, 10**6), min_size=1, max_size=6, unique=True).flatmap(
        lambda ids: st.tuples(*(nodes(f"n{k}") for k in ids))
    ),
    busy=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), max_size=8),
    count=st.sampled_from([1, 2, 3, 4, 8]),
    spec=st.sampled_from(SPECS),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_padded_pass_equals_the_per_table_loop(
    cluster: tuple[Node, ...], busy: list[tuple[int, int]], count: int, spec: Any, data: st.DataObject
) -> None:
    state = ClusterState.from_nodes(list(cluster))
    plugin = DeviceShare()
    plugin.attach(state)
    grants = {"gpu-core": 10, "gpu-memory-ratio": 10, "gpu-memory": 8 * 2**30}
    for k, (i, minor) in enumerate(busy):
        node = cluster[i % len(cluster)]
        if minor < sum(d.type == GPU for d in node.devices):
            binding = Binding(
                workload=f"o/b{k}", node=node.name, devices={"gpu": [DeviceGrant(minor=minor, resources=grants)]}
            )
            state.assume(binding)
    requests = {"cpu": "1", "nvidia.com/gpu": count}
    workload = Workload.model_validate({"name": "w", "requests": requests, "gpuPartitionSpec": spec})
    dreq = normalize_device_request(workload.requests, device_types=tuple(plugin.accounts.types))  # type: ignore[union-attr]
    dreq = replace(dreq, partition=workload.gpu_partition_spec)
    rule = compile_rule(dreq.types[GPU], plugin.accounts.types[GPU].dims)  # type: ignore[union-attr]
    n = state.n
    full = partition_mask(plugin.accounts, plugin.partitions, dreq, rule, n, None)  # type: ignore[arg-type]
    assert np.array_equal(full, reference_mask(state, plugin, dreq, rule, slice(0, n)))
    index = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n)), dtype=np.intp)
    subset = partition_mask(plugin.accounts, plugin.partitions, dreq, rule, n, index)  # type: ignore[arg-type]
    assert np.array_equal(subset, reference_mask(state, plugin, dreq, rule, index))
