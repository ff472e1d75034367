"""MIG for the simulated NVML (finesched.agent.fake_nvml), kept apart: `MIGNVML` is `FakeNVML` plus the
MIG calls agent/mig.py makes, one method per pynvml function. A card in MIG mode answers from a
product table of model/mig.py (profiles, allowed placements), holds GPU instances with compute
instances, and refuses what NVML refuses (MIG.md §3): a placement the profile does not list
(INVALID_ARGUMENT), an overlapping or over-cap one (INSUFFICIENT_RESOURCES), destroying a GPU
instance that still has compute instances (IN_USE)."""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field

from finesched.agent.fake_nvml import FakeGPU, FakeNVML, NVMLError
from finesched.model.mig import PRODUCTS, MIGGeometry

#: nvml.h NVML_COMPUTE_INSTANCE_PROFILE_* by slice count (the one covering a whole GPU instance).
_CI_OF_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


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


class MIGNVML(FakeNVML):
    """`FakeNVML` whose GPUs of minor m are MIG cards `cards[m]` (see the module docstring)."""

    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    c_nvmlGpuInstancePlacement_t = Placement
    c_nvmlGpuInstance_t = ctypes.c_uint64
    c_nvmlComputeInstance_t = ctypes.c_uint64

    def __init__(self, gpus: list[FakeGPU], cards: dict[int, FakeMIGCard]):
        super().__init__(gpus)
        self.cards = cards
        self._handles: dict[int, tuple[FakeMIGCard, int]] = {}

    # helpers ----------------------------------------------------------------------------------
    def _card(self, h: FakeGPU) -> FakeMIGCard:
        card = self.cards.get(h.minor)
        if card is None or not card.enabled:
            raise NVMLError("Not Supported")
        return card

    def _gi_handle(self, card: FakeMIGCard, gi: int) -> int:
        key = 1000 * (id(card) % 100000) + gi
        self._handles[key] = (card, gi)
        return key

    @staticmethod
    def _profile(card: FakeMIGCard, pid: int) -> int:
        for k, p in enumerate(card.geometry.profiles):
            if p.id == pid:
                return k
        raise NVMLError("Invalid Argument")

    def _mig_devices(self, h: FakeGPU) -> list[MigDevice]:
        card = self._card(h)
        return [
            MigDevice(card, gi, f"MIG-{h.uuid[4:12]}-{gi:04d}-{k}-{s}")
            for gi, (k, s, cis) in sorted(card.instances.items())
            if cis
        ]

    # pynvml's MIG calls -----------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h: FakeGPU) -> list[int]:
        card = self.cards.get(h.minor)
        if card is None:
            raise NVMLError("Not Supported")
        return [int(card.enabled), int(card.enabled)]

    def nvmlDeviceGetName(self, h: FakeGPU) -> bytes:
        card = self.cards.get(h.minor)
        return f"NVIDIA {card.product}".encode() if card else b"NVIDIA"

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: FakeGPU, const: int) -> types.SimpleNamespace:
        g = self._card(h).geometry
        if const >= len(g.profiles):
            raise NVMLError("Invalid Argument")
        p = g.profiles[const]
        return types.SimpleNamespace(
            id=p.id, sliceCount=p.compute, instanceCount=p.max, memorySizeMB=p.memory * 10240,
            name=f"MIG {p.name}".encode(),
        )  # fmt: skip

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: FakeGPU, pid: int, array: object, count: object) -> int:
        card = self._card(h)
        p = card.geometry.profiles[self._profile(card, pid)]
        count.contents.value = len(p.starts)  # type: ignore[attr-defined]
        if array is not None:
            for i, start in enumerate(sorted(p.starts)):
                array[i].start, array[i].size = start, p.memory  # type: ignore[index]
        return 0

    def nvmlDeviceGetGpuInstances(self, h: FakeGPU, pid: int, array: object, count: object) -> int:
        card = self._card(h)
        k = self._profile(card, pid)
        found = [gi for gi, (pk, _, _) in sorted(card.instances.items()) if pk == k]
        for i, gi in enumerate(found):
            array[i] = self._gi_handle(card, gi)  # type: ignore[index]
        count.contents.value = len(found)  # type: ignore[attr-defined]
        return 0

    def nvmlGpuInstanceGetInfo(self, handle: int) -> types.SimpleNamespace:
        card, gi = self._handles[int(handle)]
        k, start, _ = card.instances[gi]
        p = card.geometry.profiles[k]
        placement = types.SimpleNamespace(start=start, size=p.memory)
        return types.SimpleNamespace(id=gi, profileId=p.id, placement=placement)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGPU) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGPU, index: int) -> MigDevice:
        found = self._mig_devices(h)
        if index >= len(found):
            raise NVMLError("Not Found")
        return found[index]

    def nvmlDeviceGetGpuInstanceId(self, mig: MigDevice) -> int:
        return mig.gi

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # type: ignore[override]
        return handle.uuid if isinstance(handle, MigDevice) else super().nvmlDeviceGetUUID(handle)  # type: ignore[arg-type]

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: FakeGPU, pid: int, placement: object) -> int:
        card = self._card(h)
        p = card.geometry.profiles[self._profile(card, pid)]
        start, size = int(placement.contents.start), int(placement.contents.size)  # type: ignore[attr-defined]
        card.calls.append(f"create {p.name}@{start}")
        if start not in p.starts or size != p.memory:
            raise NVMLError("Invalid Argument")
        if card.geometry.problems([*card.layout(), (p.name, start)]):
            raise NVMLError("Insufficient Resources")
        return self._gi_handle(card, card.add(p.name, start, computes=0))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: int, ci_profile: int, engines: int
    ) -> types.SimpleNamespace:
        return types.SimpleNamespace(id=ci_profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_id: int) -> int:
        card, ident = self._handles[int(gi)]
        card.instances[ident][2] += 1
        return int(gi)

    def nvmlDeviceGetGpuInstanceById(self, h: FakeGPU, ident: int) -> int:
        card = self._card(h)
        if ident not in card.instances:
            raise NVMLError("Not Found")
        return self._gi_handle(card, ident)

    def nvmlGpuInstanceGetComputeInstances(self, gi: int, ci_profile: int, array: object, count: object) -> int:
        card, ident = self._handles[int(gi)]
        k = card.instances[ident][0]
        covering = _CI_OF_SLICES.get(card.geometry.profiles[k].compute) == ci_profile
        cis = card.instances[ident][2] if covering else 0
        for i in range(cis):
            array[i] = int(gi)  # type: ignore[index]
        count.contents.value = cis  # type: ignore[attr-defined]
        return 0

    def nvmlComputeInstanceDestroy(self, ci: int) -> int:
        card, ident = self._handles[int(ci)]
        card.instances[ident][2] -= 1
        return 0

    def nvmlGpuInstanceDestroy(self, gi: int) -> int:
        card, ident = self._handles[int(gi)]
        if card.instances[ident][2]:
            raise NVMLError("In use by another client")
        card.calls.append(f"destroy {ident}")
        del card.instances[ident]
        return 0
