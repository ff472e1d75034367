"""What each tenant holds, kept by the cluster state itself so it can never drift from the bindings.

DRF (sched/queue.py) orders tenants by dominant share and quotas cap what a tenant may hold; both
read this. It is a `ClusterState` extra: every `assume` and `forget` passes through it, whoever
makes them (the scheduler, a forced `remove_node`, a driver replaying bindings), and `snapshot` /
`restore` carry it along, so usage always equals the sum over the state's bindings.
"""

from __future__ import annotations

from collections.abc import Mapping

from finesched.model.binding import Binding
from finesched.model.device_allocated import DEVICE_ALLOCATED, binding_devices
from finesched.model.node import Node


def binding_amounts(binding: Binding) -> dict[str, int]:
    """Everything a binding holds, by resource name: scalar requests plus device grants summed
    (its ``devices``, or those of its device-allocated annotation: `binding_devices`)."""
    out = dict(binding.requests)
    for grants in binding_devices(binding).values():
        for grant in grants:
            for name, amount in grant.resources.items():
                out[name] = out.get(name, 0) + amount
    return out


class TenantUsage:
    """Per tenant, per resource: the amounts its bindings hold (a per-tenant, not per-node, extra)."""

    name = "TenantUsage"

    def __init__(self) -> None:
        self._usage: dict[str, dict[str, int]] = {}
        #: The workloads counted, so that re-assuming one (`ClusterState.update_node` replays a
        #: node's bindings into every extra) replaces its amounts instead of adding them twice.
        self._counted: dict[str, tuple[str, Mapping[str, int]]] = {}

    def of(self, tenant: str) -> Mapping[str, int]:
        """The amounts `tenant`'s bindings hold (empty when it holds nothing)."""
        return self._usage.get(tenant, {})

    def tenants(self) -> list[str]:
        """The tenants that hold anything now."""
        return [tenant for tenant, amounts in self._usage.items() if any(amounts.values())]

    # NodeExtra: node changes do not move tenant usage ------------------------------------------------
    def resize(self, capacity: int) -> None:
        pass

    def set_node(self, index: int, node: Node) -> None:
        pass

    def move(self, src: int, dst: int) -> None:
        pass

    def clear(self, index: int) -> None:
        pass

    def assume(self, index: int, binding: Binding) -> None:
        key = binding.workload
        if key in self._counted:  # a replayed binding is counted once
            self._uncount(key)
        # Without device grants a binding holds exactly its requests (an immutable vector: no copy).
        holds_devices = binding.devices or DEVICE_ALLOCATED in binding.annotations
        amounts: Mapping[str, int] = binding_amounts(binding) if holds_devices else binding.requests
        self._counted[key] = (binding.tenant, amounts)
        usage = self._usage.get(binding.tenant)
        if usage is None:
            usage = self._usage[binding.tenant] = {}
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) + amount

    def forget(self, index: int, binding: Binding) -> None:
        if binding.workload in self._counted:
            self._uncount(binding.workload)

    def _uncount(self, key: str) -> None:
        tenant, amounts = self._counted.pop(key)
        usage = self._usage[tenant]
        for name, amount in amounts.items():
            usage[name] -= amount

    def snapshot(self) -> object:
        return ({t: dict(a) for t, a in self._usage.items()}, dict(self._counted))

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, tuple)
        usage, counted = snapshot
        self._usage = {t: dict(a) for t, a in usage.items()}
        self._counted = dict(counted)

    def violations(self) -> list[str]:
        return [
            f"tenant {tenant} holds {amount} of {name}: usage must not be negative"
            for tenant, amounts in self._usage.items()
            for name, amount in amounts.items()
            if amount < 0
        ]
