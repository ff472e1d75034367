"""A workload compiled once into the compact form the cycle uses (DESIGN.md "Performance model").

No hot path touches the pydantic Workload: the scalar part of the request becomes two small
numpy arrays (state rows and amounts), built once per workload and state layout.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from finesched.model.resources import PODS, ResourceVector
from finesched.model.workload import Workload
from finesched.state.cluster import ClusterState


@dataclass(frozen=True, slots=True)
class ScheduleRequest:
    """What the cycle needs of a workload, in state coordinates."""

    workload: Workload
    #: Scalar amounts the binding takes (device resources owned by plugins excluded; pods: 1 added).
    scalar: ResourceVector
    #: State rows and amounts of `scalar` for the resources the state knows.
    rows: npt.NDArray[np.intp]
    amounts: npt.NDArray[np.int64]
    #: Requested scalar resources no node offers at all (so no node fits).
    unknown: tuple[str, ...]
    #: Rows of the requested classes used for share-based scoring (pods excluded), and amounts.
    share_rows: npt.NDArray[np.intp]
    share_amounts: npt.NDArray[np.int64]
    #: The same rows and amounts as Python pairs, for per-row loops that must not pay .tolist().
    pairs: tuple[tuple[int, int], ...] = ()
    share_pairs: tuple[tuple[int, int], ...] = ()
    #: The workload's request shape (sched/memo.py) when the scheduler computed it, else None;
    #: plugins that cache per shape reuse it instead of flattening the workload again.
    shape: Hashable | None = None
    #: [R, 1] per state row (R = rows when compiled): the amount asked, int64 min where nothing
    #: is asked, so one compare of a gathered [R, k] block of free amounts checks every row.
    floor: npt.NDArray[np.int64] | None = None
    #: [R, 1] float64 per state row: the amount added to `used` for share scoring (0 elsewhere).
    share_add: npt.NDArray[np.float64] | None = None

    @property
    def key(self) -> str:
        return self.workload.key


def compile_request(
    workload: Workload, state: ClusterState, owns: Callable[[str], bool] = lambda _name: False
) -> ScheduleRequest:
    """Compile `workload` against `state`'s resource rows; names `owns` claims are left to their plugin."""
    scalar = {name: amount for name, amount in workload.requests.items() if amount > 0 and not owns(name)}
    scalar[PODS] = 1
    rows, amounts, unknown = [], [], []
    share_rows, share_amounts = [], []
    for name, amount in scalar.items():
        r = state.res_index.get(name)
        if r is None:
            unknown.append(name)
            continue
        rows.append(r)
        amounts.append(amount)
        if name != PODS:
            share_rows.append(r)
            share_amounts.append(amount)
    floor = np.full((len(state.resources), 1), np.iinfo(np.int64).min, dtype=np.int64)
    floor[rows, 0] = amounts
    share_add = np.zeros((len(state.resources), 1), dtype=np.float64)
    share_add[share_rows, 0] = share_amounts
    return ScheduleRequest(
        workload=workload,
        scalar=ResourceVector(scalar),
        rows=np.asarray(rows, dtype=np.intp),
        amounts=np.asarray(amounts, dtype=np.int64),
        unknown=tuple(unknown),
        share_rows=np.asarray(share_rows, dtype=np.intp),
        share_amounts=np.asarray(share_amounts, dtype=np.int64),
        pairs=tuple(zip(rows, amounts, strict=True)),
        share_pairs=tuple(zip(share_rows, share_amounts, strict=True)),
        floor=floor,
        share_add=share_add,
    )


class RequestCompiler:
    """`compile_request` with the result's arrays shared between workloads of one request shape.

    Workloads of one shape (see sched/memo.py) compile to the same rows and amounts, so only the
    workload reference differs; sharing the scalar vector also lets ClusterState reuse its
    cached row layout on assume.
    """

    def __init__(self, state: ClusterState, owns: Callable[[str], bool], max_shapes: int = 4096):
        self._state = state
        self._owns = owns
        self._cache: dict[Hashable, ScheduleRequest] = {}
        self._max = max_shapes

    def compile(self, workload: Workload, shape: Hashable) -> ScheduleRequest:
        # Which names plugins own may depend on the node set (device types come from manifests).
        key = (shape, len(self._state.resources), self._state.nodes_version)
        template = self._cache.get(key)
        if template is None:
            if len(self._cache) >= self._max:
                self._cache.clear()
            template = self._cache[key] = replace(compile_request(workload, self._state, self._owns), shape=shape)
            return template
        return ScheduleRequest(
            workload,
            template.scalar,
            template.rows,
            template.amounts,
            template.unknown,
            template.share_rows,
            template.share_amounts,
            template.pairs,
            template.share_pairs,
            shape,
            template.floor,
            template.share_add,
        )
