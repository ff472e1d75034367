"""Per-device use on one node, as `GET /v1/nodes/{name}` (``status.allocation.devices``, read by
`finesched describe node`) and the console's node page show it, from one function so both name the
same holders.

Per device: totals per dimension, what is free now (the scheduler's books: totals less the grants
and less what is used outside finesched), the foreign part, and the holders, one per binding with
what it holds (its MIG instance on a MIG card). A holder the caller may not see (another tenant's
workload, `shown` returns None) keeps its amounts but not its name: the caller sees the device is
used, not by whom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from finesched.model.binding import Binding
from finesched.model.device_allocated import AnnotationError, binding_devices
from finesched.model.node import Node, device_totals
from finesched.state.cluster import ClusterState
from finesched.state.device_types import NodeDevices
from finesched.state.devices import DeviceAccounts

#: workload key -> the key, or None when the caller may not see it.
Shown = Callable[[str], str | None]


@dataclass
class DeviceInput:
    """What the device view reads from the leader's state, captured under the loop's lock."""

    node: Node
    bindings: list[Binding]
    devices: dict[str, NodeDevices]
    foreign: dict[str, dict[str, list[int]]]  # type -> dimension -> per device slot

    @classmethod
    def capture(cls, state: ClusterState, name: str) -> DeviceInput:
        """Node `name`'s devices (KeyError when the state does not hold it); the caller holds the lock."""
        i = state.index[name]
        found = state.extras.get(DeviceAccounts.name)
        accounts = found if isinstance(found, DeviceAccounts) else None  # never attached from here
        devices = accounts.all_node_devices(i) if accounts is not None else {}
        foreign = {
            kind: {dim: [int(v) for v in acc.foreign[k, i, : int(acc.count[i])]] for k, dim in enumerate(acc.dims)}
            for kind, acc in (accounts.types.items() if accounts is not None else ())
            if kind in devices
        }
        return cls(node=state.nodes[i], bindings=state.bindings_on(name), devices=devices, foreign=foreign)

    def usage(self, shown: Shown) -> list[dict[str, Any]]:
        """One entry per device, in type then slot order (see the module docstring)."""
        grants: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for binding in self.bindings:
            try:
                held = binding_devices(binding)
            except AnnotationError:
                continue
            for kind, kind_grants in held.items():
                for grant in kind_grants:
                    holder = {"workload": shown(binding.workload), "qos": binding.qos,
                              "resources": dict(grant.resources)}  # fmt: skip
                    if grant.mig is not None:
                        holder["mig"] = {"profile": grant.mig.profile, "start": grant.mig.start}
                    grants.setdefault((kind, grant.minor), []).append(holder)
        by_minor = {(d.type, d.minor): d for d in self.node.devices}
        out = []
        for kind, devices in sorted(self.devices.items()):
            for slot, minor in enumerate(devices.minors.tolist()):
                device = by_minor.get((kind, minor))
                out.append(
                    {
                        "type": kind,
                        "minor": minor,
                        "uuid": device.uuid if device is not None else None,
                        "numa": device.numa if device is not None else None,
                        "pcie": device.pcie if device is not None else None,
                        "healthy": bool(devices.healthy[slot]),
                        "total": device_totals(device) if device is not None else {},
                        "free": {dim: int(devices.free[k, slot]) for k, dim in enumerate(devices.dims)},
                        "foreign": {dim: values[slot] for dim, values in self.foreign.get(kind, {}).items()
                                    if values[slot]},
                        "holders": grants.get((kind, minor), []),
                    }
                )  # fmt: skip
        return out
