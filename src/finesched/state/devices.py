"""DeviceAccounts: every device's total and free amount per dimension, as numpy arrays over nodes.

Seeds S0.1-S0.3 (2-D resource classes, checked per device), S1.4-S1.6 (device inventory and
accounts, rebuilt from bindings) and S0.2 (the encoded wire form). One `DeviceTypeAccounts` per
device type found in the node manifests, so a new type needs no code (S1.4). For a type with
dimensions ``dims`` (gpu: gpu-core %, gpu-memory bytes, gpu-memory-ratio %; rdma: rdma %) it
holds, over node slots i and device slots d (devices of a node sorted by minor, packed from 0):

* ``total[k, i, d]``, ``free[k, i, d]``, ``foreign[k, i, d]`` (int64): dimension k's amount;
  ``total - free == foreign + sum of the grants of bindings on that device`` (the invariant);
  foreign = use outside finesched (manifest ``foreignAllocations``, agents' encoded reports);
* ``valid[i, d]`` (the slot holds a device), ``healthy[i, d]`` (valid and healthy);
* ``minor``, ``numa``, ``pcie`` (int64, -1 when unknown; pcie ids interned to ints);
* ``links[i]``: a ``[d, d]`` int64 matrix of link classes (bandwidth in bytes/s, 1 for a link
  without bandwidth, 0 for none) or None;
* ``htotal[k, i]``, ``hfree[k, i]``, ``used_share[k, i]``: per-node sums over healthy devices
  (node shares for S0.4 scoring, DRF totals).

`node_devices(i, type)` gives one node's devices (numa, pcie, health, free and total per
dimension, links) to the exact allocator and to NUMA hint providers.

Health: unhealthy devices never take a *new* grant (`assume` refuses them). A binding that already
held the device keeps it across a manifest update (its grants are re-applied by
`ClusterState.update_node`) and across a rebuild through `attach_device_accounts`, so an agent
reporting a failed GPU never makes the state unbuildable.

Speed: the vectorized filter asks `fit_counts` how many devices of each node fit one instance of
a request, and scoring asks `share_after`. Answers are cached per key (`cached`) and brought up
to date from a log of changed nodes, so a full evaluation costs O(N) plus O(changed nodes · D),
not O(N · D) (DESIGN.md "Performance model").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.codec import EncodedVector, bits_for, encode
from finesched.model.base import fast_copy
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.device_allocated import AnnotationError, parse_device_allocated
from finesched.model.node import DEVICE_STRATEGIES, STRATEGY_LABEL, Device, Node, foreign_amounts
from finesched.model.resources import GPU, GPU_MEMORY, GPU_MEMORY_RATIO, ResourceVector
from finesched.state.cluster import ClusterState, StateError
from finesched.state.device_types import (
    DEVICE_ALLOCATED,
    NO_SCOPE,
    DeviceTypeAccounts,
    NodeDevices,
    device_dimension,
    device_totals,
    fill_gpu_amounts,
    resized,
)

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: evaluate(free [K, rows, D], total [K, rows, D], healthy [rows, D]) -> [rows, D] "one instance fits here".
FitEvaluator = Callable[[Int64Array, Int64Array, BoolArray], BoolArray]

#: Card-level strategies; STRATEGY_LABEL (model/node.py, checked there) names one per node.
STRATEGIES = DEVICE_STRATEGIES
_CACHE_SIZE = 96
_LOG_MIN = 4096


class _CacheEntry:
    __slots__ = ("arrays", "epoch", "pos")

    def __init__(self, epoch: int, pos: int, arrays: tuple[np.ndarray, ...]):
        self.epoch, self.pos, self.arrays = epoch, pos, arrays


#: compute(rows) -> per-node arrays for `rows` (a slice or an index array), first axis over rows.
RowCompute = Callable[[Any], tuple[np.ndarray, ...]]


class DeviceAccounts:
    """The `NodeExtra` named "devices": per-type device arrays kept in step with ClusterState."""

    name = "devices"
    #: A binding without devices or a device-allocated annotation holds nothing here: ClusterState
    #: skips this extra for plain scalar bindings (state/cluster.py, QUIET_FOR_PLAIN_SCALAR).
    quiet_for_plain_scalar = True

    def __init__(self) -> None:
        self.types: dict[str, DeviceTypeAccounts] = {}
        self.capacity = 0
        #: While True (set by `attach_device_accounts`), grants on unhealthy devices are tolerated.
        self.rebuilding = False
        self._names: list[str | None] = []
        self._held: list[dict[str, Binding]] = []
        self._replay: list[set[str]] = []
        self._tolerated: list[set[str]] = []
        self._strategy = np.zeros(0, dtype=np.int8)
        self._pcie_codes: dict[str, int] = {}
        self._log: list[int] = []
        self._log_base = 0
        self._epoch = 0
        self._cache: OrderedDict[Hashable, _CacheEntry] = OrderedDict()

    # NodeExtra ----------------------------------------------------------------------------------
    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        for acc in self.types.values():
            acc.reshape(len(acc.dims), capacity, acc.dmax)
        self._names = (self._names + [None] * capacity)[:capacity]
        for lst, make in ((self._held, dict), (self._replay, set), (self._tolerated, set)):
            del lst[capacity:]
            lst.extend(make() for _ in range(capacity - len(lst)))
        self._strategy = resized(self._strategy, (capacity,), 0)
        self._structural_change()

    def set_node(self, index: int, node: Node) -> None:
        i = index
        if node.foreign_allocations:  # validated manifests pass; a node built unchecked must not be capped
            problems = node.foreign_problems()
            if problems:
                shown = "; ".join(f"{'.'.join(map(str, loc))}: {value} {rule}" for loc, rule, value in problems)
                raise StateError(f"node {node.name}: {shown}")
        self._names[i] = node.name
        self._replay[i] |= set(self._held[i])  # re-applied by update_node right after
        self._held[i] = {}
        self._tolerated[i] = set()
        label = node.labels.get(STRATEGY_LABEL)  # node validation rejects unknown values
        strategy = node.policies.device_allocate_strategy or (label if label in STRATEGIES else None)
        self._strategy[i] = STRATEGIES.index(strategy) + 1 if strategy else 0
        for acc in self.types.values():
            acc.clear(i)
        by_type: dict[str, list[Device]] = {}
        for device in node.devices:
            if device.mig is None:  # a MIG card is never shared in software: state/mig_slices.py owns it
                by_type.setdefault(device.type, []).append(device)
        for kind, devices in by_type.items():
            self._write_type(i, node, kind, sorted(devices, key=lambda d: d.minor))
        for acc in self.types.values():
            acc.refresh_sums(i)
        self.note_changed(i)

    def _write_type(self, i: int, node: Node, kind: str, devices: list[Device]) -> None:
        acc = self.types.get(kind)
        if acc is None:
            acc = self.types[kind] = DeviceTypeAccounts(kind, self.capacity)
            self._structural_change()
        totals = [device_totals(d) for d in devices]
        if acc.add_dims([name for t in totals for name in t]):
            self._structural_change()
        if len(devices) > acc.dmax:
            acc.reshape(len(acc.dims), self.capacity, len(devices))
            self._structural_change()
        slot_of_minor = {}
        for slot, (device, amounts) in enumerate(zip(devices, totals, strict=True)):
            slot_of_minor[device.minor] = slot
            for name, amount in amounts.items():
                acc.total[acc.dim_index[name], i, slot] = amount
            acc.valid[i, slot] = True
            acc.healthy[i, slot] = device.health
            acc.minor[i, slot] = device.minor
            acc.numa[i, slot] = NO_SCOPE if device.numa is None else device.numa
            acc.pcie[i, slot] = (
                NO_SCOPE if device.pcie is None else self._pcie_codes.setdefault(device.pcie, len(self._pcie_codes))
            )
        acc.count[i] = len(devices)
        for alloc in node.foreign_allocations:
            if alloc.type != kind:
                continue
            slot = slot_of_minor[alloc.minor]
            # set_node checked them (Node.foreign_problems): every dimension exists and the sums fit
            for name, amount in foreign_amounts(kind, alloc.resources, totals[slot]).items():
                acc.foreign[acc.dim_index[name], i, slot] += amount
        acc.free[:, i] = acc.total[:, i] - acc.foreign[:, i]
        acc.links[i] = self._link_matrix(node, kind, slot_of_minor)

    @staticmethod
    def _link_matrix(node: Node, kind: str, slot_of_minor: dict[int, int]) -> Int64Array | None:
        # links of MIG cards (not in these arrays) do not count: a MIG instance never spans cards
        links = [ln for ln in node.links if ln.type == kind and ln.a in slot_of_minor and ln.b in slot_of_minor]
        if not links:
            return None
        matrix = np.zeros((len(slot_of_minor), len(slot_of_minor)), dtype=np.int64)
        for link in links:
            a, b = slot_of_minor[link.a], slot_of_minor[link.b]
            value = max(int(matrix[a, b]), link.bandwidth or 1)
            matrix[a, b] = matrix[b, a] = value
        return matrix

    def move(self, src: int, dst: int) -> None:
        for acc in self.types.values():
            acc.move(src, dst)
        self._names[dst] = self._names[src]
        self._held[dst], self._replay[dst], self._tolerated[dst] = (
            self._held[src],
            self._replay[src],
            self._tolerated[src],
        )
        self._strategy[dst] = self._strategy[src]
        self.note_changed(src)
        self.note_changed(dst)

    def clear(self, index: int) -> None:
        for acc in self.types.values():
            acc.clear(index)
        self._names[index] = None
        self._held[index], self._replay[index], self._tolerated[index] = {}, set(), set()
        self._strategy[index] = 0
        self.note_changed(index)

    def assume(self, index: int, binding: Binding) -> None:
        """Take the binding's device grants; raise StateError and change nothing if one does not fit."""
        i, key = index, binding.workload
        devices = binding.devices
        if not devices:
            text = binding.annotations.get(DEVICE_ALLOCATED)
            if text is None:
                return
            devices = self._annotated_devices(i, key, text)
        if GPU in devices and any(g.mig is not None for g in devices[GPU]):  # MIG: state/mig_slices.py
            devices = {k: kept for k, gs in devices.items() if (kept := [g for g in gs if g.mig is None])}
            if not devices:
                return
        where = f"{self._names[i]}"
        replay = key in self._replay[i] or self.rebuilding
        plan: list[tuple[DeviceTypeAccounts, int, int, int]] = []
        on_unhealthy = renamed = False
        for kind, grants in devices.items():
            acc = self.types.get(kind)
            seen: set[int] = set()
            for grant in grants:
                slot = None if acc is None else acc.slot_of(i, grant.minor)
                if acc is None or slot is None:
                    raise StateError(f"binding {key}: {where} has no {kind} with minor {grant.minor}")
                if slot in seen:
                    raise StateError(f"binding {key}: {kind} {grant.minor} granted twice")
                seen.add(slot)
                if not acc.healthy[i, slot]:
                    if not replay:
                        raise StateError(f"binding {key}: {kind} {grant.minor} on {where} is unhealthy")
                    on_unhealthy = True
                for name, amount in grant.resources.items():
                    k = acc.dim_index.get(name)
                    if k is None and (k := acc.dim_index.get(device_dimension(name))) is not None:
                        renamed = True  # "koordinator.sh/xpu" on an xpu device: held under "xpu"
                    if k is None or amount < 0:
                        raise StateError(f"binding {key}: {kind} {grant.minor} has no {name} dimension")
                    have = int(acc.free[k, i, slot])
                    if amount > have:
                        raise StateError(
                            f"binding {key} does not fit on {where}: {kind} {grant.minor} {name} "
                            f"(asks {amount}, {have} free)"
                        )
                    plan.append((acc, k, slot, amount))
        for acc, k, slot, amount in plan:
            acc.take(i, k, slot, amount)
        if renamed:
            devices = {kind: [_bare_grant(g) for g in grants] for kind, grants in devices.items()}
        # forget, granted and violations read the held copy: it names what was actually taken
        self._held[i][key] = binding if devices is binding.devices else fast_copy(binding, {"devices": devices})
        self._replay[i].discard(key)
        if on_unhealthy:
            self._tolerated[i].add(key)
        self.note_changed(i)

    def _annotated_devices(self, i: int, key: str, text: str) -> dict[str, list[DeviceGrant]]:
        """A binding's grants read from Koordinator's device-allocated annotation (the source of
        truth when ``devices`` is empty, as for a pod Koordinator placed), GPU memory filled per card."""
        try:
            devices = parse_device_allocated(text)
        except AnnotationError as exc:
            raise StateError(f"binding {key}: {exc}") from None
        acc = self.types.get(GPU)
        mem = None if acc is None else acc.dim_index.get(GPU_MEMORY)
        if acc is None or mem is None:
            return devices
        filled = []
        for grant in devices.get(GPU, ()):
            slot = acc.slot_of(i, grant.minor)
            total = 0 if slot is None else int(acc.total[mem, i, slot])
            if total > 0 and (GPU_MEMORY in grant.resources) != (GPU_MEMORY_RATIO in grant.resources):
                resources = ResourceVector(fill_gpu_amounts(grant.resources, total))
                grant = DeviceGrant.model_construct(minor=grant.minor, resources=resources)
            filled.append(grant)
        if GPU in devices:
            devices[GPU] = filled
        return devices

    def forget(self, index: int, binding: Binding) -> None:
        """Give back exactly what `assume` took for this workload (nothing if it holds nothing here)."""
        i = index
        held = self._held[i].pop(binding.workload, None)
        self._tolerated[i].discard(binding.workload)
        if held is None:
            return
        for kind, grants in held.devices.items():
            acc = self.types[kind]
            for grant in grants:
                slot = acc.slot_of(i, grant.minor)
                assert slot is not None, (binding.workload, kind, grant.minor)
                for name, amount in grant.resources.items():
                    acc.take(i, acc.dim_index[name], slot, -amount)
        self.note_changed(i)

    def snapshot(self) -> object:
        types = {}
        for kind, acc in self.types.items():
            copy = DeviceTypeAccounts(kind, 0)
            for attr, value in vars(acc).items():
                setattr(copy, attr, value.copy() if isinstance(value, (np.ndarray, list, dict)) else value)
            types[kind] = copy
        return (
            types,
            list(self._names),
            [dict(h) for h in self._held],
            [set(r) for r in self._replay],
            [set(t) for t in self._tolerated],
            self._strategy.copy(),
            dict(self._pcie_codes),
        )

    def restore(self, snapshot: object) -> None:
        types, names, held, replay, tolerated, strategy, codes = snapshot  # type: ignore[misc]
        capacity = self.capacity
        self.types = {}
        for kind, saved in types.items():
            acc = DeviceTypeAccounts(kind, 0)
            for attr, value in vars(saved).items():
                setattr(acc, attr, value.copy() if isinstance(value, (np.ndarray, list, dict)) else value)
            self.types[kind] = acc
        self._names, self._held = list(names), [dict(h) for h in held]
        self._replay, self._tolerated = [set(r) for r in replay], [set(t) for t in tolerated]
        self._strategy, self._pcie_codes = strategy.copy(), dict(codes)
        self.resize(capacity)

    # Queries -------------------------------------------------------------------------------------
    def node_devices(self, index: int, kind: str, copy: bool = True) -> NodeDevices | None:
        """Node `index`'s devices of type `kind` (None when the node has none).

        `copy=False` gives views of the live arrays: read them before the state changes.
        """
        acc = self.types.get(kind)
        if acc is None or acc.count[index] == 0:
            return None
        return acc.node_devices(index, copy)

    def device_state_key(self, index: int, kind: str) -> tuple[bytes, bytes] | None:
        """What node `index`'s devices of `kind` are and have free, as bytes (None: it has none).

        Equal keys mean equal `node_devices` (within one `epoch`): a memo key for per-node
        results that read nothing else.
        """
        acc = self.types.get(kind)
        if acc is None:
            return None
        d = int(acc.count[index])
        return None if d == 0 else (acc.shape_key(index), acc.free[:, index, :d].tobytes())

    def all_node_devices(self, index: int) -> dict[str, NodeDevices]:
        """Every device type on node `index`: what a NUMA hint provider reads (numa, health, free)."""
        return {k: acc.node_devices(index) for k, acc in self.types.items() if acc.count[index] > 0}

    def strategy_of(self, index: int) -> str | None:
        """The node's card-level strategy (policies.deviceAllocateStrategy, else its label), or None."""
        code = int(self._strategy[index])
        return STRATEGIES[code - 1] if code else None

    def held(self, index: int) -> Mapping[str, Binding]:
        """Bindings holding device grants on node `index`, by workload key."""
        return self._held[index]

    def totals(self) -> dict[str, int]:
        """Cluster total per device dimension over healthy devices (DRF capacity; S1.1 node sums)."""
        out: dict[str, int] = {}
        for acc in self.types.values():
            for k, name in enumerate(acc.dims):
                out[name] = out.get(name, 0) + int(acc.htotal[k].sum())
        return out

    def used(self) -> dict[str, int]:
        """Cluster amount held per device dimension, by bindings and foreign allocations alike."""
        out: dict[str, int] = {}
        for acc in self.types.values():
            for k, name in enumerate(acc.dims):
                out[name] = out.get(name, 0) + int((acc.total[k] - acc.free[k]).sum())
        return out

    def fit_counts(self, kind: str, key: Hashable, evaluate: FitEvaluator, n: int) -> tuple[Int64Array, BoolArray]:
        """Per node, how many devices of `kind` fit one instance of a request ([n]), and where ([n, D]).

        `key` identifies `evaluate` (a compiled fit rule); see `cached`. Read-only views.
        """
        acc = self.types[kind]

        def compute(rows: Any) -> tuple[np.ndarray, ...]:
            fits = evaluate(*node_rows(acc, rows))
            return fits.sum(axis=1), fits

        counts, where = self.cached(("fit", kind, key), compute, n)
        return counts, where

    def share_after(self, kind: str, dim: str, amount: int, n: int) -> npt.NDArray[np.float64]:
        """[n] share of `dim` used on each node after `amount` more (over healthy devices; read-only).

        ``(used + amount) / total``, 0 where the node has none of `dim`; cached like `fit_counts`.
        """
        acc = self.types[kind]
        k = acc.dim_index[dim]

        def compute(rows: Any) -> tuple[np.ndarray, ...]:
            if isinstance(rows, slice):
                return (acc.used_share[k, rows] + acc.inv_htotal[k, rows] * float(amount),)
            return (acc.used_share[k][rows] + acc.inv_htotal[k][rows] * float(amount),)

        return self.cached(("share", kind, dim, amount), compute, n)[0]

    def cached(self, key: Hashable, compute: RowCompute, n: int) -> tuple[np.ndarray, ...]:
        """Per-node arrays that depend only on each node's own device state, kept up to date.

        The first call computes all n rows; later calls recompute only the nodes changed since
        (from the change log), or everything after a layout change or when many changed. Keep
        `key` stable for the same `compute`. The least recently used of 96 entries is dropped.
        The returned arrays are read-only views.
        """
        end = self._log_base + len(self._log)
        entry = self._cache.get(key)
        dirty: Sequence[int] = ()
        if entry is not None and entry.epoch == self._epoch and entry.pos >= self._log_base:
            dirty = self._log[entry.pos - self._log_base :]
        else:
            entry = None
        if entry is None or len(dirty) > max(64, n // 8):
            parts = compute(slice(0, n))
            arrays = tuple(np.zeros((self.capacity, *p.shape[1:]), dtype=p.dtype) for p in parts)
            for array, part in zip(arrays, parts, strict=True):
                array[:n] = part
            entry = self._cache[key] = _CacheEntry(self._epoch, end, arrays)
        elif dirty:
            rows = np.fromiter(set(dirty), dtype=np.intp)
            for array, part in zip(entry.arrays, compute(rows), strict=True):
                array[rows] = part
            entry.pos = end
        self._cache.move_to_end(key)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        out = []
        for array in entry.arrays:
            view = array[:n]
            view.flags.writeable = False  # consumers share the cached array: no in-place changes
            out.append(view)
        return tuple(out)

    def note_changed(self, i: int) -> None:
        """Log that node i's device state changed (caches refresh it); trim a long log."""
        self._log.append(i)
        if len(self._log) > max(_LOG_MIN, 2 * self.capacity):
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop

    @property
    def epoch(self) -> int:
        """Changes whenever the layout (types, dimensions, device slots, capacity) changes."""
        return self._epoch

    def _structural_change(self) -> None:
        self._epoch += 1
        self._cache.clear()

    # Encoded device state (S0.2): reading it back lives in state/device_wire.py, beside these
    # accounts (it imports them, they never import it); applying an update goes through
    # `device_wire.apply_encoded_updates` (it marks the nodes changed in the state) ----------------
    def export_encoded(self, index: int) -> dict[str, dict[str, EncodedVector]]:
        """Node `index`'s free amount per device, per type and dimension, as (k, count, bits).

        Devices are in minor order (device 1 = lowest minor); bits hold the largest *total* of the
        dimension on this node, so every free value the agent may report fits.
        """
        out: dict[str, dict[str, EncodedVector]] = {}
        for kind, acc in self.types.items():
            d = int(acc.count[index])
            if d == 0:
                continue
            out[kind] = {}
            for k, name in enumerate(acc.dims):
                bits = bits_for(int(acc.total[k, index, :d].max()))
                values = [int(v) for v in acc.free[k, index, :d]]
                out[kind][name] = EncodedVector(encode(values, bits), d, bits)
        return out

    def slot_name(self, index: int) -> str | None:
        """The name of the node in slot `index` (None for an empty or out-of-range slot)."""
        return self._names[index] if 0 <= index < self.capacity else None

    def granted(self, acc: DeviceTypeAccounts, k: int, i: int, d: int) -> Int64Array:
        """[d] amount of dimension k held by bindings on node i's devices of this type."""
        out = np.zeros(d, dtype=np.int64)
        name = acc.dims[k]
        for binding in self._held[i].values():
            for grant in binding.devices.get(acc.name, ()):
                amount = grant.resources.get(name)
                slot = acc.slot_of(i, grant.minor)
                if amount and slot is not None:
                    out[slot] += amount
        return out

    # Invariants ----------------------------------------------------------------------------------
    def violations(self) -> list[str]:
        """No device above 100% (0 <= free <= total), held == foreign + grants, no new grant on an
        unhealthy device, node sums in step with the arrays."""
        out: list[str] = []
        present = [i for i, name in enumerate(self._names) if name is not None]
        for kind, acc in self.types.items():
            expected = acc.foreign.copy()
            for i in present:
                for key, binding in self._held[i].items():
                    for grant in binding.devices.get(kind, ()):
                        slot = acc.slot_of(i, grant.minor)
                        if slot is None:
                            out.append(f"{self._names[i]}: {key} holds missing {kind} {grant.minor}")
                            continue
                        if not acc.healthy[i, slot] and key not in self._tolerated[i]:
                            out.append(f"{self._names[i]}: {key} got a new grant on unhealthy {kind} {grant.minor}")
                        for name, amount in grant.resources.items():
                            expected[acc.dim_index[name], i, slot] += amount
            for k, i, slot in zip(*np.nonzero(acc.free < 0), strict=True):
                out.append(f"{self._names[i]}: {kind} slot {slot} {acc.dims[k]} free {acc.free[k, i, slot]} < 0")
            for k, i, slot in zip(*np.nonzero(acc.free > acc.total), strict=True):
                out.append(f"{self._names[i]}: {kind} slot {slot} {acc.dims[k]} free above total")
            for k, i, slot in zip(*np.nonzero(acc.total - acc.free != expected), strict=True):
                held = int(acc.total[k, i, slot] - acc.free[k, i, slot])
                out.append(
                    f"{self._names[i]}: {kind} {int(acc.minor[i, slot])} {acc.dims[k]} held {held} "
                    f"!= foreign + grants {int(expected[k, i, slot])}"
                )
            h = acc.healthy
            if not np.array_equal(acc.htotal, (acc.total * h).sum(axis=2)) or not np.array_equal(
                acc.hfree, (acc.free * h).sum(axis=2)
            ):
                out.append(f"{kind}: per-node sums out of step with the device arrays")
        return out


def _bare_grant(grant: DeviceGrant) -> DeviceGrant:
    resources = ResourceVector({device_dimension(name): amount for name, amount in grant.resources.items()})
    return DeviceGrant.model_construct(minor=grant.minor, resources=resources)


def node_rows(acc: DeviceTypeAccounts, rows: slice | npt.NDArray[np.intp]) -> tuple[Int64Array, Int64Array, BoolArray]:
    """(free [K, rows, D], total [K, rows, D], healthy [rows, D]) of one type for node rows `rows`.

    A slice gives views; an index array gathers with `take`, numpy's fast path (fancy indexing
    on a middle axis, ``free[:, rows]``, takes the general path: several times slower on the few
    dozen changed nodes a memo refresh looks at).
    """
    if isinstance(rows, slice):
        return acc.free[:, rows], acc.total[:, rows], acc.healthy[rows]
    return acc.free.take(rows, axis=1), acc.total.take(rows, axis=1), acc.healthy.take(rows, axis=0)


def attach_device_accounts(state: ClusterState) -> DeviceAccounts:
    """The state's DeviceAccounts, attached (and rebuilt from its bindings) on first use.

    During the rebuild, grants on devices that have since become unhealthy are kept: they exist.
    """
    existing = state.extras.get(DeviceAccounts.name)
    if isinstance(existing, DeviceAccounts):
        return existing
    return state.attach(DeviceAccounts())


def device_accounts(state: ClusterState) -> DeviceAccounts | None:
    """The device accounts the scheduler's plugins keep on the state, or None (a profile without
    devices). Never attached from here: reading the state must not change it."""
    accounts = state.extras.get(DeviceAccounts.name)
    return accounts if isinstance(accounts, DeviceAccounts) else None


def device_types(state: ClusterState) -> dict[str, DeviceTypeAccounts]:
    """The state's per-type device accounts ({} without device accounts), read as `device_accounts`."""
    accounts = device_accounts(state)
    return accounts.types if accounts is not None else {}


def node_devices_from_manifest(node: Node) -> dict[str, NodeDevices]:
    """A node manifest's devices per type (foreign allocations counted as used), for tests and tools."""
    accounts = DeviceAccounts()
    accounts.resize(1)
    accounts.set_node(0, node)
    return accounts.all_node_devices(0)
