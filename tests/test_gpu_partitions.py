"""GPU partition tables through the scheduler: Honor vs Prefer, Restricted vs BestEffort, allocationScore,
ring bandwidth, and which free partition is taken. Sources: Koordinator's proposal
docs/proposals/scheduling/20241008-gpu-partition-api.md and its deviceshare ``allocateByPartition``
(PROTOCOLS.md section 2 for the keys); model/gpu_partitions.py and plugins/deviceshare/partitions.py
say what we follow and where we differ."""

from __future__ import annotations

from typing import Any

import pytest

from finesched.model.binding import Binding, DeviceGrant
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from finesched.state.invariants import check

PAIRS = [[0, 1], [2, 3], [4, 5], [6, 7]]
#: An HGX-style table: the eight, two fours, four NVLink pairs (score 1), two cross pairs (score 0), ones.
TABLE: dict[str, list[dict[str, Any]]] = {
    "8": [{"minors": list(range(8)), "allocationScore": 1, "ringBusBandwidth": "400Gi"}],
    "4": [{"minors": [0, 1, 2, 3], "allocationScore": 1, "ringBusBandwidth": "400Gi"},
          {"minors": [4, 5, 6, 7], "allocationScore": 1, "ringBusBandwidth": "400Gi"}],
    "2": [*({"minors": p, "allocationScore": 1, "gpuLinkType": "NVLink", "ringBusBandwidth": "400Gi"} for p in PAIRS),
          {"minors": [1, 2], "allocationScore": 0, "ringBusBandwidth": "200Gi"},
          {"minors": [5, 6], "allocationScore": 0, "ringBusBandwidth": "200Gi"}],
    "1": [{"minors": [m], "allocationScore": 1} for m in range(8)],
}  # fmt: skip


def node(policy: str | None = "Honor", table: dict[str, Any] | None = TABLE, label: bool = False) -> Node:
    data: dict[str, Any] = {
        "name": "hgx",
        "allocatable": {"cpu": "64", "memory": "512Gi"},
        "devices": [{"type": "gpu", "minor": m, "resources": {"gpu-memory": "80Gi"}} for m in range(8)],
    }
    if table is not None:
        data["gpuPartitions"] = table
    if policy is not None and label:
        data["labels"] = {"node.koordinator.sh/gpu-partition-policy": policy}
    elif policy is not None:
        data["policies"] = {"gpuPartitionPolicy": policy}
    return Node.model_validate(data)


def busy(*minors: int) -> list[Binding]:
    """A shared-GPU binding on each minor (the GPU is then not free for a partition)."""
    grants = {"gpu-core": 10, "gpu-memory-ratio": 10, "gpu-memory": 8 * 2**30}
    return [
        Binding(workload=f"other/b{m}", node="hgx", devices={"gpu": [DeviceGrant(minor=m, resources=grants)]})
        for m in minors
    ]


def ask(gpus: int, spec: dict[str, Any] | None = None, **extra: Any) -> Workload:
    data: dict[str, Any] = {"name": "w", "namespace": "ml", "requests": {"cpu": "1", "nvidia.com/gpu": gpus}, **extra}
    if spec is not None:
        data["gpuPartitionSpec"] = spec
    return Workload.model_validate(data)


def place(n: Node, w: Workload, held: list[Binding] = ()) -> list[int] | str:  # type: ignore[assignment]
    state = ClusterState.from_nodes([n])
    for b in held:
        state.assume(b)
    scheduler = Scheduler(state)
    try:
        binding = scheduler.schedule_one(w)
    except FitError as exc:
        return str(exc)
    assert check(state) == []
    return binding.device_minors("gpu")


@pytest.mark.parametrize(
    ("policy", "used", "gpus", "spec", "want"),
    [
        # all free: the lowest pair among equals (every pair keeps one four and no eight)
        pytest.param("Honor", (), 2, None, [0, 1], id="free-node-lowest-pair"),
        # GPU 0 busy: [2,3] keeps the four 4-7 whole, [4,5] and [6,7] would break it
        pytest.param("Honor", (0,), 2, None, [2, 3], id="keeps-largest-partition-whole"),
        pytest.param("Prefer", (0,), 2, None, [2, 3], id="prefer-takes-a-partition-too"),
        # 0 3 4 7 busy: only the score-0 cross pairs are free
        pytest.param("Honor", (0, 3, 4, 7), 2, None, [1, 2], id="besteffort-goes-down-the-scores"),
        pytest.param("Honor", (0, 3, 4, 7), 2, {"allocatePolicy": "BestEffort"}, [1, 2], id="spec-besteffort"),
        pytest.param(
            "Honor", (0, 3, 4, 7), 2, {"allocatePolicy": "Restricted"},
            "no free 2-GPU partition (gpu-partition-policy Honor, gpu-partition-spec allocatePolicy Restricted)",
            id="restricted-only-top-score",
        ),
        pytest.param(
            "Prefer", (0, 3, 4, 7), 2, {"allocatePolicy": "Restricted"},
            "no free 2-GPU partition (gpu-partition-spec allocatePolicy Restricted)", id="spec-makes-prefer-binding",
        ),
        # 0 2 5 7 busy: no partition of 2 is free, but 1+3 / 4+6 are two free GPUs
        pytest.param(
            "Honor", (0, 2, 5, 7), 2, None, "no free 2-GPU partition (gpu-partition-policy Honor)", id="honor-refuses"
        ),
        pytest.param("Prefer", (0, 2, 5, 7), 2, None, [1, 3], id="prefer-falls-back"),
        # 3 GPUs: the table has no 3-GPU partitions
        pytest.param(
            "Honor", (), 3, None, "GPU partition table has no 3-GPU partition (gpu-partition-policy Honor)",
            id="honor-unsupported-count",
        ),
        pytest.param("Prefer", (), 3, None, [0, 1, 2], id="prefer-unsupported-count"),
        # ring bandwidth: the score-0 pairs have 200Gi only
        pytest.param(
            "Honor", (0, 3, 4, 7), 2, {"ringBusBandwidth": "300Gi"},
            "no free 2-GPU partition (gpu-partition-policy Honor, gpu-partition-spec allocatePolicy BestEffort, "
            "ringBusBandwidth >= 300Gi)",
            id="bandwidth-excludes-slow-pairs",
        ),
        pytest.param("Honor", (0, 3), 2, {"ringBusBandwidth": "400Gi"}, [4, 5], id="bandwidth-ok"),
        pytest.param("Honor", (1,), 4, None, [4, 5, 6, 7], id="four"),
        pytest.param("Honor", (), 8, None, list(range(8)), id="eight"),
        # one GPU: the one that keeps the most pairs, fours, eights whole. With 1 busy: 0 (its pair is broken)
        pytest.param("Honor", (1,), 1, None, [0], id="one-gpu-fills-a-broken-pair"),
    ],
)  # fmt: skip
def test_partition_choice(policy: str, used: tuple[int, ...], gpus: int, spec: Any, want: Any) -> None:
    got = place(node(policy), ask(gpus, spec), busy(*used))
    if isinstance(want, str):
        assert isinstance(got, str) and want in got, got
    else:
        assert got == want


def test_policy_label_is_read() -> None:
    assert "no free 2-GPU partition (gpu-partition-policy Honor)" in str(
        place(node("Honor", label=True), ask(2), busy(0, 2, 5, 7))
    )
    assert place(node("Prefer", label=True), ask(2), busy(0, 2, 5, 7)) == [1, 3]


def test_no_table() -> None:
    plain = node(policy=None, table=None)
    assert place(plain, ask(2), busy(0)) == [1, 2]  # ordinary choice
    got = place(plain, ask(2, {"allocatePolicy": "BestEffort"}))
    assert "node has no GPU partition table (gpu-partition-spec allocatePolicy BestEffort)" in str(got)
    got = place(node("Honor", table=None), ask(2))
    assert "node has no GPU partition table (gpu-partition-policy Honor)" in str(got)


def test_shared_requests_ignore_the_table() -> None:
    w = Workload.model_validate({"name": "s", "requests": {"koordinator.sh/gpu": 50}})
    assert len(place(node("Honor"), w, busy(0, 2, 5, 7))) == 1  # type: ignore[arg-type]


def test_hint_on_honor_node_is_refused_with_a_reason() -> None:
    hinted = ask(2, deviceAllocateHint={"gpu": {"exclusivePolicy": "DeviceLevel"}})
    got = place(node("Honor"), hinted)
    assert "is not combined with a GPU partition table" in str(got)
    assert isinstance(place(node("Prefer"), hinted), list)


def test_invariant_flags_a_non_partition_set_on_an_honor_node() -> None:
    state = ClusterState.from_nodes([node("Honor")])
    Scheduler(state)  # attaches the extras
    whole = {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": 80 * 2**30}
    grants = [DeviceGrant(minor=m, resources=whole) for m in (0, 2)]
    state.assume(Binding(workload="x/bad", node="hgx", devices={"gpu": grants}))
    assert any("not a partition of its Honor table" in str(v) for v in check(state))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"2": [{"minors": [0, 1, 2]}]}, "3 minors under key 2"),
        ({"2": [{"minors": [0, 9]}]}, "no shareable GPU has minor(s) [9]"),
        ({"2": [{"minors": [1, 1]}]}, "names each GPU once"),
        ({"0": []}, "GPU counts, whole numbers >= 1"),
    ],
)
def test_bad_tables_name_the_field(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="gpuPartitions") as exc:
        node("Honor", table=table)
    assert message in str(exc.value)
