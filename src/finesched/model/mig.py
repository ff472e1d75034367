"""NVIDIA MIG (Multi-Instance GPU): profile tables per product, placement rules, a card's instances.

Facts from ../shared/reference/MIG.md (our digest of NVIDIA's MIG user guide, ``nvml.h`` and
``nvidia-smi mig -lgipp`` captures). A MIG-capable card has a *placement axis* of memory slices
(8 on A100/H100/H200, 4 on A30: the width is the product's, never a constant). A GPU instance of a
profile occupies ``memory`` consecutive slices from one of the profile's allowed ``starts`` and
``compute`` of the card's SM slices. An instance may be placed only (MIG.md §0, §2):

1. at one of its profile's starts, inside the axis;
2. on slices no other instance of the card occupies (``nvml.h``: creation fails on overlap);
3. while fewer than ``max`` instances of its profile exist (the guide's "instances available");
4. while the card's compute slices last (A100/H100 start lists never need more than 7; the check
   keeps an NVML-reported table honest too);
5. at most one media-extension (``+me``) instance per card (§2.7: one "+me" instance; on A30 the
   two "+me" profiles share the chip's single JPEG/OFA engine, so they exclude each other).

`MIGGeometry` is a product's table as an immutable value (what the state interns and the allocator
reads); `MIGSpec` is the manifest form on a GPU device (a known ``product`` or the profile table
as NVML reports it, the mode, and the instances that exist on the card). `MIGPlacement` names one
instance a binding holds (profile, start, and the instance's UUID once known).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from finesched.model.base import Loc, Model, raise_problems

#: Workloads ask for MIG instances as ``nvidia.com/mig-<profile>: N`` (the device plugin's "mixed"
#: strategy names, MIG.md §5). A resource name cannot hold "+", so NVIDIA's device plugin writes a
#: media-extension profile with a dot: ``1g.10gb+me`` is ``nvidia.com/mig-1g.10gb.me``.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
PROFILE_PATTERN = r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+me)?$"
_PROFILE_RE = re.compile(PROFILE_PATTERN)
_RESOURCE_RE = re.compile(r"^([1-9][0-9]*g\.[1-9][0-9]*gb)(\.me)?$")
MIGMode = Literal["static", "dynamic"]
#: Widest placement axis accepted (RTX PRO 6000 Blackwell has 12, MIG.md §0); masks are Python ints.
MAX_MEMORY_SLICES = 32


def mig_profile_of(resource: str) -> str | None:
    """``nvidia.com/mig-3g.40gb`` -> ``3g.40gb``, ``nvidia.com/mig-1g.10gb.me`` -> ``1g.10gb+me``;
    None for any other resource name."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    match = _RESOURCE_RE.match(resource[len(MIG_RESOURCE_PREFIX) :])
    if match is None:
        return None
    return match.group(1) + ("+me" if match.group(2) else "")


def mig_resource(profile: str) -> str:
    """The resource name of a profile (``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``)."""
    return MIG_RESOURCE_PREFIX + profile.replace("+me", ".me")


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """One GPU instance profile of a product (MIG.md §1 columns)."""

    name: str
    compute: int
    memory: int
    max: int
    starts: tuple[int, ...]
    id: int | None = None

    @property
    def media(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True)
class MIGGeometry:
    """A product's placement axis and profile table. Placements are (profile index, start), in
    profile order then start order; ``masks[k]`` is placement k's set of memory slices as bits."""

    name: str
    memory_slices: int
    compute_slices: int
    profiles: tuple[ProfileSpec, ...]
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        self._index.update({p.name: k for k, p in enumerate(self.profiles)})
        object.__setattr__(self, "_hash", hash((self.name, self.memory_slices, self.compute_slices, self.profiles)))

    def __hash__(self) -> int:  # hashed once: geometries key many caches
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def profile_index(self, name: str) -> int | None:
        return self._index.get(name)

    @cached_property
    def placements(self) -> tuple[tuple[int, int], ...]:
        return tuple((k, s) for k, p in enumerate(self.profiles) for s in sorted(p.starts))

    @cached_property
    def masks(self) -> tuple[int, ...]:
        return tuple(((1 << self.profiles[k].memory) - 1) << s for k, s in self.placements)

    @cached_property
    def placement_lookup(self) -> dict[tuple[str, int], int]:
        """(profile name, start) -> placement index."""
        return {(self.profiles[k].name, s): j for j, (k, s) in enumerate(self.placements)}

    @cached_property
    def of_profile(self) -> tuple[tuple[int, ...], ...]:
        """Per profile index, its placement indices (start ascending)."""
        out: list[list[int]] = [[] for _ in self.profiles]
        for j, (k, _) in enumerate(self.placements):
            out[k].append(j)
        return tuple(tuple(x) for x in out)

    @cached_property
    def by_size(self) -> tuple[int, ...]:
        """Profile indices from the largest (memory, then compute) to the smallest, table order on ties."""
        return tuple(
            sorted(range(len(self.profiles)), key=lambda k: (-self.profiles[k].memory, -self.profiles[k].compute, k))
        )

    def problems(self, instances: list[tuple[str, int]]) -> list[tuple[int, str, str, object]]:
        """Why a set of instances ``[(profile, start)]`` cannot coexist on one card of this product:
        ``(position, field, message, value)`` per problem (rules 1-5 of the module docstring)."""
        out: list[tuple[int, str, str, object]] = []
        taken = compute = media = 0
        counts: dict[str, int] = {}
        for i, (name, start) in enumerate(instances):
            k = self.profile_index(name)
            if k is None:
                out.append(
                    (i, "profile", f"not a profile of {self.name}; known: {[p.name for p in self.profiles]}", name)
                )
                continue
            p = self.profiles[k]
            if start not in p.starts:
                out.append((i, "start", f"{name} may start only at {sorted(p.starts)} on {self.name}", start))
                continue
            mask = ((1 << p.memory) - 1) << start
            if mask & taken:
                out.append((i, "start", f"{name} at {start} overlaps memory slices of another instance", start))
                continue
            counts[name] = counts.get(name, 0) + 1
            if counts[name] > p.max:
                out.append((i, "profile", f"at most {p.max} {name} instance(s) per card", name))
                continue
            if compute + p.compute > self.compute_slices:
                out.append(
                    (i, "profile", f"needs {p.compute} compute slices; {self.compute_slices - compute} left", name)
                )
                continue
            if p.media and media:
                out.append((i, "profile", "at most one media-extension (+me) instance per card", name))
                continue
            taken |= mask
            compute += p.compute
            media += p.media
        return out


def _geometry(
    name: str, memory: int, compute: int, rows: list[tuple[str, int | None, int, int, int, tuple[int, ...]]]
) -> MIGGeometry:
    profiles = tuple(ProfileSpec(n, c, m, mx, starts, pid) for n, pid, c, m, mx, starts in rows)
    return MIGGeometry(name, memory, compute, profiles)


_SEVEN = (0, 1, 2, 3, 4, 5, 6)


def _eight_slice(name: str, one: str, one_big: str, two: str, three: str, four: str, seven: str) -> MIGGeometry:
    """The A100/H100/H200 table (MIG.md §1.1-1.5): 8 memory slices, 7 compute slices, GI ids 19/20/15/14/9/5/0."""
    return _geometry(
        name,
        8,
        7,
        [
            (one, 19, 1, 1, 7, _SEVEN),
            (f"{one}+me", 20, 1, 1, 1, _SEVEN),
            (one_big, 15, 1, 2, 4, (0, 2, 4, 6)),
            (two, 14, 2, 2, 3, (0, 2, 4)),
            (three, 9, 3, 4, 2, (0, 4)),
            (four, 5, 4, 4, 1, (0,)),
            (seven, 0, 7, 8, 1, (0,)),
        ],
    )


#: The included products. Sources (MIG.md): §1.1 A100-40GB (guide lgip/lgipp output); §1.2
#: A100-80GB (names documented, placements those of the 40GB chip); §1.3 H100-80GB (lgipp
#: captures); §1.4 H100-94GB (H100 NVL captures) and H100-96GB (names from the guide, placements
#: and ids inferred, same die); §1.5 H200-141GB (names from the guide, placements and ids
#: inferred from H100: no capture seen); §1.6 A30-24GB (two lgipp captures; a 4-slice axis).
PRODUCTS: dict[str, MIGGeometry] = {
    "A100-40GB": _eight_slice("A100-40GB", "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": _eight_slice("A100-80GB", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": _eight_slice("H100-80GB", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-94GB": _eight_slice("H100-94GB", "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H100-96GB": _eight_slice("H100-96GB", "1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    "H200-141GB": _eight_slice("H200-141GB", "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    "A30-24GB": _geometry(
        "A30-24GB",
        4,
        4,
        [
            ("1g.6gb", 14, 1, 1, 4, (0, 1, 2, 3)),
            ("1g.6gb+me", 21, 1, 1, 1, (0, 1, 2, 3)),
            ("2g.12gb", 5, 2, 2, 2, (0, 2)),
            ("2g.12gb+me", 6, 2, 2, 1, (0, 2)),
            ("4g.24gb", 0, 4, 4, 1, (0,)),
        ],
    ),
}


class MIGProfile(Model):
    """A profile as NVML reports it (``nvmlDeviceGetGpuInstanceProfileInfo`` and
    ``…PossiblePlacements``): compute and memory slices, the instance cap, the allowed starts."""

    name: str = Field(pattern=PROFILE_PATTERN)
    id: NonNegativeInt | None = None
    compute: PositiveInt
    memory: PositiveInt
    max: PositiveInt
    starts: tuple[NonNegativeInt, ...] = Field(min_length=1)


class MIGInstance(Model):
    """A GPU instance that exists on the card (made by an admin, mig-parted, or the agent)."""

    profile: str = Field(pattern=PROFILE_PATTERN)
    start: NonNegativeInt
    uuid: str | None = None


class MIGPlacement(Model):
    """The MIG instance a binding holds: profile and start on the granted card; `uuid` is the
    instance's (known for an existing instance; the agent learns it when it creates one)."""

    profile: str = Field(pattern=PROFILE_PATTERN)
    start: NonNegativeInt
    uuid: str | None = None


class MIGSpec(Model):
    """A GPU in MIG mode (Device ``mig``). Either a known ``product`` (PRODUCTS) or the profile table
    (``memorySlices``, ``computeSlices``, ``profiles``; the agent sends what NVML reports).

    ``mode``: ``static``: finesched only assigns the ``instances`` that exist; ``dynamic``: it may also
    choose a new placement, which the node's agent creates through NVML. Instances must be valid
    together on the card (the module docstring's rules).
    """

    product: str | None = None
    mode: MIGMode = "dynamic"
    memory_slices: PositiveInt | None = Field(default=None, le=MAX_MEMORY_SLICES)
    compute_slices: PositiveInt | None = None
    profiles: tuple[MIGProfile, ...] = ()
    instances: tuple[MIGInstance, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> MIGSpec:
        problems = self._table_problems()
        if not problems:
            geometry = self.geometry
            found = geometry.problems([(inst.profile, inst.start) for inst in self.instances])
            problems = [(("instances", i, where), msg, value) for i, where, msg, value in found]
        raise_problems(problems, "MIGSpec")
        return self

    def _table_problems(self) -> list[tuple[Loc, str, object]]:
        if not self.profiles:
            if self.product is None:
                return [(("product",), f"give a product ({', '.join(PRODUCTS)}) or the profile table", None)]
            if self.product not in PRODUCTS:
                return [
                    (
                        ("product",),
                        f"unknown MIG product; known: {', '.join(PRODUCTS)} (or give profiles)",
                        self.product,
                    )
                ]
            return []
        problems: list[tuple[Loc, str, object]] = []
        for name in ("memory_slices", "compute_slices"):
            if getattr(self, name) is None:
                problems.append(((name,), "required with an explicit profile table", None))
        if problems:
            return problems
        assert self.memory_slices is not None and self.compute_slices is not None
        seen: set[str] = set()
        for i, p in enumerate(self.profiles):
            if p.name in seen:
                problems.append((("profiles", i, "name"), "duplicate profile name", p.name))
            seen.add(p.name)
            if p.compute > self.compute_slices:
                problems.append(
                    (("profiles", i, "compute"), f"above the card's {self.compute_slices} compute slices", p.compute)
                )
            for start in p.starts:
                if start + p.memory > self.memory_slices:
                    rule = f"start + memory ({start} + {p.memory}) is past the {self.memory_slices}-slice axis"
                    problems.append((("profiles", i, "starts"), rule, start))
        return problems

    @property
    def geometry(self) -> MIGGeometry:
        """The product's table, or the one given (interned: equal tables are one object)."""
        if not self.profiles:
            assert self.product is not None
            return PRODUCTS[self.product]
        assert self.memory_slices is not None and self.compute_slices is not None
        rows = tuple((p.name, p.id, p.compute, p.memory, p.max, tuple(sorted(p.starts))) for p in self.profiles)
        return _custom(self.product or "custom", self.memory_slices, self.compute_slices, rows)


@lru_cache(maxsize=256)
def _custom(
    name: str, memory: int, compute: int, rows: tuple[tuple[str, int | None, int, int, int, tuple[int, ...]], ...]
) -> MIGGeometry:
    return _geometry(name, memory, compute, list(rows))
