"""MIG through NVML on the node (../shared/reference/MIG.md §3-4): discover a card's mode, profile
table and instances; create and destroy the instances a dynamic card's bindings need.

Discovery (`discover_mig`), for a GPU whose current MIG mode is enabled (``nvmlDeviceGetMigMode``;
NOT_SUPPORTED = not MIG-capable): every GPU instance profile NVML answers for
(``nvmlDeviceGetGpuInstanceProfileInfo`` over the profile constants; the v2 struct's name
"MIG 1g.10gb" gives the profile name), its allowed placements
(``nvmlDeviceGetGpuInstancePossiblePlacements``: start and size in memory slices), the existing
GPU instances (``nvmlDeviceGetGpuInstances`` + ``nvmlGpuInstanceGetInfo``: profile id, placement)
and their MIG device UUIDs (``nvmlDeviceGetMigDeviceHandleByIndex`` + ``nvmlDeviceGetGpuInstanceId``
+ ``nvmlDeviceGetUUID``). The axis width is the last slice any placement reaches and the compute
slices the largest profile's slice count: read from the card, never assumed.

Creation (`MIGControl.prepare`) for a binding's instance on a dynamic card: reuse a GPU instance
already at that placement, else ``nvmlDeviceCreateGpuInstanceWithPlacement`` then one compute
instance covering the whole GPU instance (``nvmlGpuInstanceCreateComputeInstance``), and return the
MIG device's UUID for ``NVIDIA_VISIBLE_DEVICES=MIG-<uuid>``. Instances the agent created are
destroyed (compute instances first, ``nvmlGpuInstanceDestroy``) when their workload ends.
The pynvml-like module is passed in, so tests use a fake one.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

#: Compute instance profile constant per GPU-instance slice count (nvml.h NVML_COMPUTE_INSTANCE_PROFILE_*).
_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_MAX_INSTANCES = 32


class MIGError(RuntimeError):
    """An NVML MIG call failed; the message says which and why (the binding is rejected with it)."""


@dataclass(frozen=True)
class Profile:
    name: str
    id: int
    compute: int
    memory: int
    max: int
    starts: tuple[int, ...]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_enabled(nvml: Any, handle: Any) -> bool:
    """The card's current MIG mode is on (False when NVML says the card has no MIG)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:
        return False
    return int(current) == 1


def profiles(nvml: Any, handle: Any) -> list[Profile]:
    """Every GPU instance profile the card answers for, with its allowed starts."""
    out = []
    for const in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, const)
        except Exception:
            continue  # NOT_SUPPORTED / INVALID_ARGUMENT: this constant is no profile of the card
        placements = _placements(nvml, handle, int(info.id))
        if not placements:
            continue
        raw = _text(getattr(info, "name", b"")).strip()
        name = raw[4:] if raw.startswith("MIG ") else f"{info.sliceCount}g.{math.ceil(info.memorySizeMB / 1024)}gb"
        size = placements[0][1]
        starts = tuple(sorted(start for start, _ in placements))
        out.append(Profile(name, int(info.id), int(info.sliceCount), size, int(info.instanceCount), starts))
    return out


def _placements(nvml: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    try:
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.pointer(count))
        array = (nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.pointer(count))
    except Exception:
        return []
    return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]


def gpu_instances(nvml: Any, handle: Any, profile_id: int) -> list[tuple[Any, int, int]]:
    """(GI handle, GI id, start) of the card's existing GPU instances of one profile."""
    count = ctypes.c_uint(0)
    array = (nvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
    try:
        nvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.pointer(count))
    except Exception:
        return []
    out = []
    for i in range(count.value):
        info = nvml.nvmlGpuInstanceGetInfo(array[i])
        out.append((array[i], int(info.id), int(info.placement.start)))
    return out


def mig_uuids(nvml: Any, handle: Any) -> dict[int, str]:
    """GPU instance id -> the UUID of its (first) MIG device."""
    out: dict[int, str] = {}
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:
        return out
    for index in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            out.setdefault(int(nvml.nvmlDeviceGetGpuInstanceId(mig)), _text(nvml.nvmlDeviceGetUUID(mig)))
        except Exception:
            continue  # an empty MIG device slot
    return out


def discover_mig(nvml: Any, handle: Any, mode: str, product: str | None = None) -> dict[str, Any] | None:
    """The Device ``mig`` field of a GPU (model/mig.py MIGSpec), or None when MIG is off or absent."""
    if not mig_enabled(nvml, handle):
        return None
    table = profiles(nvml, handle)
    if not table:
        return None
    uuids = mig_uuids(nvml, handle)
    instances = []
    for p in table:
        for _gi, gi_id, start in gpu_instances(nvml, handle, p.id):
            entry: dict[str, Any] = {"profile": p.name, "start": start}
            if gi_id in uuids:
                entry["uuid"] = uuids[gi_id]
            instances.append(entry)
    spec: dict[str, Any] = {
        "mode": mode,
        "memorySlices": max(s + p.memory for p in table for s in p.starts),
        "computeSlices": max(p.compute for p in table),
        "profiles": [
            {
                "name": p.name,
                "id": p.id,
                "compute": p.compute,
                "memory": p.memory,
                "max": p.max,
                "starts": list(p.starts),
            }
            for p in table
        ],
        "instances": sorted(instances, key=lambda x: (x["start"], x["profile"])),
    }
    if product:
        spec["product"] = _text(product)
    return spec


class MIGControl:
    """Creates and destroys GPU instances for a dynamic card's bindings (see the module docstring)."""

    def __init__(self, nvml: Any):
        self.nvml = nvml

    def _handle(self, minor: int) -> Any:
        nvml = self.nvml
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                if int(nvml.nvmlDeviceGetMinorNumber(handle)) == minor:
                    return handle
            except Exception:
                if index == minor:
                    return handle
        raise MIGError(f"gpu {minor}: NVML has no such GPU")

    def prepare(self, minor: int, profile: str, start: int) -> tuple[str, int | None]:
        """The MIG device UUID of the instance at (profile, start) on gpu `minor`, creating it when
        there is none; and the GPU instance id when this call created it (else None)."""
        nvml = self.nvml
        handle = self._handle(minor)
        found = next((p for p in profiles(nvml, handle) if p.name == profile), None)
        if found is None or start not in found.starts:
            raise MIGError(f"gpu {minor}: NVML offers no {profile} at start {start}")
        existing = [gi_id for _gi, gi_id, s in gpu_instances(nvml, handle, found.id) if s == start]
        created = None
        if existing:
            gi_id = existing[0]
        else:
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, found.memory
            try:
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, found.id, ctypes.pointer(placement))
                gi_id = created = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
                ci_profile = _CI_PROFILE.get(found.compute)
                if ci_profile is None:
                    raise MIGError(f"no compute instance profile for {found.compute} slices")
                engines = int(getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
                ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, engines)
                nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))
            except MIGError:
                raise
            except Exception as exc:
                if created is not None:
                    self.destroy(minor, created)
                raise MIGError(f"gpu {minor}: creating {profile} at {start} failed: {exc}") from None
        uuid = mig_uuids(nvml, handle).get(gi_id)
        if uuid is None:
            if created is not None:
                self.destroy(minor, created)
            raise MIGError(f"gpu {minor}: {profile} at {start} has no MIG device (no compute instance)")
        return uuid, created

    def destroy(self, minor: int, gi_id: int) -> str | None:
        """Destroy a GPU instance the agent created (its compute instances first); an error text or None."""
        nvml = self.nvml
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(self._handle(minor), gi_id)
            for ci_profile in sorted(set(_CI_PROFILE.values())):
                count = ctypes.c_uint(0)
                array = (nvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
                try:
                    nvml.nvmlGpuInstanceGetComputeInstances(gi, ci_profile, array, ctypes.pointer(count))
                except Exception:
                    continue
                for i in range(count.value):
                    nvml.nvmlComputeInstanceDestroy(array[i])
            nvml.nvmlGpuInstanceDestroy(gi)
        except Exception as exc:
            return f"gpu {minor}: destroying GPU instance {gi_id} failed: {exc}"
        return None
