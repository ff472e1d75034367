"""MIG calls for the fake NVML of agent_fakes.py, kept apart: `install_mig` adds them to a module made
by `fake_nvml`. A card in MIG mode answers from a product table of model/mig.py (profiles, allowed
placements), holds GPU instances with compute instances, and refuses what NVML refuses: a placement
the profile does not list (INVALID_ARGUMENT), an overlapping or over-cap one (INSUFFICIENT_RESOURCES,
MIG.md §3), destroying a GPU instance that still has compute instances (IN_USE)."""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field

from agent_fakes import FakeGPU, NVMLError

from finesched.model.mig import PRODUCTS, MIGGeometry


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass
class FakeMIGCard:
    """A card's MIG state: product table, and GPU instances id -> [profile index, start, CI count]."""

    product: str
    enabled: bool = True
    instances: dict[int, list[int]] = field(default_factory=dict)
    next_id: int = 1
    calls: list[str] = field(default_factory=list)

    @property
    def geometry(self) -> MIGGeometry:
        return PRODUCTS[self.product]

    def add(self, profile: str, start: int, computes: int = 1) -> int:
        """An existing instance (as mig-parted or an admin made it); its GPU instance id."""
        k = self.geometry.profile_index(profile)
        assert k is not None
        gi, self.next_id = self.next_id, self.next_id + 1
        self.instances[gi] = [k, start, computes]
        return gi

    def layout(self) -> list[tuple[str, int]]:
        return sorted((self.geometry.profiles[k].name, s) for k, s, _ in self.instances.values())


@dataclass(frozen=True)
class MigDevice:
    """A MIG device handle: one compute instance of one GPU instance."""

    card: FakeMIGCard
    gi: int
    uuid: str


def install_mig(mod: types.ModuleType, gpus: list[FakeGPU], cards: dict[int, FakeMIGCard]) -> types.ModuleType:
    """Add the MIG calls agent/mig.py makes to `mod`; `cards` maps GPU minor -> its MIG state."""
    by_handle = {id(g): cards.get(g.minor) for g in gpus}
    handles: dict[int, tuple[FakeMIGCard, int]] = {}

    def card_of(h: FakeGPU) -> FakeMIGCard:
        card = by_handle.get(id(h))
        if card is None or not card.enabled:
            raise NVMLError("Not Supported")
        return card

    def gi_handle(card: FakeMIGCard, gi: int) -> int:
        key = 1000 * (id(card) % 100000) + gi
        handles[key] = (card, gi)
        return key

    def mig_mode(h: FakeGPU) -> list[int]:
        card = by_handle.get(id(h))
        if card is None:
            raise NVMLError("Not Supported")
        return [int(card.enabled), int(card.enabled)]

    def profile_info(h: FakeGPU, const: int) -> types.SimpleNamespace:
        g = card_of(h).geometry
        if const >= len(g.profiles):
            raise NVMLError("Invalid Argument")
        p = g.profiles[const]
        return types.SimpleNamespace(
            id=p.id, sliceCount=p.compute, instanceCount=p.max, memorySizeMB=p.memory * 10240,
            name=f"MIG {p.name}".encode(),
        )  # fmt: skip

    def profile_by_id(card: FakeMIGCard, pid: int) -> int:
        for k, p in enumerate(card.geometry.profiles):
            if p.id == pid:
                return k
        raise NVMLError("Invalid Argument")

    def placements(h: FakeGPU, pid: int, array: object, count: ctypes._Pointer) -> int:  # type: ignore[type-arg]
        card = card_of(h)
        p = card.geometry.profiles[profile_by_id(card, pid)]
        count.contents.value = len(p.starts)
        if array is not None:
            for i, start in enumerate(sorted(p.starts)):
                array[i].start, array[i].size = start, p.memory  # type: ignore[index]
        return 0

    def gpu_instances(h: FakeGPU, pid: int, array: object, count: ctypes._Pointer) -> int:  # type: ignore[type-arg]
        card = card_of(h)
        k = profile_by_id(card, pid)
        found = [gi for gi, (pk, _, _) in sorted(card.instances.items()) if pk == k]
        for i, gi in enumerate(found):
            array[i] = gi_handle(card, gi)  # type: ignore[index]
        count.contents.value = len(found)
        return 0

    def gi_info(handle: int) -> types.SimpleNamespace:
        card, gi = handles[int(handle)]
        k, start, _ = card.instances[gi]
        p = card.geometry.profiles[k]
        placement = types.SimpleNamespace(start=start, size=p.memory)
        return types.SimpleNamespace(id=gi, profileId=p.id, placement=placement)

    def mig_devices(h: FakeGPU) -> list[MigDevice]:
        card = card_of(h)
        return [
            MigDevice(card, gi, f"MIG-{h.uuid[4:12]}-{gi:04d}-{k}-{s}")
            for gi, (k, s, cis) in sorted(card.instances.items())
            if cis
        ]

    def mig_handle(h: FakeGPU, index: int) -> MigDevice:
        found = mig_devices(h)
        if index >= len(found):
            raise NVMLError("Not Found")
        return found[index]

    def create(h: FakeGPU, pid: int, placement: ctypes._Pointer) -> int:  # type: ignore[type-arg]
        card = card_of(h)
        k = profile_by_id(card, pid)
        p = card.geometry.profiles[k]
        start = int(placement.contents.start)
        card.calls.append(f"create {p.name}@{start}")
        if start not in p.starts or int(placement.contents.size) != p.memory:
            raise NVMLError("Invalid Argument")
        if card.geometry.problems([*card.layout(), (p.name, start)]):
            raise NVMLError("Insufficient Resources")
        return gi_handle(card, card.add(p.name, start, computes=0))

    def ci_profile_info(gi: int, ci_profile: int, engines: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(id=ci_profile)

    def create_ci(gi: int, ci_id: int) -> int:
        card, ident = handles[int(gi)]
        card.instances[ident][2] += 1
        return int(gi)

    def gi_by_id(h: FakeGPU, ident: int) -> int:
        card = card_of(h)
        if ident not in card.instances:
            raise NVMLError("Not Found")
        return gi_handle(card, ident)

    def compute_instances(gi: int, ci_profile: int, array: object, count: ctypes._Pointer) -> int:  # type: ignore[type-arg]
        card, ident = handles[int(gi)]
        k = card.instances[ident][0]
        cis = card.instances[ident][2] if _CI_OF_SLICES.get(card.geometry.profiles[k].compute) == ci_profile else 0
        for i in range(cis):
            array[i] = int(gi)  # type: ignore[index]
        count.contents.value = cis
        return 0

    def destroy_ci(ci: int) -> int:
        card, ident = handles[int(ci)]
        card.instances[ident][2] -= 1
        return 0

    def destroy_gi(gi: int) -> int:
        card, ident = handles[int(gi)]
        if card.instances[ident][2]:
            raise NVMLError("In use by another client")
        card.calls.append(f"destroy {ident}")
        del card.instances[ident]
        return 0

    uuid_of_gpu = mod.nvmlDeviceGetUUID

    def uuid(h: object) -> str:
        return h.uuid if isinstance(h, MigDevice) else uuid_of_gpu(h)

    functions = {
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetGpuInstanceProfileInfo": profile_info,
        "nvmlDeviceGetGpuInstancePossiblePlacements": placements,
        "nvmlDeviceGetGpuInstances": gpu_instances,
        "nvmlGpuInstanceGetInfo": gi_info,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda mig: mig.gi,
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetName": lambda h: f"NVIDIA {cards[h.minor].product}".encode() if h.minor in cards else b"NVIDIA",
        "nvmlDeviceCreateGpuInstanceWithPlacement": create,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": ci_profile_info,
        "nvmlGpuInstanceCreateComputeInstance": create_ci,
        "nvmlDeviceGetGpuInstanceById": gi_by_id,
        "nvmlGpuInstanceGetComputeInstances": compute_instances,
        "nvmlComputeInstanceDestroy": destroy_ci,
        "nvmlGpuInstanceDestroy": destroy_gi,
    }
    for name, fn in functions.items():
        setattr(mod, name, fn)
    mod.NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12  # type: ignore[attr-defined]
    mod.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0  # type: ignore[attr-defined]
    mod.c_nvmlGpuInstancePlacement_t = Placement  # type: ignore[attr-defined]
    mod.c_nvmlGpuInstance_t = ctypes.c_uint64  # type: ignore[attr-defined]
    mod.c_nvmlComputeInstance_t = ctypes.c_uint64  # type: ignore[attr-defined]
    return mod


#: nvml.h NVML_COMPUTE_INSTANCE_PROFILE_* by slice count (the one covering a whole GPU instance).
_CI_OF_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
