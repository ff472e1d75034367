"""Agent reports (seed S0.2 sync): check the encoded per-device vectors against the node's inventory.

An agent sends, per device type and dimension, the free amounts of its devices (minor order) as
one integer `k` with the bit width and device count. The server decodes them and refuses the
whole report, keeping the last good state, when the count is not the node's device count of that
type, a value is out of range for the width, or a decoded value is above the device's total.
Health flags must name devices the node has.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from finesched.codec import MAX_BITS, CodecError, decode
from finesched.model.node import Node, device_totals
from finesched.server.views import Integer


class EncodedDim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: Integer = Field(ge=0)
    count: Integer = Field(ge=1, le=4096)
    bits: Integer = Field(ge=1, le=MAX_BITS)


class NodeReport(BaseModel):
    """`devices`: {type: {dimension: {k, count, bits}}}; `health`: {type: {minor: healthy}}."""

    model_config = ConfigDict(extra="forbid")
    devices: dict[str, dict[str, EncodedDim]] = Field(default_factory=dict)
    health: dict[str, dict[str, bool]] = Field(default_factory=dict)
    totals: dict[str, Any] = Field(default_factory=dict)
    discovery: dict[str, Any] = Field(default_factory=dict)


def check_report(node: Node, report: NodeReport) -> list[dict[str, Any]]:
    """Every problem of `report` against `node`'s inventory, as API error details (empty: valid)."""
    problems: list[dict[str, Any]] = []
    inventory: dict[str, list[Any]] = {}
    for device in sorted(node.devices, key=lambda d: (d.type, d.minor)):
        inventory.setdefault(device.type, []).append(device)
    for kind, dims in report.devices.items():
        devices = inventory.get(kind)
        if devices is None:
            problems.append(_problem(["devices", kind], f"node {node.name} has no {kind} devices", kind))
            continue
        for dim, enc in dims.items():
            loc = ["devices", kind, dim]
            if enc.count != len(devices):
                problems.append(
                    _problem([*loc, "count"], f"node {node.name} has {len(devices)} {kind} device(s)", enc.count)
                )
                continue
            try:
                values = decode(enc.k, enc.count, enc.bits)
            except CodecError as exc:
                problems.append(_problem([*loc, "k"], f"does not decode with bits={enc.bits}: {exc}", enc.k))
                continue
            for device, value in zip(devices, values, strict=True):
                total = device_totals(device).get(dim)
                if total is None:
                    problems.append(_problem(loc, f"{kind} devices have no dimension {dim!r}", dim))
                    break
                if value > total:
                    problems.append(
                        _problem([*loc, "k"], f"{kind} {device.minor}: free {value} is above its total {total}", value)
                    )
    for kind, flags in report.health.items():
        minors = {str(d.minor) for d in inventory.get(kind, ())}
        for minor in flags:
            if minor not in minors:
                problems.append(_problem(["health", kind, minor], f"node {node.name} has no {kind} {minor}", minor))
    return problems


def _problem(loc: list[str], msg: str, value: Any) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "input": value}
