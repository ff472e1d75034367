"""The rules a ClusterState must satisfy after every operation (DESIGN.md "State and concurrency rules").

`check` returns every violation instead of stopping at the first, so a failing property test
or ``--validate`` run shows the whole picture. Extras (devices, CPUs, MIG slices, GPU partition
tables) add their own rules through `NodeExtra.violations`: no MIG memory slice held twice and
every held instance a placement its product allows (state/mig_slices.py); whole-GPU sets on Honor
nodes inside the partition table (state/gpu_partitions.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from finesched.model.binding import Binding


class CheckedExtra(Protocol):
    """An extra's side of the check (state/cluster.py `NodeExtra` has it)."""

    @property
    def name(self) -> str: ...

    def violations(self) -> list[str]: ...


class CheckedState(Protocol):
    """What the check reads of a ClusterState (state/cluster.py), which calls `check` with itself
    from `check_invariants`: this module depends on that much, not on the ClusterState class."""

    @property
    def n(self) -> int: ...
    @property
    def free(self) -> npt.NDArray[np.int64]: ...
    @property
    def allocatable(self) -> npt.NDArray[np.int64]: ...
    @property
    def names(self) -> Sequence[str]: ...
    @property
    def index(self) -> Mapping[str, int]: ...
    @property
    def resources(self) -> Sequence[str]: ...
    @property
    def res_index(self) -> Mapping[str, int]: ...
    @property
    def bindings(self) -> Mapping[str, Binding]: ...
    @property
    def extras(self) -> Mapping[str, CheckedExtra]: ...


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def check(state: CheckedState) -> list[Violation]:
    """Every broken invariant of `state` (empty when all hold)."""
    out: list[Violation] = []
    free, alloc = state.free, state.allocatable
    for r, i in zip(*np.nonzero(free < 0), strict=True):
        out.append(Violation("no-negative-free", f"{state.names[i]}: {state.resources[r]} free = {free[r, i]}"))
    held = np.zeros_like(alloc)
    for key, binding in state.bindings.items():
        i = state.index.get(binding.node)
        if i is None:
            out.append(Violation("binding-node-exists", f"{key} is bound to unknown node {binding.node!r}"))
            continue
        for name, amount in binding.requests.items():
            r = state.res_index.get(name)
            if r is None:
                out.append(Violation("binding-resource-exists", f"{key} holds unknown resource {name}"))
            else:
                held[r, i] += amount
    for r, i in zip(*np.nonzero(free + held != alloc), strict=True):
        out.append(
            Violation(
                "free-plus-held-is-allocatable",
                f"{state.names[i]}: {state.resources[r]} free {free[r, i]} + held {held[r, i]} != {alloc[r, i]}",
            )
        )
    if len(state.names) != state.n or any(state.index[name] != i for i, name in enumerate(state.names)):
        out.append(Violation("index-consistent", "node names and indices disagree"))
    for extra in state.extras.values():
        out += [Violation(extra.name, v) for v in extra.violations()]
    if "mig" not in state.extras:  # MIG instances are counted only by the "mig" extra (state/mig_slices.py)
        for key, binding in state.bindings.items():
            if any(g.mig is not None for grants in binding.devices.values() for g in grants):
                out.append(Violation("mig-accounted", f"{key} holds MIG instances but no MIG slice counters exist"))
    return out
