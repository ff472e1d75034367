"""GPU partition tables (Koordinator, ../shared/reference/PROTOCOLS.md section 2; Koordinator proposal
20241008-gpu-partition-api): the sets of GPUs a node may hand out together, and a workload's wish.

Machines whose NVLink fabric is shared between tenants (NVIDIA Fabric Manager in SharedNVSwitch
mode) allow only a few GPU combinations per VM or pod. A node declares them per GPU count:
``{"2": [{"minors": [0, 1], "gpuLinkType": "NVLink", "ringBusBandwidth": "200Gi",
"allocationScore": 1}, ...], "4": [...]}`` (Koordinator's Device annotation
``scheduling.koordinator.sh/gpu-partitions``), and a policy (label
``node.koordinator.sh/gpu-partition-policy``): ``Honor`` = only those sets, ``Prefer`` = those first.
A workload may say ``gpu-partition-spec`` ``{"allocatePolicy": "Restricted" | "BestEffort",
"ringBusBandwidth": qty}``: any spec makes the table binding for it (Koordinator's
``honorGPUPartition``); Restricted takes only the partitions of the highest allocationScore, BestEffort
goes down the scores; ``ringBusBandwidth`` keeps partitions whose ring bandwidth is at least that.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, NonNegativeInt, field_validator

from finesched.model.base import Model
from finesched.model.resources import ByteQuantity

#: Koordinator's names (apis/extension): the Device annotation, the node label, the pod annotation.
ANNOTATION_GPU_PARTITIONS = "scheduling.koordinator.sh/gpu-partitions"
LABEL_GPU_PARTITION_POLICY = "node.koordinator.sh/gpu-partition-policy"
ANNOTATION_GPU_PARTITION_SPEC = "scheduling.koordinator.sh/gpu-partition-spec"
PARTITION_POLICIES = ("Honor", "Prefer")
ALLOCATE_POLICIES = ("Restricted", "BestEffort")
GPUPartitionPolicy = Literal["Honor", "Prefer"]
PartitionAllocatePolicy = Literal["Restricted", "BestEffort"]


class GPUPartition(Model):
    """One allowed set of GPUs (minors), its link type, ring all-reduce bus bandwidth (bytes/s) and
    allocationScore (higher = better for the node's remaining allocations)."""

    minors: tuple[NonNegativeInt, ...] = Field(min_length=1)
    gpu_link_type: str | None = None
    ring_bus_bandwidth: ByteQuantity | None = None
    allocation_score: int = 0

    @field_validator("minors")
    @classmethod
    def _distinct(cls, minors: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(minors)) != len(minors):
            raise ValueError(f"a partition names each GPU once, got {list(minors)}")
        return tuple(sorted(minors))


class GPUPartitionSpec(Model):
    """A workload's ``gpu-partition-spec`` (see the module docstring)."""

    allocate_policy: PartitionAllocatePolicy = "BestEffort"
    ring_bus_bandwidth: ByteQuantity | None = None


#: A table's keys as JSON writes them: a GPU count >= 1 in decimal digits (the OpenAPI document's
#: ``propertyNames``; `GPUCount` holds the model to the same rule).
GPU_COUNT_PATTERN = "^[1-9][0-9]*$"
_GPU_COUNT = re.compile(GPU_COUNT_PATTERN)


def _count_key(key: object) -> object:
    """A table key as a count: the digits JSON writes (``"2"``) or an int, nothing else that int()
    would also read (``"01"``, ``" 2"``, ``"+2"``); counts below 1 are refused with the table's
    other rules (`table_problems`)."""
    if isinstance(key, str):
        if not _GPU_COUNT.match(key):
            raise ValueError(f"keys are GPU counts, whole numbers >= 1 in digits, got {key!r}")
        return int(key)
    return key


#: A table key: the model reads it as JSON writes it, by the rule the OpenAPI document states.
GPUCount = Annotated[int, BeforeValidator(_count_key)]


#: GPU count -> its allowed partitions (JSON keys are the counts as strings: ``"2"``).
PartitionTable = dict[int, tuple[GPUPartition, ...]]
#: The hashable form of a table (count, ((minors, score, bandwidth or -1), ...)), for interning.
TableKey = tuple[tuple[int, tuple[tuple[tuple[int, ...], int, int], ...]], ...]


def table_problems(table: PartitionTable, gpu_minors: set[int]) -> list[tuple[tuple[int | str, ...], str, object]]:
    """Every key a count >= 1 that matches its partitions' sizes, every minor a GPU the node has
    (not in MIG mode): ``(path under the table, message, value)`` per problem."""
    out: list[tuple[tuple[int | str, ...], str, object]] = []
    for count, partitions in table.items():
        if count < 1:
            out.append(((count,), "GPU counts are >= 1", count))
            continue
        for i, p in enumerate(partitions):
            if len(p.minors) != count:
                out.append(((count, i, "minors"), f"{len(p.minors)} minors under key {count}", list(p.minors)))
            missing = sorted(set(p.minors) - gpu_minors)
            if missing:
                out.append(((count, i, "minors"), f"no shareable GPU has minor(s) {missing}", list(p.minors)))
    return out


def table_key(table: PartitionTable) -> TableKey:
    return tuple(
        (count, tuple((p.minors, p.allocation_score, p.ring_bus_bandwidth or -1) for p in parts))
        for count, parts in sorted(table.items())
    )
