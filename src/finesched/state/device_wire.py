"""The S0.2 wire form of device state: per node, type and dimension, one integer K per free vector.

An agent reports each device dimension's free amounts as ``(k, count, bits)`` (seed S0.2:
``K = Σ free_i << ((i-1)·bits)``, devices in minor order); the scheduler decodes many nodes at
once with `decode_many`. What an agent reports below the scheduler's own free is use outside
finesched and becomes "foreign". Updates are all or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from finesched.codec import CodecError, EncodedVector, bits_for, decode_many
from finesched.model.node import Node
from finesched.state.device_types import DeviceTypeAccounts, Int64Array

if TYPE_CHECKING:
    from finesched.state.cluster import ClusterState
    from finesched.state.devices import DeviceAccounts


class EncodedUpdateError(ValueError):
    """An encoded device update that cannot be applied; `reasons` lists every problem (nothing changed)."""

    def __init__(self, reasons: Sequence[str]):
        self.reasons = list(reasons)
        super().__init__("; ".join(self.reasons))


EncodedInput = EncodedVector | tuple[int, int, int]


def _apply_encoded(accounts: DeviceAccounts, updates: Mapping[int, Mapping[str, Mapping[str, EncodedInput]]]) -> None:
    """Apply agents' encoded free vectors ``{node index: {type: {dim: (k, count, bits)}}}``.

    Private: it changes free amounts without telling the ClusterState, so the scheduler's per-shape
    memo would keep stale verdicts. Callers go through `apply_encoded_updates`, which marks the nodes.

    Groups of equal (type, dim, count, bits) are decoded together with `decode_many`. What the
    agent reports below the scheduler's own free is use outside finesched: it becomes foreign.
    All-or-nothing: a mismatched count or bits, a value above what bindings leave, an unknown
    node, type or dimension raises `EncodedUpdateError` listing every problem, changing nothing.
    """
    problems: list[str] = []
    groups = _group_updates(accounts, updates, problems)
    decoded = _decode_groups(accounts, groups, problems)
    if problems:
        raise EncodedUpdateError(problems)
    for acc, k, i, row in decoded:
        d = len(row)
        acc.free[k, i, :d] = row
        acc.foreign[k, i, :d] = acc.total[k, i, :d] - row - accounts.granted(acc, k, i, d)
        acc.refresh_sums(i)
        accounts.note_changed(i)


def _group_updates(
    accounts: DeviceAccounts, updates: Mapping[int, Mapping[str, Mapping[str, EncodedInput]]], problems: list[str]
) -> dict[tuple[str, str, int, int], list[tuple[int, int]]]:
    """The updates that match the node's devices, by (type, dim, count, bits) with (node index, k) each
    (to be decoded together); what does not match is added to `problems`."""
    groups: dict[tuple[str, str, int, int], list[tuple[int, int]]] = {}
    for i, by_type in updates.items():
        where = accounts.slot_name(i)
        if where is None:
            problems.append(f"node index {i}: no such node")
            continue
        for kind, by_dim in by_type.items():
            acc = accounts.types.get(kind)
            d = 0 if acc is None else int(acc.count[i])
            for dim, raw in by_dim.items():
                what = f"{where} {kind} {dim}"
                if acc is None or d == 0 or dim not in acc.dim_index:
                    problems.append(f"{what}: the node has no such device dimension")
                    continue
                try:
                    ev = raw if isinstance(raw, EncodedVector) else EncodedVector(*raw)
                except (CodecError, TypeError) as exc:
                    problems.append(f"{what}: {exc}")
                    continue
                want_bits = bits_for(int(acc.total[acc.dim_index[dim], i, :d].max()))
                if ev.count != d:
                    problems.append(f"{what}: count {ev.count} but the node has {d} {kind} devices")
                elif ev.bits != want_bits:
                    problems.append(f"{what}: bits {ev.bits} but the node's {dim} totals need {want_bits}")
                else:
                    groups.setdefault((kind, dim, d, ev.bits), []).append((i, ev.k))
    return groups


def _decode_groups(
    accounts: DeviceAccounts, groups: dict[tuple[str, str, int, int], list[tuple[int, int]]], problems: list[str]
) -> list[tuple[DeviceTypeAccounts, int, int, Int64Array]]:
    """Each update's free vector decoded (a group at a time, `decode_many`), with its type's accounts,
    dimension and node index; a value above what bindings leave is added to `problems`."""
    decoded: list[tuple[DeviceTypeAccounts, int, int, Int64Array]] = []
    for (kind, dim, count, bits), items in groups.items():
        acc = accounts.types[kind]
        k = acc.dim_index[dim]
        values = decode_many([kk for _, kk in items], count, bits)
        for (i, _), row in zip(items, values, strict=True):
            row = np.asarray(row, dtype=object).astype(np.int64) if values.dtype == object else row
            ceiling = acc.total[k, i, :count] - accounts.granted(acc, k, i, count)
            over = np.flatnonzero(row > ceiling)
            for slot in over.tolist():
                minor = int(acc.minor[i, slot])
                problems.append(
                    f"{accounts.slot_name(i)} {kind} {dim}: minor {minor} reports {int(row[slot])} free but "
                    f"bindings leave at most {int(ceiling[slot])}"
                )
            decoded.append((acc, k, i, row))
    return decoded


def encode_node_devices(node: Node) -> dict[str, dict[str, EncodedVector]]:
    """A node manifest's encoded free vectors per type and dimension (what its agent would send)."""
    from finesched.state.devices import DeviceAccounts

    accounts = DeviceAccounts()
    accounts.resize(1)
    accounts.set_node(0, node)
    return accounts.export_encoded(0)


def apply_encoded_updates(state: ClusterState, updates: Mapping[str, Mapping[str, Mapping[str, EncodedInput]]]) -> None:
    """Apply agents' encoded free vectors ``{node name: {type: {dim: (k, count, bits)}}}`` (all or nothing).

    The only public way to apply them: it also tells the state which nodes changed, so per-shape
    memos (sched/memo.py) and retry logic see the new free amounts. Unknown names, mismatched
    count or bits and out-of-range values raise `EncodedUpdateError` and change nothing.
    """
    from finesched.state.devices import attach_device_accounts

    accounts = attach_device_accounts(state)
    unknown = [name for name in updates if name not in state.index]
    if unknown:
        raise EncodedUpdateError([f"no node named {name!r}" for name in unknown])
    _apply_encoded(accounts, {state.index[name]: by_type for name, by_type in updates.items()})
    for name in updates:
        state.mark_changed(state.index[name])


def export_node_state(state: ClusterState, name: str) -> dict[str, dict[str, EncodedVector]]:
    """Node `name`'s free amount per device, per type and dimension, as (k, count, bits): the
    by-name counterpart of `apply_encoded_updates` (raises KeyError naming an unknown node)."""
    from finesched.state.devices import attach_device_accounts

    if name not in state.index:
        raise KeyError(f"no node named {name!r}")
    return attach_device_accounts(state).export_encoded(state.index[name])
