"""Node-level device shares (S0.4) and the node-level device binpack/spread scorer.

For each requested device dimension, the share after placement on node i is
``(used_i + count · per_device) / total_i`` over the node's healthy devices (the 2-D class summed
per node, S0.4 "2-D classes are decoded"). GPU dimensions are gpu-core and the memory class the
request names (gpu-memory-ratio for ratio requests, gpu-memory for bytes). `DeviceShare`
publishes them to the shared list, so LeastRequested / MostBalanced include devices.

`DeviceScore` scores nodes on the device shares alone, independently of the card-level choice
(`DeviceShare`'s ``strategy``): MostAllocated packs GPU workloads onto busy GPU nodes (keeping
whole nodes free for 8-GPU jobs), LeastAllocated spreads them. Example, a 1-GPU share of 50 core
and ratio 50 on a node of 8 GPUs with 350 core / 350 ratio used: shares (350+50)/800 = 0.5 each ->
MostAllocated ⌊100 · 0.5⌋ = 50, LeastAllocated 50; on an idle node 0.0625 -> 6 and 93.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.plugins.deviceshare.request import TypeRequest
from finesched.plugins.scoring import least_requested, most_allocated
from finesched.sched.cycle_state import CycleState, StateKey
from finesched.sched.framework import NodeBatch, ScoreArray
from finesched.sched.request import ScheduleRequest
from finesched.state.devices import STRATEGIES, DeviceAccounts

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class DeviceShares:
    """This cycle's device share arrays ([n] each), one per requested device dimension."""

    arrays: tuple[FloatArray, ...]


DEVICE_SHARES = StateKey("DeviceShare/shares", DeviceShares)


def device_shares(accounts: DeviceAccounts, requests: Sequence[TypeRequest], nodes: NodeBatch) -> list[FloatArray]:
    """[batch] share after placement per requested dimension (0 on nodes without that device type)."""
    out = []
    everyone = nodes.state.n
    for request in requests:
        acc = accounts.types.get(request.type)
        for name, amount in request.per_device.items():
            if acc is None or name not in acc.dim_index:
                out.append(np.zeros(nodes.n))
                continue
            total = request.count * amount
            if nodes.index is None:
                out.append(accounts.share_after(request.type, name, total, everyone))
            else:  # a few changed nodes: compute them directly
                k, index = acc.dim_index[name], nodes.index
                out.append(acc.used_share[k][index] + acc.inv_htotal[k][index] * float(total))
    return out


def strategy_arg(args: Mapping[str, Any], default: str) -> str:
    """The ``strategy`` of a device plugin's profile args (its only arg), checked against STRATEGIES."""
    unknown = sorted(set(args) - {"strategy"})
    if unknown:
        raise ValidationError(f"unknown args {unknown}; valid: ['strategy']", path="args")
    strategy = args.get("strategy", default)
    if strategy not in STRATEGIES:
        raise ValidationError(f"must be one of {list(STRATEGIES)}", path="args.strategy", value=strategy)
    return str(strategy)


class DeviceScore:
    """Score: node-level device binpack (MostAllocated, default) or spread (LeastAllocated).

    Workloads without devices get 0 everywhere (no preference). Needs DeviceShare in the profile.
    """

    NAME: ClassVar[str] = "DeviceScore"
    NODE_LOCAL: ClassVar[bool] = True

    def __init__(self, strategy: str = "MostAllocated"):
        self.strategy = strategy
        self._function = most_allocated if strategy == "MostAllocated" else least_requested

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> DeviceScore:
        return cls(strategy_arg(args, "MostAllocated"))

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        shares = cycle.get(DEVICE_SHARES)
        if shares is None or not shares.arrays:
            return np.zeros(nodes.n, dtype=np.int64)
        return self._function(shares.arrays, nodes.n)
