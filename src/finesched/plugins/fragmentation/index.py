"""Per-GPU view of the cluster, the fragmentation math as pure array functions, and the per-shape index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.device_allocated import binding_devices
from finesched.model.node import Node
from finesched.model.resources import CPU, GPU, GPU_CORE
from finesched.plugins.fragmentation.target import GPU_MODEL_LABEL, MAX_CLASSES, MILLI, Shape, TargetWorkload
from finesched.sched.framework import ScoreArray
from finesched.state.cluster import ClusterState

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


class GpuView:
    """A read-only mirror of free GPU milli per node and GPU minor, kept from nodes and bindings.

    A ClusterState extra (and observer): `version[i]` changes whenever node i changes, which is
    how fragmentation caches find the few nodes to recompute. It reads the bindings' ``gpu``
    device grants (gpu-core percent x 10 = milli); it never refuses a binding (the device plugin
    owns that decision).
    """

    name = "Fragmentation/gpu-view"

    def __init__(self) -> None:
        #: [cap, G] free milli per node and GPU minor (0 for minors the node lacks).
        self.free: IntArray = np.zeros((0, 1), dtype=np.int64)
        #: [cap] number of GPUs per node.
        self.count: IntArray = np.zeros(0, dtype=np.int64)
        #: [cap, MAX_CLASSES] tasks hosted per class (0: share-GPU, k: k whole GPUs).
        self.classes: IntArray = np.zeros((0, MAX_CLASSES), dtype=np.int64)
        self.version: IntArray = np.zeros(0, dtype=np.int64)
        #: FragmentationIndex instances sharing this view, by (target key, gpu choice).
        self.indexes: dict[tuple[Any, ...], Any] = {}
        self._clock = 0

    @property
    def width(self) -> int:
        return int(self.free.shape[1])

    @property
    def clock(self) -> int:
        """Changes whenever any node's `version` does: a reader that saw this clock has nothing to refresh."""
        return self._clock

    def resize(self, capacity: int) -> None:
        keep = min(capacity, self.free.shape[0])

        def grown(a: IntArray) -> IntArray:
            out = np.zeros((capacity, *a.shape[1:]), dtype=np.int64)
            out[:keep] = a[:keep]
            return out

        self.free, self.count, self.classes = grown(self.free), grown(self.count), grown(self.classes)
        self.version = grown(self.version)

    def set_node(self, index: int, node: Node) -> None:
        gpus = [d for d in node.devices_of(GPU) if d.mig is None]  # MIG cards are not shared in software
        width = max((d.minor + 1 for d in gpus), default=1)
        if width > self.width:
            grown = np.zeros((self.free.shape[0], width), dtype=np.int64)
            grown[:, : self.width] = self.free
            self.free = grown
        self.free[index] = 0
        self.count[index] = len(gpus)
        self.classes[index] = 0
        for d in gpus:
            self.free[index, d.minor] = d.resources.get(GPU_CORE, 100) * MILLI // 100 if d.health else 0
        for alloc in node.foreign_allocations:
            if alloc.type == GPU:
                self.free[index, alloc.minor] -= alloc.resources.get(GPU_CORE, 0) * MILLI // 100
        self.refresh(index)

    def move(self, src: int, dst: int) -> None:
        self.free[dst], self.count[dst], self.classes[dst] = self.free[src], self.count[src], self.classes[src]
        self.refresh(dst)

    def clear(self, index: int) -> None:
        self.free[index], self.count[index], self.classes[index] = 0, 0, 0
        self.refresh(index)

    def assume(self, index: int, binding: Binding) -> None:
        self._apply(index, binding, -1)

    def forget(self, index: int, binding: Binding) -> None:
        self._apply(index, binding, +1)

    def _apply(self, index: int, binding: Binding, sign: int) -> None:
        # the annotation's grants when `devices` is empty; MIG instances are not on shared GPUs
        grants = [g for g in binding_devices(binding).get(GPU, ()) if g.mig is None]
        if not grants:
            return
        core = 0
        for grant in grants:
            amount = grant.resources.get(GPU_CORE, 0)
            core = max(core, amount)
            self.free[index, grant.minor] += sign * amount * MILLI // 100
        cls = 0 if len(grants) == 1 and core < 100 else min(len(grants), MAX_CLASSES - 1)
        self.classes[index, cls] -= sign

    def refresh(self, index: int) -> None:
        self._clock += 1
        self.version[index] = self._clock

    def snapshot(self) -> object:
        return (self.free.copy(), self.count.copy(), self.classes.copy())

    def restore(self, snapshot: object) -> None:
        free, count, classes = snapshot  # type: ignore[misc]
        rows = max(self.free.shape[0], free.shape[0])
        self.free = np.zeros((rows, free.shape[1]), dtype=np.int64)
        self.count = np.zeros(rows, dtype=np.int64)
        self.classes = np.zeros((rows, MAX_CLASSES), dtype=np.int64)
        self.free[: len(free)], self.count[: len(count)], self.classes[: len(classes)] = free, count, classes
        self.version = np.zeros(rows, dtype=np.int64)
        self._clock += 1
        self.version[:] = self._clock

    def violations(self) -> list[str]:
        bad = np.argwhere(self.free < 0)
        return [f"node {i} gpu {g}: free {self.free[i, g]} milli < 0" for i, g in bad[:10].tolist()]


# The math, as pure array functions ----------------------------------------------------------------------------
def accessible(node_models: Sequence[str], target: TargetWorkload) -> BoolArray:
    """[K, M] True where node k's GPU model is allowed by spec m (a spec without models allows any)."""
    out = np.ones((len(node_models), len(target)), dtype=bool)
    models = np.asarray(node_models, dtype=object)
    for m, allowed in enumerate(target.models):
        if allowed:
            out[:, m] = np.isin(models, allowed)
    return out


def fragment_terms(cpu_free: IntArray, gpu_free: IntArray, acc: BoolArray, target: TargetWorkload) -> IntArray:
    """[K, M] f_k(m) in milli for nodes with `cpu_free` [K] and per-GPU `gpu_free` [K, G]."""
    d = target.gpu_milli[None, None, :]
    r = gpu_free[:, :, None]
    ge = r >= d
    count = ge.sum(axis=1)
    small = np.where(ge, 0, r).sum(axis=1)
    total = gpu_free.sum(axis=1)[:, None]
    fits = acc & (cpu_free[:, None] >= target.cpu[None, :]) & (count >= target.gpu_count[None, :])
    fits &= target.gpu_milli[None, :] > 0
    return np.where(fits, small, total)


def node_fragmentation(cpu_free: IntArray, gpu_free: IntArray, acc: BoolArray, target: TargetWorkload) -> FloatArray:
    """[K] F_k(M) in milli (see the module docstring for a worked example)."""
    return (fragment_terms(cpu_free, gpu_free, acc, target) @ target.counts) / max(target.total, 1)


def fgd_score(delta_milli: FloatArray) -> ScoreArray:
    """⌊100·σ(−Δ/1000)⌋ as int64: Δ = 0 -> 50, Δ = −1000 -> 73, Δ = +1000 -> 26."""
    return np.floor(100.0 / (1.0 + np.exp(np.clip(np.asarray(delta_milli) / MILLI, -700.0, 700.0)))).astype(np.int64)


def fgd_scores(delta_milli: FloatArray) -> ScoreArray:
    """`fgd_score` of a 1-D or wider array, the same floats step by step (clip is max then min) in
    one buffer and without numpy's Python wrappers: the index scores a few nodes at a time."""
    x = np.true_divide(delta_milli, MILLI)
    np.maximum(x, -700.0, out=x)
    np.minimum(x, 700.0, out=x)
    np.exp(x, out=x)
    np.add(x, 1.0, out=x)
    np.true_divide(100.0, x, out=x)
    np.floor(x, out=x)
    return x.astype(np.int64)


def _share_deltas(
    cpu_free: IntArray,
    gpu_free: IntArray,
    acc: BoolArray,
    target: TargetWorkload,
    shape: Shape,
    base: IntArray | None = None,
) -> IntArray:
    """[K, G] (F' − F)·W for placing a share task on each GPU (int64 min where the GPU lacks room).

    Only GPU g changes, so each variant's counts and small-GPU sums are the node's minus g's old
    contribution plus its new one: [K, G, M] work, no [K, G, G, M]. `base` is F·W if known.
    """
    cpu, _, d_task = shape
    d = target.gpu_milli[None, None, :]
    r = gpu_free[:, :, None]
    ge = r >= d
    count = ge.sum(axis=1)
    small = np.where(ge, 0, r).sum(axis=1)
    total = gpu_free.sum(axis=1)
    after = r - d_task
    ge_after = after >= d
    count_g = count[:, None, :] - ge + ge_after
    small_g = small[:, None, :] - np.where(ge, 0, r) + np.where(ge_after, 0, after)
    cpu_ok = (cpu_free - cpu)[:, None] >= target.cpu[None, :]
    fits = (acc & cpu_ok & (target.gpu_milli[None, :] > 0))[:, None, :] & (count_g >= target.gpu_count)
    terms = np.where(fits, small_g, (total - d_task)[:, None, None])
    if base is None:
        base = fragment_terms(cpu_free, gpu_free, acc, target) @ target.counts
    delta = terms @ target.counts - base[:, None]
    return np.where(gpu_free >= d_task, delta, np.iinfo(np.int64).min)


def _after_placement(cpu_free: IntArray, gpu_free: IntArray, shape: Shape) -> tuple[IntArray, IntArray, BoolArray]:
    """Nodes after placing a CPU-only or whole-GPU task (first fully free GPUs), and where it fits.
    A CPU-only task leaves the GPUs as they are: `gpu_free` itself is returned (read-only use)."""
    cpu, k, d = shape
    fits = cpu_free >= cpu
    if not k:
        return cpu_free - cpu, gpu_free, fits
    after = gpu_free.copy()
    full = gpu_free >= d
    rank = np.cumsum(full, axis=1)
    after[full & (rank <= k)] -= d
    fits &= rank[:, -1] >= k
    return cpu_free - cpu, after, fits


# The index's kernels ----------------------------------------------------------------------------------------
# The functions above are the reference (and what the docstrings explain); the index calls these,
# which compute the same integers with fewer numpy passes: the index calls them once per changed
# node batch (often 1-10 nodes), where each numpy call's fixed cost is most of the time.
# `tests/sim/test_sim_fragmentation_kernels.py` checks them against the reference on random nodes.
#: ``x.sum(axis)`` without ndarray.sum's Python wrapper (a third of its cost on a few nodes).
_add = np.add.reduce


@dataclass(frozen=True)
class _Specs:
    """The target's arrays as the kernels read them (built once per target)."""

    d: IntArray  # [1, 1, M] milli per GPU
    cpu: IntArray  # [M]
    gpu_count: IntArray  # [M]
    wanted: BoolArray  # [M] the spec asks for GPU (a CPU-only spec never fits: f = R)
    counts: IntArray  # [M] weights

    @classmethod
    def of(cls, target: TargetWorkload) -> _Specs:
        return cls(target.gpu_milli[None, None, :], target.cpu, target.gpu_count, target.gpu_milli > 0, target.counts)


def _weighted_frag(cpu_free: IntArray, gpu_free: IntArray, acc: BoolArray, specs: _Specs) -> IntArray:
    """[K] F·W = `fragment_terms(...) @ counts`, counting the GPUs too small for each spec ("short")
    instead of those large enough (a node fits m when short <= G − k_m)."""
    r = gpu_free[:, :, None]
    short = r < specs.d
    small = _add(r * short, axis=1)
    fits = (cpu_free[:, None] >= specs.cpu) & acc & specs.wanted
    fits &= _add(short, axis=1) <= gpu_free.shape[1] - specs.gpu_count
    return np.where(fits, small, _add(gpu_free, axis=1)[:, None]) @ specs.counts


def _share_delta(
    cpu_free: IntArray, gpu_free: IntArray, acc: BoolArray, base: IntArray, specs: _Specs, shape: Shape
) -> tuple[IntArray, BoolArray]:
    """([K, G] (F' − F)·W for a share task on each GPU, [K, G] where the GPU has room for it):
    `_share_deltas` without its sentinel (Δ is meaningless where there is no room). Only GPU g
    changes, so its short count and small sum are the node's minus g's old part plus its new one."""
    cpu, _, d_task = shape
    r = gpu_free[:, :, None]
    short = r < specs.d
    part = r * short
    after = r - d_task
    short_after = after < specs.d
    small_g = _add(part, axis=1)[:, None, :] - part + after * short_after
    short_g = _add(short, axis=1)[:, None, :] - short + short_after
    ok = ((cpu_free - cpu)[:, None] >= specs.cpu) & acc & specs.wanted
    fits = (short_g <= gpu_free.shape[1] - specs.gpu_count) & ok[:, None, :]
    terms = np.where(fits, small_g, (_add(gpu_free, axis=1) - d_task)[:, None, None])
    return terms @ specs.counts - base[:, None], gpu_free >= d_task


@dataclass
class _ShapeCache:
    seen: IntArray
    delta: IntArray  # (F' − F)·W per node
    gpu: IntArray  # chosen GPU minor for share tasks (-1 none)
    fits: BoolArray
    clock: int = -1  # the view's clock when `seen` was brought up to date


@dataclass
class FragmentationIndex:
    """F_n(M) per node and FGD's Δ per task shape, cached and refreshed only on changed nodes."""

    state: ClusterState
    target: TargetWorkload
    #: "score": pick the share GPU by integer FGD score, lowest index among equals (the artifact);
    #: "delta": by exact Δ.
    gpu_choice: str = "score"
    view: GpuView = field(init=False)

    def __post_init__(self) -> None:
        self.view = self.state.attach(GpuView())
        self._nodes_version = -1
        self._shapes: dict[Shape, _ShapeCache] = {}
        self._clock = -1  # the view's clock at the last _sync
        #: Changes whenever every cached value is dropped (new node set or target): readers that
        #: cache what they derive from `deltas` per node version (FGDScore) drop theirs too.
        self.epoch = 0

    @classmethod
    def shared(cls, state: ClusterState, target: TargetWorkload, gpu_choice: str = "score") -> FragmentationIndex:
        """The index of `state` for `target` (equal specs) and `gpu_choice`, created once and then reused,
        so a scoring plugin and a metrics reader pay for one set of caches."""
        view = state.attach(GpuView())
        key = (target.key(), gpu_choice)
        index = view.indexes.get(key)
        if index is None:
            index = view.indexes[key] = cls(state, target, gpu_choice)
        return index

    def set_target(self, target: TargetWorkload) -> None:
        self.target = target
        self._nodes_version = -1

    # Base measure ----------------------------------------------------------------------------
    def _sync(self) -> None:
        state = self.state
        n = state.n
        if self._clock == self.view.clock and self._nodes_version == state.nodes_version and self._frag.shape[0] == n:
            return  # no node changed since the last sync
        if self._nodes_version != state.nodes_version or self._frag.shape[0] != n:
            models = [state.nodes[i].labels.get(GPU_MODEL_LABEL, "") for i in range(n)]
            self._acc = accessible(models, self.target)
            self._seen = np.full(n, -1, dtype=np.int64)
            self._frag = np.zeros(n, dtype=np.int64)
            self._idle = np.zeros(n, dtype=np.int64)
            self._frag_total = self._idle_total = 0
            self._shapes.clear()
            self._nodes_version = state.nodes_version
            self._cpu_row = state.res_index[CPU]
            self._specs = _Specs.of(self.target)
            ids: dict[str, int] = {}
            self._model_id = np.asarray([ids.setdefault(m, len(ids)) for m in models], dtype=np.int64)
            self.epoch += 1
        version = self.view.version[:n]
        stale = np.flatnonzero(version != self._seen)
        if stale.size:
            gpu = self.view.free.take(stale, axis=0)
            cpu = self.state.free[self._cpu_row][stale]
            frag = _weighted_frag(cpu, gpu, self._acc.take(stale, axis=0), self._specs)
            idle = _add(gpu, axis=1)
            self._frag_total += int((frag - self._frag[stale]).sum())
            self._idle_total += int((idle - self._idle[stale]).sum())
            self._frag[stale], self._idle[stale] = frag, idle
            self._seen[stale] = version[stale]
        self._clock = self.view.clock

    def node_frag(self) -> FloatArray:
        """[n] F_n(M) in milli."""
        self._sync()
        return self._frag / max(self.target.total, 1)

    def idle(self) -> IntArray:
        """[n] R_n: idle GPU milli per node (a view; do not write)."""
        self._sync()
        return self._idle

    def totals(self) -> tuple[float, int]:
        """(Σ_n F_n(M), Σ_n R_n) in milli: the cluster's fragmented and idle GPU."""
        self._sync()
        return self._frag_total / max(self.target.total, 1), self._idle_total

    # Deltas ------------------------------------------------------------------------------------
    def deltas(self, shape: Shape) -> _ShapeCache:
        """Δ·W, chosen GPU and fit for a task of `shape` on every node (cached per shape)."""
        self._sync()
        n = self.state.n
        cache = self._shapes.get(shape)
        if cache is None:
            cache = _ShapeCache(
                np.full(n, -1, dtype=np.int64),
                np.zeros(n, dtype=np.int64),
                np.full(n, -1, dtype=np.int64),
                np.zeros(n, dtype=bool),
            )
            self._shapes[shape] = cache
        if cache.clock == self._clock:
            return cache
        version = self.view.version[:n]
        stale = np.flatnonzero(version != cache.seen)
        if stale.size:
            self._compute(shape, stale, cache)
            cache.seen[stale] = version[stale]
        cache.clock = self._clock
        return cache

    def _compute(self, shape: Shape, nodes: npt.NDArray[np.intp], cache: _ShapeCache) -> None:
        # 1-D and take() gathers: numpy's fast paths (see NodeBatch)
        cpu_free = self.state.free[self._cpu_row][nodes]
        gpu_free = self.view.free.take(nodes, axis=0)
        acc, base = self._acc.take(nodes, axis=0), self._frag[nodes]
        distinct = None
        if len(nodes) >= _DEDUP_MIN:
            distinct = _distinct_states(cpu_free, self._model_id[nodes], gpu_free)
        if distinct is None:
            delta, gpu, fits = self._evaluate(shape, cpu_free, gpu_free, acc, base)
            cache.delta[nodes], cache.gpu[nodes], cache.fits[nodes] = delta, gpu, fits
            return
        # many nodes (a shape's first use, or after a long pause), many in equal states: nodes in
        # equal states get equal results (each row's result depends on its row only)
        first, inverse = distinct
        delta, gpu, fits = self._evaluate(shape, cpu_free[first], gpu_free[first], acc[first], base[first])
        cache.delta[nodes], cache.gpu[nodes], cache.fits[nodes] = delta[inverse], gpu[inverse], fits[inverse]

    def _evaluate(
        self, shape: Shape, cpu_free: IntArray, gpu_free: IntArray, acc: BoolArray, base: IntArray
    ) -> tuple[IntArray, IntArray, BoolArray]:
        """(Δ·W, chosen GPU or -1, fits) of a task of `shape` on nodes in the given states."""
        _, k, d = shape
        if k == 1 and d < MILLI:
            per_gpu, room = _share_delta(cpu_free, gpu_free, acc, base, self._specs, shape)
            if self.gpu_choice == "delta":
                key = np.where(room, -per_gpu, np.iinfo(np.int64).min)
            else:
                key = np.where(room, fgd_scores(per_gpu / max(self.target.total, 1)), -1)
            best = np.argmax(key, axis=1)  # first maximum: lowest GPU index among equals
            at = np.arange(0, best.size * key.shape[1], key.shape[1]) + best  # [k, best[k]], flat
            fits = room.reshape(-1)[at] & (cpu_free >= shape[0])
            return np.where(fits, per_gpu.reshape(-1)[at], 0), np.where(fits, best, -1), fits
        cpu_after, gpu_after, fits = _after_placement(cpu_free, gpu_free, shape)
        after = _weighted_frag(cpu_after, gpu_after, acc, self._specs)
        return np.where(fits, after - base, 0), np.full(len(fits), -1, dtype=np.int64), fits


#: From this many changed nodes on, `_compute` evaluates each distinct node state once (below, few
#: nodes share a state: the trace's fill has about 1 % duplicates under 200 changed nodes, 2/3 above).
_DEDUP_MIN = 128


def _distinct_states(
    cpu_free: IntArray, model: IntArray, gpu_free: IntArray
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
    """(first row of each distinct node state, each row's state) when at most half the rows are
    distinct, else None. A state is (free CPU, GPU model id, free milli per GPU), compared as bytes."""
    rows = np.ascontiguousarray(np.column_stack((cpu_free, model, gpu_free)), dtype=np.int64)
    keys = rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).reshape(-1)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if len(first) * 2 > len(rows):
        return None
    return first, inverse.reshape(-1)
