"""The Resource Manager's report (S0.2, S0.6): device free vectors, health, totals, discovery notes.

Two-dimensional classes (every device type, every dimension: gpu-core, gpu-memory,
gpu-memory-ratio, rdma, ...) travel as one S0.2 integer each: devices in minor order, device i's
free amount at bits ``[i*bits, (i+1)*bits)``, ``bits`` the fewest that hold the largest *total* of
that dimension on the node (so every free value fits and the server can check the width).

Free = the device's total minus what the node's bindings hold: the agent does not guess at use
outside finesched. GPUs in MIG mode are not shared in software, so they are not in those vectors:
``mig`` reports each MIG card's instances as discovered now (profile, start, MIG device UUID) and,
S0.2-encoded the same way, each card's occupied memory slices as a bit mask (minor order, ``bits``
= the widest card's axis), which the server checks against the instances.

Health comes from the latest discovery: a device that errors or is gone is reported unhealthy, so
the scheduler stops placing there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from finesched.agent.binding import AgentBinding
from finesched.agent.discover import Discovery
from finesched.codec import EncodedVector, bits_for, encode
from finesched.model.node import Node, device_totals
from finesched.model.resources import ResourceVector


def device_free(node: Node, bindings: Iterable[AgentBinding]) -> dict[str, dict[str, list[int]]]:
    """type -> dimension -> free amount per device (minor order), after the bindings' grants."""
    held: dict[tuple[str, int], dict[str, int]] = {}
    for b in bindings:
        for kind, grants in b.devices.items():
            for minor, amounts in grants:
                slot = held.setdefault((kind, minor), {})
                for name, amount in amounts.items():
                    slot[name] = slot.get(name, 0) + amount
    out: dict[str, dict[str, list[int]]] = {}
    kinds = sorted({d.type for d in node.devices if d.mig is None})
    for kind in kinds:
        devices = sorted((d for d in node.devices_of(kind) if d.mig is None), key=lambda d: d.minor)
        totals = [device_totals(d) for d in devices]
        # dimensions every device of the type has: a device without one could not be checked
        dims = sorted(set.intersection(*(set(t) for t in totals)))
        out[kind] = {}
        for dim in dims:
            out[kind][dim] = [
                max(0, t.get(dim, 0) - held.get((kind, d.minor), {}).get(dim, 0))
                for d, t in zip(devices, totals, strict=True)
            ]
    return out


def encode_devices(node: Node, free: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, dict[str, int]]]:
    """Each free vector as ``{"k", "count", "bits"}`` (bits from the node's totals, see above)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for kind, by_dim in free.items():
        totals = [device_totals(d) for d in node.devices_of(kind) if d.mig is None]
        out[kind] = {}
        for dim, values in by_dim.items():
            bits = bits_for(max(t.get(dim, 0) for t in totals))
            ev = EncodedVector(encode(values, bits), len(values), bits)
            out[kind][dim] = {"k": ev.k, "count": ev.count, "bits": ev.bits}
    return out


def mig_report(node: Node) -> dict[str, Any]:
    """The ``mig`` part of the report for a node as just discovered ({} without MIG cards)."""
    cards = sorted((d for d in node.devices if d.mig is not None), key=lambda d: d.minor)
    if not cards:
        return {}
    masks, instances = [], {}
    for device in cards:
        assert device.mig is not None
        geometry = device.mig.geometry
        mask = 0
        for inst in device.mig.instances:
            mask |= geometry.masks[geometry.placement_lookup[(inst.profile, inst.start)]]
        masks.append(mask)
        instances[str(device.minor)] = [inst.model_dump(exclude_none=True) for inst in device.mig.instances]
    bits = max(d.mig.geometry.memory_slices for d in cards if d.mig is not None)
    slices = EncodedVector(encode(masks, bits), len(masks), bits)
    return {"slices": {"k": slices.k, "count": slices.count, "bits": slices.bits}, "instances": instances}


def health(node: Node, discovery: Discovery) -> dict[str, dict[str, bool]]:
    """Registered device -> healthy now (False when the latest discovery no longer finds it)."""
    out: dict[str, dict[str, bool]] = {}
    for device in node.devices:
        now = discovery.healthy(device.type, device.minor)
        out.setdefault(device.type, {})[str(device.minor)] = bool(now)
    return out


def scalar_available(node: Node, bindings: Iterable[AgentBinding]) -> dict[str, int]:
    """Allocatable minus the bindings' scalar requests (informative: the server keeps its own books)."""
    used = ResourceVector()
    for b in bindings:
        try:
            used = used + ResourceVector.parse(b.raw.get("requests") or {})
        except ValueError:
            continue
    return {name: max(0, amount - used.get(name, 0)) for name, amount in node.allocatable.items()}


def build_report(
    node: Node,
    bindings: list[AgentBinding],
    discovery: Discovery,
    extra: dict[str, Any] | None = None,
    pools: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of POST /v1/nodes/{name}/report for registered `node`; `extra` goes under discovery,
    `pools` (the executor's ``cpuSharedPools``, ``beCPUSharedPools``, ``podCPUAllocs``,
    ``workloadCPUs``: S3.9, as the node applies them now) at the top."""
    return {
        "devices": encode_devices(node, device_free(node, bindings)),
        **({"mig": mig} if (mig := mig_report(discovery.node)) else {}),
        "health": health(node, discovery),
        "totals": {"allocatable": dict(node.allocatable.items()), "available": scalar_available(node, bindings)},
        "discovery": {"sources": dict(discovery.sources), **(extra or {})},
        **(pools or {}),
    }
