"""MIG slice counters: every MIG card's memory and compute slices as shared counters (DRA's
partitionable devices, ../shared/reference/PROTOCOLS.md section 4), kept beside the device accounts.

A GPU in MIG mode (Device ``mig``, model/mig.py) never enters the software-share arrays of
state/devices.py; it lives here as a `MIGCard` (state/mig_cards.py: existing and held placements,
what is grantable, capacity per profile). The `NodeExtra` named "mig" keeps every node's cards in
step with its bindings: an instance a binding holds consumes its slices, so two held instances
never share a slice and every held instance is a placement the card's product allows (`violations`
checks both). Per node and profile name the sum of the cards' capacities is kept in `fit`
([capacity, profiles]) on every change, so the filter for "N instances of profile p" is one
comparison per node. Agents' reports replace a card's existing instances (`apply_mig_report`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.device_allocated import AnnotationError, binding_devices
from finesched.model.mig import MIGInstance, MIGPlacement
from finesched.model.node import Node
from finesched.model.resources import GPU
from finesched.state.cluster import ClusterState, StateError
from finesched.state.mig_cards import MIGCard, card_of

Int64Array = npt.NDArray[np.int64]
_ROWS_CACHE = 4096


def mig_grants(binding: Binding) -> list[tuple[int, MIGPlacement]]:
    """The (minor, placement) MIG grants a binding holds (its devices, else its device-allocated annotation)."""
    try:
        devices = binding_devices(binding)
    except AnnotationError as exc:
        raise StateError(f"binding {binding.workload}: {exc}") from None
    return [(g.minor, g.mig) for g in devices.get(GPU, ()) if g.mig is not None]


class MIGSlices:
    """The `NodeExtra` named "mig": every node's MIG cards (minor order) and the per-profile `fit`."""

    name = "mig"
    #: A binding without devices holds no MIG instance: skipped for plain scalar bindings (state/cluster.py).
    quiet_for_plain_scalar = True

    def __init__(self) -> None:
        self.capacity = 0
        self.cards: list[tuple[MIGCard, ...]] = []
        #: Profile name -> column of `fit` (names interned across products as they appear).
        self.profile_ids: dict[str, int] = {}
        self.fit = np.zeros((0, 0), dtype=np.int64)
        #: Memory slices of each profile column on the node's first card offering it (0: none).
        self.profile_slices = np.zeros((0, 0), dtype=np.int64)
        self._with_cards: set[int] = set()
        self.slices_total = np.zeros(0, dtype=np.int64)
        self.slices_used = np.zeros(0, dtype=np.int64)
        #: Per node: how many MIG cards, and whether one of them is dynamic (for reasons).
        self.card_count = np.zeros(0, dtype=np.int64)
        self.any_dynamic = np.zeros(0, dtype=bool)
        self.rebuilding = False
        self._names: list[str | None] = []
        self._held: list[dict[str, tuple[tuple[int, int], ...]]] = []  # key -> ((card index, placement))
        self._replay: list[set[str]] = []
        self._tolerated: list[set[str]] = []
        #: Per node, minor -> (the card's manifest spec, instances its agent last reported): a report
        #: is fresher than the manifest the agent registered, until the manifest itself changes.
        self._reported: list[dict[int, tuple[object, tuple[MIGInstance, ...]]]] = []
        self._specs: list[dict[int, object]] = []
        #: A node's cards -> its `fit` / `profile_slices` rows and slice counts (`_refresh`): cards
        #: are immutable values and nodes of one shape pass through the same card states again and
        #: again. Columns follow `profile_ids`, so `restore` and a widened `fit` clear it.
        self._rows: dict[tuple[MIGCard, ...], tuple[Int64Array, Int64Array, int, int]] = {}

    # NodeExtra ----------------------------------------------------------------------------------
    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self.cards = (self.cards + [()] * capacity)[:capacity]
        rows = min(capacity, self.fit.shape[0])
        for name in ("fit", "profile_slices"):
            old = getattr(self, name)
            new = np.zeros((capacity, old.shape[1]), dtype=np.int64)
            new[:rows] = old[:rows]
            setattr(self, name, new)
        self._with_cards = {i for i in self._with_cards if i < capacity}
        for name in ("slices_total", "slices_used", "card_count", "any_dynamic"):
            old = getattr(self, name)
            new = np.zeros(capacity, dtype=old.dtype)
            new[: min(capacity, len(old))] = old[:capacity]
            setattr(self, name, new)
        self._names = (self._names + [None] * capacity)[:capacity]
        for lst, make in (
            (self._held, dict),
            (self._replay, set),
            (self._tolerated, set),
            (self._reported, dict),
            (self._specs, dict),
        ):
            del lst[capacity:]
            lst.extend(make() for _ in range(capacity - len(lst)))

    def set_node(self, index: int, node: Node) -> None:
        i = index
        self._names[i] = node.name
        self._replay[i] |= set(self._held[i])
        self._held[i], self._tolerated[i] = {}, set()
        cards, reported = [], {}
        for device in sorted((d for d in node.devices if d.type == GPU and d.mig is not None), key=lambda d: d.minor):
            spec = device.mig
            assert spec is not None
            instances = spec.instances
            last = self._reported[i].get(device.minor)
            if last is not None and last[0] == spec:
                instances, reported[device.minor] = last[1], last
            cards.append(card_of(device.minor, spec.geometry, spec.mode == "dynamic", device.health, instances))
        self.cards[i] = tuple(cards)
        self._reported[i] = reported
        self._specs[i] = {d.minor: d.mig for d in node.devices if d.type == GPU and d.mig is not None}
        self._refresh(i)

    def move(self, src: int, dst: int) -> None:
        self.cards[dst] = self.cards[src]
        self.fit[dst], self.profile_slices[dst] = self.fit[src], self.profile_slices[src]
        self._with_cards.discard(src)
        if self.cards[dst]:
            self._with_cards.add(dst)
        self.slices_total[dst], self.slices_used[dst] = self.slices_total[src], self.slices_used[src]
        self.card_count[dst], self.any_dynamic[dst] = self.card_count[src], self.any_dynamic[src]
        self._names[dst] = self._names[src]
        self._held[dst], self._replay[dst], self._tolerated[dst] = (
            self._held[src],
            self._replay[src],
            self._tolerated[src],
        )
        self._reported[dst], self._specs[dst] = self._reported[src], self._specs[src]

    def clear(self, index: int) -> None:
        self.cards[index] = ()
        self.fit[index] = self.profile_slices[index] = 0
        self._with_cards.discard(index)
        self.slices_total[index] = self.slices_used[index] = self.card_count[index] = 0
        self.any_dynamic[index] = False
        self._names[index] = None
        self._held[index], self._replay[index], self._tolerated[index] = {}, set(), set()
        self._reported[index], self._specs[index] = {}, {}

    def assume(self, index: int, binding: Binding) -> None:
        """Hold the binding's MIG instances; StateError (nothing changed) for a placement the card's
        product does not allow, a card that is not in MIG mode, or slices already taken."""
        if binding.devices and all(g.mig is None for g in binding.devices.get(GPU, ())):
            return  # the hot path: a binding without MIG instances (its devices are the record)
        grants = mig_grants(binding)
        if not grants:
            return
        i, key = index, binding.workload
        replay = key in self._replay[i] or self.rebuilding
        cards = list(self.cards[i])
        taken: list[tuple[int, int]] = []
        on_unhealthy = False
        where = f"binding {key} on {self._names[i]}"
        for minor, placement in grants:
            c = self._card_index(i, minor)
            if c is None:
                raise StateError(f"{where}: gpu {minor} is not a MIG card of the node")
            card = cards[c]
            j = card.geometry.placement_lookup.get((placement.profile, placement.start))
            if j is None:
                raise StateError(
                    f"{where}: {placement.profile} at start {placement.start} is not a placement "
                    f"{card.geometry.name} allows on gpu {minor}"
                )
            if not card.healthy:
                if not replay:
                    raise StateError(f"{where}: gpu {minor} is unhealthy")
                on_unhealthy = True
                card = replace(card, healthy=True)  # judged as if healthy: the instance exists
            if not card.grantable(j):
                raise StateError(
                    f"{where}: {placement.profile} at start {placement.start} on gpu {minor} is taken "
                    f"or does not fit beside the card's other instances"
                )
            cards[c] = replace(card.with_held(j), healthy=cards[c].healthy)
            taken.append((c, j))
        self.cards[i] = tuple(cards)
        self._held[i][key] = tuple(taken)
        self._replay[i].discard(key)
        if on_unhealthy:
            self._tolerated[i].add(key)
        self._refresh(i)

    def forget(self, index: int, binding: Binding) -> None:
        i = index
        taken = self._held[i].pop(binding.workload, None)
        self._tolerated[i].discard(binding.workload)
        if taken is None:
            return
        cards = list(self.cards[i])
        for c, j in taken:
            cards[c] = cards[c].with_held(j, on=False)
        self.cards[i] = tuple(cards)
        self._refresh(i)

    #: What `snapshot` copies (arrays, lists of per-node dicts/sets, dicts): everything the extra holds.
    _SAVED = (
        "cards", "fit", "profile_slices", "slices_total", "slices_used", "card_count", "any_dynamic", "profile_ids",
        "_names", "_held", "_replay", "_tolerated", "_with_cards", "_reported", "_specs",
    )  # fmt: skip

    def snapshot(self) -> object:
        return {name: _copy(getattr(self, name)) for name in self._SAVED}

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, dict)
        capacity = self.capacity
        for name, value in snapshot.items():
            setattr(self, name, _copy(value))
        self._rows = {}
        self.resize(capacity)

    # Reports ------------------------------------------------------------------------------------
    def set_instances(self, index: int, instances: Mapping[int, Sequence[MIGInstance]]) -> None:
        """Replace the existing instances of node `index`'s MIG cards (by minor) with what its agent
        reports; StateError (nothing changed) when an instance is not a placement of the card's
        product, or does not fit beside the instances bindings hold."""
        cards = list(self.cards[index])
        reported: dict[int, tuple[object, tuple[MIGInstance, ...]]] = {}
        for minor, found in instances.items():
            c = self._card_index(index, minor)
            if c is None:
                raise StateError(f"{self._names[index]}: gpu {minor} is not a MIG card")
            card = cards[c]
            problems = card.geometry.problems([(x.profile, x.start) for x in found])
            if problems:
                _, field, msg, value = problems[0]
                raise StateError(f"{self._names[index]}: gpu {minor} instance {field} {value!r}: {msg}")
            fresh = card_of(minor, card.geometry, card.dynamic, card.healthy, found)
            merged = replace(fresh, held=0)
            for j in range(len(card.geometry.placements)):
                if card.held >> j & 1:
                    if not merged.grantable(j):
                        raise StateError(
                            f"{self._names[index]}: gpu {minor} reports instances overlapping "
                            f"{card.geometry.profiles[card.geometry.placements[j][0]].name} held by a binding"
                        )
                    merged = merged.with_held(j)
            cards[c] = merged
            reported[minor] = (self._specs[index].get(minor), tuple(found))
        self.cards[index] = tuple(cards)
        self._reported[index] = {**self._reported[index], **reported}
        self._refresh(index)

    # Queries ------------------------------------------------------------------------------------
    def profile_column(self, profile: str) -> int | None:
        return self.profile_ids.get(profile)

    def has_cards(self) -> bool:
        """Some node has a MIG GPU (O(1): asked on every decision)."""
        return bool(self._with_cards)

    def held(self, index: int) -> Mapping[str, tuple[tuple[int, int], ...]]:
        return self._held[index]

    def _card_index(self, i: int, minor: int) -> int | None:
        return next((c for c, card in enumerate(self.cards[i]) if card.minor == minor), None)

    def _refresh(self, i: int) -> None:
        """Recompute node i's per-profile capacity row and slice counts (memoized per card tuple)."""
        cards = self.cards[i]
        hit = self._rows.get(cards)
        if hit is None:
            hit = self._row_of(cards)
            if len(self._rows) >= _ROWS_CACHE:
                self._rows.clear()
            self._rows[cards] = hit
        row, sizes, total, used = hit
        self.fit[i], self.profile_slices[i] = row, sizes
        self.slices_total[i], self.slices_used[i] = total, used
        self.card_count[i], self.any_dynamic[i] = len(cards), any(c.dynamic for c in cards)
        if cards:
            self._with_cards.add(i)
        else:
            self._with_cards.discard(i)

    def _row_of(self, cards: tuple[MIGCard, ...]) -> tuple[Int64Array, Int64Array, int, int]:
        """`fit` and `profile_slices` rows, healthy and used memory slices of a node with `cards`
        (interning new profile names, widening the arrays when they need more columns)."""
        for card in cards:
            for p in card.geometry.profiles:
                if p.name not in self.profile_ids:
                    self.profile_ids[p.name] = len(self.profile_ids)
        if len(self.profile_ids) > self.fit.shape[1]:
            for name in ("fit", "profile_slices"):
                old = getattr(self, name)
                new = np.zeros((self.capacity, len(self.profile_ids) + 8), dtype=np.int64)
                new[:, : old.shape[1]] = old
                setattr(self, name, new)
            self._rows.clear()  # rows of the old width
        row = np.zeros(self.fit.shape[1], dtype=np.int64)
        sizes = np.zeros(self.fit.shape[1], dtype=np.int64)
        total = used = 0
        for card in cards:
            for k, p in enumerate(card.geometry.profiles):
                col = self.profile_ids[p.name]
                row[col] += card.capacity(k)
                sizes[col] = sizes[col] or p.memory
            if card.healthy:
                total += card.geometry.memory_slices
                used += card.geometry.memory_slices - card.free_slices()
        row.flags.writeable = sizes.flags.writeable = False  # shared by every node with these cards
        return row, sizes, total, used

    # Invariants ---------------------------------------------------------------------------------
    def violations(self) -> list[str]:
        """No slice held twice, every held instance a placement its product allows, held bits equal
        the bindings' grants, existing + held instances valid together on each card."""
        out: list[str] = []
        for i, name in enumerate(self._names):
            if name is None:
                continue
            expected = [0] * len(self.cards[i])
            for key, taken in self._held[i].items():
                for c, j in taken:
                    if expected[c] >> j & 1:
                        out.append(f"{name}: {key} holds one MIG placement twice")
                    expected[c] |= 1 << j
            for c, card in enumerate(self.cards[i]):
                if card.held != expected[c]:
                    out.append(f"{name}: gpu {card.minor} held placements {card.held:#x} != bindings' {expected[c]:#x}")
                g = card.geometry
                union = card.existing | card.held
                chosen = [
                    (g.profiles[g.placements[j][0]].name, g.placements[j][1])
                    for j in range(len(g.placements))
                    if union >> j & 1
                ]
                for _, field, msg, value in g.problems(chosen):
                    out.append(f"{name}: gpu {card.minor} MIG {field} {value!r}: {msg}")
                mine = [k for k, t in self._held[i].items() for cc, _ in t if cc == c]
                if not card.healthy and any(k not in self._tolerated[i] for k in mine):
                    out.append(f"{name}: a new MIG instance was granted on unhealthy gpu {card.minor}")
                if not card.dynamic and card.held & ~card.existing:
                    out.append(f"{name}: static gpu {card.minor} holds an instance that does not exist")
        return out


def _copy(value: object) -> object:
    """A copy deep enough for a snapshot: arrays, containers, and per-node containers in lists."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [x.copy() if isinstance(x, (dict, set)) else x for x in value]
    if isinstance(value, (dict, set)):
        return value.copy()
    return value


def apply_mig_report(state: ClusterState, name: str, instances: Mapping[str, Sequence[Mapping[str, object]]]) -> None:
    """An agent's reported MIG instances ``{minor: [{profile, start, uuid?}]}`` for node `name`
    become its cards' existing instances (StateError, nothing changed, when they do not fit)."""
    slices = attach_mig_slices(state)
    i = state.index[name]
    parsed = {int(minor): [MIGInstance.model_validate(x) for x in found] for minor, found in instances.items()}
    slices.set_instances(i, parsed)
    state.mark_changed(i)


def attach_mig_slices(state: ClusterState) -> MIGSlices:
    """The state's MIGSlices, attached (and rebuilt from its bindings) on first use."""
    existing = state.extras.get(MIGSlices.name)
    if isinstance(existing, MIGSlices):
        return existing
    return state.attach(MIGSlices())


def node_mig_cards(node: Node) -> tuple[MIGCard, ...]:
    """A node manifest's MIG cards with nothing held (for tests and tools)."""
    slices = MIGSlices()
    slices.resize(1)
    slices.set_node(0, node)
    return slices.cards[0]
