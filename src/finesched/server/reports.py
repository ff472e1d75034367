"""Agent reports (seed S0.2 sync): check the encoded per-device vectors against the node's inventory.

An agent sends, per device type and dimension, the free amounts of its devices (minor order) as
one integer `k` with the bit width and device count. The server decodes them and refuses the
whole report, keeping the last good state, when the count is not the node's device count of that
type, a value is out of range for the width, or a decoded value is above the device's total.
Health flags must name devices the node has. GPUs in MIG mode are not in the free vectors; the
``mig`` part lists each MIG card's instances (valid together for the card's profile table) and,
S0.2-encoded, the card's occupied memory slices, which must be what those instances occupy.
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from finesched.codec import MAX_BITS, CodecError, decode
from finesched.model.mig import MIGInstance, MIGSpec
from finesched.model.node import Node, device_totals


class EncodedDim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(ge=0)
    count: int = Field(ge=1, le=4096)
    bits: int = Field(ge=1, le=MAX_BITS)


class MIGReport(BaseModel):
    """``slices``: S0.2 occupied-slice masks of the MIG cards (minor order); ``instances``: per minor."""

    model_config = ConfigDict(extra="forbid")
    slices: EncodedDim
    instances: dict[str, list[MIGInstance]] = Field(default_factory=dict)


class NodeReport(BaseModel):
    """`devices`: {type: {dimension: {k, count, bits}}}; `health`: {type: {minor: healthy}}."""

    model_config = ConfigDict(extra="forbid")
    devices: dict[str, dict[str, EncodedDim]] = Field(default_factory=dict)
    health: dict[str, dict[str, bool]] = Field(default_factory=dict)
    totals: dict[str, Any] = Field(default_factory=dict)
    discovery: dict[str, Any] = Field(default_factory=dict)
    mig: MIGReport | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if isinstance(out, dict) and out.get("mig", 0) is None:
            del out["mig"]  # a node without MIG GPUs keeps the report's shape
        return out


def check_report(node: Node, report: NodeReport) -> list[dict[str, Any]]:
    """Every problem of `report` against `node`'s inventory, as API error details (empty: valid)."""
    problems: list[dict[str, Any]] = []
    inventory: dict[str, list[Any]] = {}
    for device in sorted(node.devices, key=lambda d: (d.type, d.minor)):
        if device.mig is None:  # MIG cards are reported under "mig"
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
    if report.mig is not None:
        problems += _mig_problems(node, report.mig)
    for kind, flags in report.health.items():
        minors = {str(d.minor) for d in node.devices if d.type == kind}
        for minor in flags:
            if minor not in minors:
                problems.append(_problem(["health", kind, minor], f"node {node.name} has no {kind} {minor}", minor))
    return problems


def _mig_problems(node: Node, report: MIGReport) -> list[dict[str, Any]]:
    cards = {str(d.minor): d.mig for d in sorted(node.devices, key=lambda d: d.minor) if d.type == "gpu" and d.mig}
    problems: list[dict[str, Any]] = []
    masks = []
    for minor, spec in cards.items():
        assert spec is not None
        found = report.instances.get(minor, [])
        try:
            fresh = MIGSpec.model_validate(
                {**spec.model_dump(by_alias=True), "instances": [i.model_dump() for i in found]}
            )
        except pydantic.ValidationError as exc:
            for e in exc.errors():
                problems.append(
                    _problem(["mig", "instances", minor, *map(str, e["loc"][1:])], e["msg"], e.get("input"))
                )
            masks.append(None)
            continue
        g = fresh.geometry
        masks.append(sum(g.masks[g.placement_lookup[(i.profile, i.start)]] for i in fresh.instances))
    for minor in sorted(set(report.instances) - set(cards)):
        problems.append(_problem(["mig", "instances", minor], f"node {node.name} has no MIG gpu {minor}", minor))
    enc = report.slices
    if enc.count != len(cards):
        problems.append(
            _problem(["mig", "slices", "count"], f"node {node.name} has {len(cards)} MIG gpu(s)", enc.count)
        )
        return problems
    try:
        values = decode(enc.k, enc.count, enc.bits)
    except CodecError as exc:
        return [*problems, _problem(["mig", "slices", "k"], f"does not decode with bits={enc.bits}: {exc}", enc.k)]
    for minor, value, want in zip(cards, values, masks, strict=True):
        if want is not None and value != want:
            problems.append(
                _problem(["mig", "slices", "k"], f"gpu {minor}: slices {value:#b} != its instances' {want:#b}", value)
            )
    return problems


def _problem(loc: list[str], msg: str, value: Any) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "input": value}
