"""A node's free amounts as preemption victims leave and come back: the fast "would it fit" of reprieve.

Reprieve asks "does the workload still fit?" once per candidate victim, on up to dozens of nodes
per decision, so this model is plain Python over one node: scalar free amounts, and per device
of each requested type its free amounts and whether one instance of the request fits there
(`slot_fits`, the per-device rule of the exact allocator's `fit_mask`, on one device). A victim
changes the devices it holds grants on, so only those are re-checked, and "fits" is a counter
comparison. It approximates the exact step (no NUMA, joint or cpuset rules); the plugin always
confirms its answer with the real filters (plugins/preemption.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from finesched.plugins.deviceshare.request import FitRule, TypeRequest, compile_rule
from finesched.plugins.preemption_index import Grant
from finesched.state.device_types import NodeDevices


def slot_fits(
    rule: FitRule, free: Sequence[Sequence[int]], total: Sequence[Sequence[int]], healthy: bool, s: int
) -> bool:
    """Whether one instance of the request fits on device slot `s` (fit_mask's rule for one device)."""
    if rule.missing or not healthy:
        return False
    for k, amount in rule.thresholds:
        if free[k][s] < amount:
            return False
    if rule.needs_memory is not None and total[rule.needs_memory][s] <= 0:
        return False
    if rule.ratio_bytes is not None:
        ratio, m = rule.ratio_bytes
        if free[m][s] < total[m][s] * ratio // 100:
            return False
    if rule.bytes_ratio is not None:
        nbytes, r, m = rule.bytes_ratio
        if free[r][s] < (nbytes * 100) // max(total[m][s], 1):
            return False
    return True


class _TypeModel:
    __slots__ = ("count", "dims", "fitting", "free", "healthy", "ok", "rule", "slots", "total", "type")

    def __init__(self, request: TypeRequest, nd: NodeDevices):
        self.type, self.count = request.type, request.count
        self.dims = {name: k for k, name in enumerate(nd.dims)}
        self.rule = compile_rule(request, nd.dims)
        self.free = [list(map(int, row)) for row in nd.free]
        self.total = [list(map(int, row)) for row in nd.total]
        self.healthy = [bool(h) for h in nd.healthy]
        self.slots = {int(m): s for s, m in enumerate(nd.minors)}
        self.ok = [slot_fits(self.rule, self.free, self.total, h, s) for s, h in enumerate(self.healthy)]
        self.fitting = sum(self.ok)

    def apply(self, kind: str, minor: int, amounts: tuple[tuple[str, int], ...], sign: int) -> None:
        s = self.slots.get(minor)
        if kind != self.type or s is None:
            return
        for dim, amount in amounts:
            k = self.dims.get(dim)
            if k is not None:
                self.free[k][s] += sign * amount
        now = slot_fits(self.rule, self.free, self.total, self.healthy[s], s)
        if now != self.ok[s]:
            self.ok[s] = now
            self.fitting += 1 if now else -1


class NodeModel:
    """Free amounts of one node for one request: `apply` a victim's holdings (+1 evict, -1 return)."""

    def __init__(self, free: dict[str, int], need: Mapping[str, int], devices: list[tuple[Any, NodeDevices]]):
        self.free, self.need = free, need
        self.types = [_TypeModel(tr, nd) for tr, nd in devices]

    def apply(self, amounts: Mapping[str, int], grants: Sequence[Grant], sign: int) -> None:
        """`amounts` must name only resources of the request (the plugin filters them once)."""
        free = self.free
        for name, amount in amounts.items():
            free[name] += sign * amount
        for model in self.types:
            for kind, minor, dims in grants:
                model.apply(kind, minor, dims, sign)

    def fits(self) -> bool:
        free = self.free
        for name, amount in self.need.items():
            if free[name] < amount:
                return False
        return all(model.fitting >= model.count for model in self.types)
