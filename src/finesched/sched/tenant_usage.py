"""What each tenant holds, kept by the cluster state itself so it can never drift from the bindings.

DRF (sched/queue.py) orders tenants by dominant share and quotas cap what a tenant may hold; both
read this. It is a `ClusterState` extra: every `assume` and `forget` passes through it, whoever
makes them (the scheduler, a forced `remove_node`, a driver replaying bindings), and `snapshot` /
`restore` carry it along, so usage always equals the sum over the state's bindings.
"""

from __future__ import annotations

from collections.abc import Mapping

from finesched.model.binding import Binding
from finesched.model.node import Node


def binding_amounts(binding: Binding) -> dict[str, int]:
    """Everything a binding holds, by resource name: scalar requests plus device grants summed."""
    out = dict(binding.requests)
    for grants in binding.devices.values():
        for grant in grants:
            for name, amount in grant.resources.items():
                out[name] = out.get(name, 0) + amount
    return out


class TenantUsage:
    """Per tenant, per resource: the amounts its bindings hold (a per-tenant, not per-node, extra)."""

    name = "TenantUsage"

    def __init__(self) -> None:
        self._usage: dict[str, dict[str, int]] = {}

    def of(self, tenant: str) -> Mapping[str, int]:
        """The amounts `tenant`'s bindings hold (empty when it holds nothing)."""
        return self._usage.get(tenant, {})

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
        usage = self._usage.setdefault(binding.tenant, {})
        amounts = binding_amounts(binding) if binding.devices else binding.requests
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) + amount

    def forget(self, index: int, binding: Binding) -> None:
        usage = self._usage.get(binding.tenant, {})
        amounts = binding_amounts(binding) if binding.devices else binding.requests
        for name, amount in amounts.items():
            usage[name] = usage.get(name, 0) - amount

    def snapshot(self) -> object:
        return {tenant: dict(amounts) for tenant, amounts in self._usage.items()}

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, dict)
        self._usage = {tenant: dict(amounts) for tenant, amounts in snapshot.items()}

    def violations(self) -> list[str]:
        return [
            f"tenant {tenant} holds {amount} of {name}: usage must not be negative"
            for tenant, amounts in self._usage.items()
            for name, amount in amounts.items()
            if amount < 0
        ]
