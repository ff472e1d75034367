"""A node's free amounts as preemption victims leave and come back: the fast "would it fit" of reprieve.

Reprieve asks "does the workload still fit?" once per candidate victim, on up to dozens of nodes
per decision, so this model is plain Python over one node: scalar free amounts, and per device
of each requested type its free amounts and whether one instance of the request fits there
(`slot_fits`, the per-device rule of the exact allocator's `fit_mask`, on one device). A victim
changes the devices it holds grants on, so only those are re-checked, and "fits" is a counter
comparison.

The model is a *relaxation* of the exact step: it checks conditions every placement needs (the
scalar amounts, enough devices that each fit one instance), so "does not fit" here means the real
filters say no too. It does not see cpusets, NUMA alignment, device hints or joint allocation:
for a request that has any of these on a node (`expresses`), the plugin takes the node's victims
from the exact path, using the model only to skip exact checks it can already answer no to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from finesched.plugins.cpu.request import CPU_REQUEST
from finesched.plugins.deviceshare.request import DeviceRequest, FitRule, TypeRequest, compile_rule
from finesched.plugins.numa import effective_policy
from finesched.plugins.preemption_index import Grant
from finesched.sched.cycle_state import CycleState
from finesched.state.cluster import ClusterState
from finesched.state.cpus import CPUAccounts
from finesched.state.device_types import NodeDevices

#: NUMA policies whose alignment the model cannot check (BestEffort and None always admit).
_STRICT_NUMA = ("Restricted", "SingleNUMANode")


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


def expresses(cycle: CycleState, state: ClusterState, dreq: DeviceRequest | None, node: int) -> bool:
    """Whether the model states every constraint of the cycle's request on `node` (module docstring).

    Not when the request has, on that node, an exclusive cpuset (LSE/LSR, or Guaranteed whole
    CPUs on a kubelet-static node), a ConstrainedBurst pool, a Restricted or SingleNUMANode
    policy (the workload's or the node's), a deviceAllocateHint, or a joint device allocation.
    Example: an LSR workload asking FullPCPUs sees "4 CPUs free" here while the victims' pinned
    CPUs split every core; only the exact path can tell which victims free whole cores.
    """
    if dreq is not None and (dreq.joint is not None or any(tr.hint is not None for tr in dreq.types.values())):
        return False
    req = cycle.get(CPU_REQUEST)
    if req is None:
        return True
    accounts = state.extras.get(CPUAccounts.name)
    if not isinstance(accounts, CPUAccounts):
        return not (req.exclusive or req.constrained_burst or req.numa_policy in _STRICT_NUMA)
    config = accounts.config[node]
    if req.exclusive_on(config.kubelet_static) or req.constrained_burst:
        return False
    return req.qos == "BE" or effective_policy(req, config.numa_policy) not in _STRICT_NUMA
