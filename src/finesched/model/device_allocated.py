"""Koordinator's ``scheduling.koordinator.sh/device-allocated`` annotation, both directions (S1.6).

The value is JSON keyed by device type, each a list of ``{"minor": int, "resources": {name:
quantity}}`` (../shared/reference/PROTOCOLS.md section 2). We write what Koordinator's Go code
writes: ``koordinator.sh/*`` names, quantities as strings in their shortest exact form, types and
resource names sorted, no spaces::

    {"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi",
    "koordinator.sh/gpu-memory-ratio":"50"}}]}

We read ``koordinator.sh/*``, ``kubernetes.io/*`` and short names, quantities as strings or
numbers, and ignore the optional ``id`` and ``extension`` fields, except ``extension.mig``: a MIG
instance (model/mig.py) is written as ``{"minor": 0, "resources": {"nvidia.com/mig-3g.40gb": "1"},
"extension": {"mig": {"profile": "3g.40gb", "start": 4, "uuid"?: "MIG-..."}}}``. The prefixes are stripped for
every dimension, so a manifest-defined type (``koordinator.sh/xpu``) reads back as ``xpu``; we
write such dimensions bare, as finesched names them. ``parse(format(x)) == x`` for any grants and
``format(parse(s)) == s`` for any value written as above.

A binding without ``devices`` that carries this annotation holds the annotated grants (a pod that
Koordinator placed: the annotation is the record). `binding_devices` gives every reader (the device
accounts, tenant usage, the fragmentation view) the same grants.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache

import pydantic

from finesched.model.binding import Binding, DeviceGrant
from finesched.model.mig import MIGPlacement, mig_resource
from finesched.model.resources import ResourceVector, device_dimension, koordinator_name, resource_kind
from finesched.quantity import QuantityError, format_quantity, parse_quantity

__all__ = [
    "DEVICE_ALLOCATED",
    "AnnotationError",
    "binding_devices",
    "format_device_allocated",
    "parse_device_allocated",
]

#: Koordinator's pod annotation with the device grants (written by DeviceShare, read back by the state).
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"


class AnnotationError(ValueError):
    """A device-allocated value that cannot be read; the message names the place and the rule."""


def format_device_allocated(devices: Mapping[str, Sequence[DeviceGrant]]) -> str:
    """The annotation value for a binding's ``devices`` (see the module docstring)."""
    parts = []
    for kind in sorted(devices):
        grants = ",".join(_grant_json(g) for g in devices[kind])
        parts.append(f"{json.dumps(kind)}:[{grants}]")
    return "{" + ",".join(parts) + "}"


def _grant_json(g: DeviceGrant) -> str:
    if g.mig is None:
        return f'{{"minor":{g.minor},"resources":{_resources_json(g.resources)}}}'
    return _mig_json(g.minor, g.mig.profile, g.mig.start, g.mig.uuid)


@lru_cache(maxsize=4096)
def _mig_json(minor: int, profile: str, start: int, uuid: str | None) -> str:
    """A MIG instance: one of its profile's resource, the placement under extension.mig."""
    mig = {"profile": profile, "start": start, **({"uuid": uuid} if uuid else {})}
    resources = json.dumps({mig_resource(profile): "1"}, separators=(",", ":"))
    extension = json.dumps({"mig": mig}, separators=(",", ":"))
    return f'{{"minor":{minor},"resources":{resources},"extension":{extension}}}'


@lru_cache(maxsize=4096)
def _resources_json(resources: ResourceVector) -> str:
    """One grant's resources as JSON (memoized: a cluster has few distinct grant shapes)."""
    named = {koordinator_name(name): format_quantity(amount, resource_kind(name)) for name, amount in resources.items()}
    return json.dumps(dict(sorted(named.items())), separators=(",", ":"))


def parse_device_allocated(text: str) -> dict[str, list[DeviceGrant]]:
    """Read an annotation value into ``{type: [DeviceGrant]}``; raise AnnotationError on bad input."""
    try:
        doc = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise AnnotationError(f"{DEVICE_ALLOCATED}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise AnnotationError(f"{DEVICE_ALLOCATED}: expected an object keyed by device type")
    out: dict[str, list[DeviceGrant]] = {}
    for kind, entries in doc.items():
        if not isinstance(entries, list):
            raise AnnotationError(f"{DEVICE_ALLOCATED}.{kind}: expected a list of allocations")
        out[kind] = [_grant(f"{DEVICE_ALLOCATED}.{kind}[{i}]", entry) for i, entry in enumerate(entries)]
    return out


def _grant(where: str, entry: object) -> DeviceGrant:
    if not isinstance(entry, dict):
        raise AnnotationError(f"{where}: expected an object with minor and resources")
    minor = entry.get("minor")
    if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
        raise AnnotationError(f"{where}.minor: expected a non-negative integer, got {minor!r}")
    mig = (entry.get("extension") or {}).get("mig") if isinstance(entry.get("extension"), dict) else None
    if mig is not None:
        try:
            placement = MIGPlacement.model_validate(mig)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise AnnotationError(f"{where}.extension.mig.{field}: {first['msg']}") from None
        return DeviceGrant.model_construct(minor=minor, resources=ResourceVector(), mig=placement)
    raw = entry.get("resources", {})
    if not isinstance(raw, dict):
        raise AnnotationError(f"{where}.resources: expected an object of name -> quantity")
    amounts: dict[str, int] = {}
    for name, value in raw.items():
        short = device_dimension(name)  # any type's dimension, not only the fixed alias list
        if short in amounts:
            raise AnnotationError(f"{where}.resources: {name} names {short} twice")
        try:
            amounts[short] = parse_quantity(value, resource_kind(short))
        except QuantityError as exc:
            raise AnnotationError(f"{where}.resources.{name}: {exc}") from None
    return DeviceGrant.model_construct(minor=minor, resources=ResourceVector(amounts))


def binding_devices(binding: Binding) -> Mapping[str, Sequence[DeviceGrant]]:
    """The binding's device grants: its ``devices``, else those of its device-allocated annotation.

    Raises AnnotationError for an annotation that cannot be read (the state refuses such a binding).
    """
    if binding.devices:
        return binding.devices
    text = binding.annotations.get(DEVICE_ALLOCATED)
    return parse_device_allocated(text) if text else {}
