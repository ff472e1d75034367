"""Cycle-state keys through which plugins cooperate on one node's exact allocation.

Reserve plugins run in profile order on the candidate node. Two decisions cross plugin lines:

* **NUMA alignment (S3.7).** `NUMAAlign.reserve` merges the hints of every provider (CPUs,
  per-NUMA memory, devices) and writes the chosen NUMA nodes under `NUMA_AFFINITY`; the CPU and
  device allocators that run after it allocate only from those NUMA nodes when the affinity is
  required (and prefer them when it is not).
* **Device choice.** A plugin that knows better which device a share should land on (the
  fragmentation-aware policy of the simulator) writes a `DeviceChooser` under `DEVICE_CHOOSER`
  in pre_score; `DeviceShare.reserve` asks it before falling back to its own strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from finesched.sched.cycle_state import StateKey


@dataclass(frozen=True, slots=True)
class NUMAAffinity:
    """The NUMA nodes node `node`'s allocation must (required) or should (preferred) come from."""

    node: int
    numa: frozenset[int]
    required: bool = True


NUMA_AFFINITY = StateKey("NUMAAlign/affinity", NUMAAffinity)


@runtime_checkable
class DeviceChooser(Protocol):
    """Picks which devices of one type a request gets on a node.

    `fitting` are the minors of the healthy devices on which one instance of the request fits
    (all dimensions), in ascending minor order; return `count` of them (or None to let the
    device plugin choose with its own strategy).
    """

    def choose(self, node: int, device_type: str, fitting: Sequence[int], count: int) -> Sequence[int] | None: ...


DEVICE_CHOOSER = StateKey("DeviceShare/chooser", DeviceChooser)
