"""One MIG card as the scheduler sees it: an immutable value with its slice arithmetic.

`MIGCard` holds a card's product geometry (model/mig.py), its mode and health, and two sets of
placements as bits over ``geometry.placements``: ``existing`` (the instances the node reports) and
``held`` (those bindings hold). Their union occupies memory slices, compute slices, profile caps and
the one media-extension slot (`usage`). A placement is grantable when it is an existing instance
nobody holds, or, on a dynamic card, a new placement the product allows beside everything on the
card (`creatable`). `capacity(k)` is how many more instances of profile k the card can give at
once: free existing ones plus, on a dynamic card, ``min(free placements on the axis, cap left,
compute left // compute, media slot)``; the free placements are counted greedily by start, which
is optimal for intervals of one length. The helpers are memoized per (geometry, bits): a cluster
has few distinct card states.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from finesched.model.mig import MIGGeometry, MIGInstance


@dataclass(frozen=True, slots=True)
class Usage:
    """What a set of placements takes on a card: slice bits, compute slices, count per profile, +me used."""

    slices: int
    compute: int
    counts: tuple[int, ...]
    media: bool


@lru_cache(maxsize=65536)
def usage(geometry: MIGGeometry, bits: int) -> Usage:
    slices = compute = 0
    counts = [0] * len(geometry.profiles)
    media = False
    j = 0
    while bits >> j:
        if bits >> j & 1:
            k, _ = geometry.placements[j]
            p = geometry.profiles[k]
            slices |= geometry.masks[j]
            compute += p.compute
            counts[k] += 1
            media = media or p.media
        j += 1
    return Usage(slices, compute, tuple(counts), media)


@lru_cache(maxsize=65536)
def free_placements(geometry: MIGGeometry, k: int, occupied: int) -> int:
    """Most instances of profile k that fit at once in the slices not `occupied` (earliest start
    first: optimal for intervals of one length)."""
    taken, count = occupied, 0
    for j in geometry.of_profile[k]:
        if not geometry.masks[j] & taken:
            taken |= geometry.masks[j]
            count += 1
    return count


@lru_cache(maxsize=4096)
def profile_bits(geometry: MIGGeometry, k: int) -> int:
    return sum(1 << j for j in geometry.of_profile[k])


@dataclass(frozen=True, slots=True)
class MIGCard:
    """One MIG card (immutable; the state replaces it on every change). Bits index placements."""

    minor: int
    geometry: MIGGeometry
    dynamic: bool
    healthy: bool
    existing: int = 0
    held: int = 0
    uuids: tuple[tuple[int, str], ...] = ()

    @property
    def usage(self) -> Usage:
        return usage(self.geometry, self.existing | self.held)

    @property
    def unheld(self) -> int:
        """Existing instances no binding holds: assignable as they are."""
        return self.existing & ~self.held

    def creatable(self, j: int) -> bool:
        """A new instance at placement j fits beside everything on the card (rules of model/mig.py)."""
        if not self.dynamic or not self.healthy or (self.existing | self.held) >> j & 1:
            return False
        k, _ = self.geometry.placements[j]
        p, u = self.geometry.profiles[k], self.usage
        return (
            not self.geometry.masks[j] & u.slices
            and u.counts[k] < p.max
            and u.compute + p.compute <= self.geometry.compute_slices
            and not (p.media and u.media)
        )

    def grantable(self, j: int) -> bool:
        return self.healthy and bool(self.unheld >> j & 1 or self.creatable(j))

    def capacity(self, k: int) -> int:
        """How many more instances of profile k the card can give at once (module docstring)."""
        if not self.healthy:
            return 0
        ready = (self.unheld & profile_bits(self.geometry, k)).bit_count()
        if not self.dynamic:
            return ready
        p, u = self.geometry.profiles[k], self.usage
        new = min(
            free_placements(self.geometry, k, u.slices),
            p.max - u.counts[k],
            (self.geometry.compute_slices - u.compute) // p.compute,
            (0 if u.media else 1) if p.media else self.geometry.memory_slices,
        )
        return ready + max(new, 0)

    def free_slices(self) -> int:
        return self.geometry.memory_slices - self.usage.slices.bit_count()

    def with_held(self, j: int, on: bool = True) -> MIGCard:
        return replace(self, held=self.held | (1 << j) if on else self.held & ~(1 << j))

    def uuid_of(self, j: int) -> str | None:
        return next((u for pj, u in self.uuids if pj == j), None)


def card_of(
    minor: int, spec_geometry: MIGGeometry, dynamic: bool, healthy: bool, instances: Iterable[MIGInstance]
) -> MIGCard:
    """A card from its manifest or report: instances become `existing` bits (with their UUIDs)."""
    existing, uuids = 0, []
    for inst in instances:
        j = spec_geometry.placement_lookup[(inst.profile, inst.start)]
        existing |= 1 << j
        if inst.uuid:
            uuids.append((j, inst.uuid))
    return MIGCard(minor, spec_geometry, dynamic, healthy, existing, 0, tuple(uuids))
