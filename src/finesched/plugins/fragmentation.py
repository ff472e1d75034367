"""GPU fragmentation with respect to a target workload, and the FGD score (Weng et al., ATC'23).

The measure. A *target workload* M is a set of task specs m = (cpu_m, k_m GPUs of d_m milli each,
allowed GPU models S_m) with weights p_m (frequencies). For node n with free CPU c_n and free
milli r_g on each GPU (R_n = Σ_g r_g)::

    f_n(m) = R_n                        if d_m = 0 (CPU-only task), or the node's model is not in S_m,
                                        or m does not fit (c_n < cpu_m or fewer than k_m GPUs with r_g >= d_m)
           = Σ_g r_g · [r_g < d_m]      otherwise (only GPUs too small for m are fragments)
    F_n(M) = Σ_m p_m · f_n(m)           (expected idle GPU milli a random task of M cannot use)

Worked example: a node with 4 CPUs free and GPUs at 1000, 300, 0 milli (R = 1300); M = {A: 2 CPUs
x 500 m, p 0.5; B: 8 CPUs x 100 m, p 0.25; C: CPU-only, p 0.25}. f(A) = 300 (the 300 m GPU is too
small; A fits on the 1000 m one), f(B) = 1300 (B lacks CPU), f(C) = 1300, so
F = 0.5·300 + 0.25·1300 + 0.25·1300 = 800.

FGD (`FGDScore`) places a task where F rises least: Δ_n = F_{n'}(M) − F_n(M) for n' = n after the
placement; score ⌊100·σ(−Δ_n/1000)⌋. A share task tries every GPU with room and keeps the best
(the artifact compares the *integer* scores and keeps the lowest GPU index among equals; ``gpuChoice:
delta`` compares Δ exactly instead); k whole GPUs take fully free GPUs; a CPU-only task only
lowers c_n. Example above, placing a 1 CPU x 300 m task: on the 300 m GPU the node becomes 3 CPUs,
GPUs 1000/0/0: f(A) = 0, f(B) = f(C) = 1000, F' = 500, Δ = −300, score ⌊100·σ(0.3)⌋ = 57; on the
1000 m GPU (left 700): f(A) = 300, F' = 650, Δ = −150, score 53. FGD takes the 300 m GPU.

Speed. Weights are kept as integer counts, so Δ·W (W = Σ counts) is exact and equal states give
exactly Δ = 0. `FragmentationIndex` caches f_n(m) per node and, per task shape (cpu, k, d), Δ and the
chosen GPU for every node; a node is recomputed only when it changed (one per placement), in one
numpy pass over the changed nodes × GPUs × specs.

The target M comes from a trace (`TargetWorkload.from_pods`, the protocol's top specs covering 95 %
of pods) or is learned online from a sliding window of recent requests (`OnlineTarget`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.resources import CPU, GPU, GPU_CORE, WHOLE_GPU_NAMES
from finesched.plugins.shared_keys import DEVICE_CHOOSER
from finesched.sched.cycle_state import CycleState, MissingState, StateKey
from finesched.sched.framework import SUCCESS, NodeBatch, ScoreArray, Status
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

MILLI = 1000
#: GPU task classes the view counts per node: 0 = share-GPU tasks, k = tasks of k whole GPUs.
MAX_CLASSES = 17
GPU_MODEL_LABEL = "gpu-model"
#: A task shape as FGD sees it: (cpu milli, GPU count k, milli per GPU d).
Shape = tuple[int, int, int]


# Target workload ------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TargetWorkload:
    """Task specs with integer weights (p_m = counts_m / Σ counts)."""

    cpu: IntArray
    gpu_count: IntArray
    gpu_milli: IntArray
    models: tuple[tuple[str, ...], ...]
    counts: IntArray

    def __len__(self) -> int:
        return len(self.models)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def p(self) -> FloatArray:
        return self.counts / max(self.total, 1)

    @classmethod
    def from_specs(cls, specs: Iterable[Mapping[str, Any]]) -> TargetWorkload:
        """From ``[{cpu: milli, gpuCount: k, gpuMilli: d, models: [..], count: w}, ...]``."""
        rows = list(specs)
        for i, s in enumerate(rows):
            for name in ("cpu", "gpuCount", "gpuMilli", "count"):
                value = s.get(name, 0 if name != "count" else 1)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValidationError("must be an integer >= 0", path=f"target[{i}].{name}", value=value)
        return cls(
            cpu=np.asarray([s.get("cpu", 0) for s in rows], dtype=np.int64),
            gpu_count=np.asarray([s.get("gpuCount", 0) for s in rows], dtype=np.int64),
            gpu_milli=np.asarray([s.get("gpuMilli", 0) for s in rows], dtype=np.int64),
            models=tuple(tuple(sorted(s.get("models", ()))) for s in rows),
            counts=np.asarray([s.get("count", 1) for s in rows], dtype=np.int64),
        )

    def key(self) -> tuple[Any, ...]:
        """A hashable identity of the specs and weights."""
        return (
            tuple(self.cpu.tolist()),
            tuple(self.gpu_count.tolist()),
            tuple(self.gpu_milli.tolist()),
            self.models,
            tuple(self.counts.tolist()),
        )

    @property
    def cpu_per_gpu_milli(self) -> float:
        """ρ: CPU milli the GPU specs ask per GPU milli, weighted by count (0 without GPU specs)."""
        gpu = self.gpu_count * self.gpu_milli
        denominator = int((self.counts * gpu).sum())
        return float((self.counts * self.cpu)[gpu > 0].sum()) / denominator if denominator else 0.0

    def to_specs(self) -> list[dict[str, Any]]:
        return [
            {
                "cpu": int(self.cpu[m]),
                "gpuCount": int(self.gpu_count[m]),
                "gpuMilli": int(self.gpu_milli[m]),
                "models": list(self.models[m]),
                "count": int(self.counts[m]),
            }
            for m in range(len(self))
        ]

    @classmethod
    def from_counts(cls, counts: Mapping[tuple[int, int, int, str], int], coverage: float = 0.95) -> TargetWorkload:
        """The most frequent specs (cpu, d, k, model constraint text) covering >= `coverage` of the count.

        Order as the artifact's ``GetTypicalPods``: by count, then by (cpu, d, k, constraint), both
        descending; keep the shortest prefix whose cumulative count reaches the coverage.
        """
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        total = sum(counts.values())
        kept: list[tuple[tuple[int, int, int, str], int]] = []
        cumulative = 0
        for spec, count in ranked:
            if cumulative >= coverage * total:
                break
            kept.append((spec, count))
            cumulative += count
        return cls(
            cpu=np.asarray([s[0] for s, _ in kept], dtype=np.int64),
            gpu_milli=np.asarray([s[1] for s, _ in kept], dtype=np.int64),
            gpu_count=np.asarray([s[2] for s, _ in kept], dtype=np.int64),
            models=tuple(tuple(sorted({p for p in s[3].split("|") if p})) for s, _ in kept),
            counts=np.asarray([c for _, c in kept], dtype=np.int64),
        )

    @classmethod
    def from_pods(
        cls,
        cpu: Sequence[int],
        gpu_count: Sequence[int],
        gpu_milli: Sequence[int],
        constraint: Sequence[str],
        coverage: float = 0.95,
    ) -> TargetWorkload:
        """The protocol's M from pod columns (CPU-only pods included)."""
        counts: Counter[tuple[int, int, int, str]] = Counter(
            zip(
                (int(x) for x in cpu),
                (int(x) for x in gpu_milli),
                (int(x) for x in gpu_count),
                constraint,
                strict=True,
            )
        )
        return cls.from_counts(counts, coverage)


class OnlineTarget:
    """M learned from the last `window` requests (no oracle): top specs covering `coverage`.

    The target is rebuilt every `refresh` observations; `version` counts rebuilds so caches know.
    """

    def __init__(self, window: int = 2000, refresh: int = 200, coverage: float = 0.95):
        self.window, self.refresh, self.coverage = window, refresh, coverage
        self._recent: deque[tuple[int, int, int, str]] = deque()
        self._counts: Counter[tuple[int, int, int, str]] = Counter()
        self._since = 0
        self.version = 0
        self.target: TargetWorkload | None = None

    def observe(self, spec: tuple[int, int, int, str]) -> None:
        self._recent.append(spec)
        self._counts[spec] += 1
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._since += 1
        if self.target is None or self._since >= self.refresh:
            self.target = TargetWorkload.from_counts(self._counts, self.coverage)
            self._since = 0
            self.version += 1


# Per-GPU view of the cluster --------------------------------------------------------------------------------
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

    def resize(self, capacity: int) -> None:
        keep = min(capacity, self.free.shape[0])

        def grown(a: IntArray) -> IntArray:
            out = np.zeros((capacity, *a.shape[1:]), dtype=np.int64)
            out[:keep] = a[:keep]
            return out

        self.free, self.count, self.classes = grown(self.free), grown(self.count), grown(self.classes)
        self.version = grown(self.version)

    def set_node(self, index: int, node: Node) -> None:
        gpus = node.devices_of(GPU)
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
        grants = binding.devices.get(GPU, ())
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
    """Nodes after placing a CPU-only or whole-GPU task (first fully free GPUs), and where it fits."""
    cpu, k, d = shape
    after = gpu_free.copy()
    fits = cpu_free >= cpu
    if k:
        full = gpu_free >= d
        rank = np.cumsum(full, axis=1)
        after[full & (rank <= k)] -= d
        fits &= rank[:, -1] >= k
    return cpu_free - cpu, after, fits


@dataclass
class _ShapeCache:
    seen: IntArray
    delta: IntArray  # (F' − F)·W per node
    gpu: IntArray  # chosen GPU minor for share tasks (-1 none)
    fits: BoolArray


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
        version = self.view.version[:n]
        stale = np.flatnonzero(version != self._seen)
        if stale.size:
            gpu = self.view.free[stale]
            terms = fragment_terms(self.state.free[self._cpu_row, stale], gpu, self._acc[stale], self.target)
            frag, idle = terms @ self.target.counts, gpu.sum(axis=1)
            self._frag_total += int(frag.sum() - self._frag[stale].sum())
            self._idle_total += int(idle.sum() - self._idle[stale].sum())
            self._frag[stale], self._idle[stale] = frag, idle
            self._seen[stale] = version[stale]

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
        version = self.view.version[:n]
        stale = np.flatnonzero(version != cache.seen)
        if stale.size:
            self._compute(shape, stale, cache)
            cache.seen[stale] = version[stale]
        return cache

    def _compute(self, shape: Shape, nodes: npt.NDArray[np.intp], cache: _ShapeCache) -> None:
        cpu_free = self.state.free[self._cpu_row, nodes]
        gpu_free = self.view.free[nodes]
        acc, target = self._acc[nodes], self.target
        _, k, d = shape
        if k == 1 and d < MILLI:
            per_gpu = _share_deltas(cpu_free, gpu_free, acc, target, shape, self._frag[nodes])
            valid = per_gpu != np.iinfo(np.int64).min
            if self.gpu_choice == "delta":
                key = np.where(valid, -per_gpu, np.iinfo(np.int64).min)
            else:
                score = fgd_score(per_gpu / max(target.total, 1))
                key = np.where(valid, score, -1)
            best = np.argmax(key, axis=1)  # first maximum: lowest GPU index among equals
            rows = np.arange(len(nodes))
            fits = valid[rows, best] & (cpu_free >= shape[0])
            cache.delta[nodes] = np.where(fits, per_gpu[rows, best], 0)
            cache.gpu[nodes] = np.where(fits, best, -1)
            cache.fits[nodes] = fits
            return
        cpu_after, gpu_after, fits = _after_placement(cpu_free, gpu_free, shape)
        after = fragment_terms(cpu_after, gpu_after, acc, target) @ target.counts
        cache.delta[nodes] = np.where(fits, after - self._frag[nodes], 0)
        cache.gpu[nodes] = -1
        cache.fits[nodes] = fits


# The plugin --------------------------------------------------------------------------------------------------------
def task_shape(requests: Mapping[str, int]) -> Shape:
    """(cpu milli, k, d milli) of a request: ``nvidia.com/gpu: k`` -> (k, 1000); ``gpu-core: c`` -> one
    GPU at 10·c milli when c <= 100, else c/100 whole GPUs (Koordinator's reading)."""
    cpu = requests.get(CPU, 0)
    for name in WHOLE_GPU_NAMES:
        if requests.get(name, 0) > 0:
            return cpu, requests[name], MILLI
    core = requests.get(GPU_CORE, 0) or requests.get(GPU, 0)
    if core <= 0:
        return cpu, 0, 0
    if core <= 100:
        return cpu, 1, core * MILLI // 100
    return cpu, core // 100, MILLI


def constraint_text(request: ScheduleRequest) -> str:
    """The workload's allowed GPU models as the trace writes them ("A|B"; "" = any)."""
    for term in request.workload.node_affinity:
        if term.key == GPU_MODEL_LABEL and term.operator == "In":
            return "|".join(sorted(term.values))
    return request.workload.node_selector.get(GPU_MODEL_LABEL, "")


@dataclass(frozen=True)
class GpuPick:
    """A DeviceChooser: the share GPU chosen per node, else the first fitting devices by minor."""

    gpu: IntArray
    share: bool

    def choose(self, node: int, device_type: str, fitting: Sequence[int], count: int) -> Sequence[int] | None:
        if device_type != GPU:
            return None
        if self.share and count == 1:
            g = int(self.gpu[node])
            return [g] if g in fitting else None
        return list(fitting[:count])


def stranded_milli(gpu_free_total: FloatArray, cpu_free: FloatArray, cpu_per_gpu_milli: float) -> FloatArray:
    """GPU milli a node cannot use for lack of CPU, at the target's CPU per GPU ratio ρ: max(0, R − c/ρ).

    Example: ρ = 10.9 CPU milli per GPU milli (about 11 CPUs per GPU, the default trace); a node with
    R = 4000 (4 GPUs idle) and c = 21,800 m can feed 2000 GPU milli: 2000 are stranded.
    """
    if cpu_per_gpu_milli <= 0:
        return np.zeros_like(np.asarray(gpu_free_total, dtype=np.float64))
    return np.maximum(0.0, gpu_free_total - cpu_free / cpu_per_gpu_milli)


@dataclass(frozen=True)
class FGDState:
    scores: ScoreArray


FGD_STATE = StateKey("FGD/scores", FGDState)


class FGDScore:
    """Score: ⌊100·σ(−Δ/1000)⌋ of the fragmentation increase; picks the share GPU too (DEVICE_CHOOSER).

    With ``cpuAware: λ > 0`` (CPU-aware FGD, finesched's policy) the increase is
    Δ' = Δ + λ·Δ_stranded, where stranded = max(0, R_n − c_n/ρ) is the idle GPU milli the node's
    free CPU cannot feed at the target workload's CPU-per-GPU ratio ρ (`stranded_milli`). FGD only
    sees whether *one* task of each spec still fits; the stranding term also charges placements
    that eat the CPU the node's remaining GPUs will need (CPU-only tasks on GPU-dense nodes, CPU-
    heavy share tasks), which is where FGD leaves GPUs idle at high load.

    Args (profile YAML)::

        - name: FGD
          args:
            target: [{cpu: 3150, gpuCount: 1, gpuMilli: 810, models: [], count: 1043}, ...]
            # or  target: online   (learn M from a sliding window of recent requests)
            window: 2000          # online only: requests remembered
            refresh: 200          # online only: rebuild M every this many requests
            gpuChoice: score      # score (the artifact) | delta (exact argmin Δ)
            cpuAware: 0           # λ of the stranding term (0: plain FGD)
    """

    NAME: ClassVar[str] = "FGD"
    ARGS: ClassVar[frozenset[str]] = frozenset({"target", "window", "refresh", "gpuChoice", "coverage", "cpuAware"})

    def __init__(self, target: TargetWorkload | OnlineTarget, gpu_choice: str = "score", cpu_aware: float = 0.0):
        self.source = target
        self.gpu_choice = gpu_choice
        self.cpu_aware = cpu_aware
        self.index: FragmentationIndex | None = None
        self._online_version = -1
        #: Scores depend only on the workload and each node (not with an online target, which moves).
        self.NODE_LOCAL = isinstance(target, TargetWorkload)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> FGDScore:
        where = "plugins.FGD.args"
        unknown = sorted(set(args) - cls.ARGS)
        if unknown:
            raise ValidationError(f"unknown args {unknown}; valid: {sorted(cls.ARGS)}", path=where)
        choice = args.get("gpuChoice", "score")
        if choice not in ("score", "delta"):
            raise ValidationError("must be score or delta", path=f"{where}.gpuChoice", value=choice)
        cpu_aware = args.get("cpuAware", 0)
        if isinstance(cpu_aware, bool) or not isinstance(cpu_aware, int | float) or cpu_aware < 0:
            raise ValidationError("must be a number >= 0", path=f"{where}.cpuAware", value=cpu_aware)
        target = args.get("target")
        if target == "online":
            online = {}
            for name, kind in (("window", int), ("refresh", int), ("coverage", float)):
                value = args.get(name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                    raise ValidationError("must be a number > 0", path=f"{where}.{name}", value=value)
                if value is not None:
                    online[name] = kind(value)
            return cls(OnlineTarget(**online), choice, float(cpu_aware))
        if not isinstance(target, list) or not target:
            raise ValidationError("must be a non-empty list of specs or 'online'", path=f"{where}.target")
        return cls(TargetWorkload.from_specs(target), choice, float(cpu_aware))

    def attach(self, state: ClusterState) -> None:
        if isinstance(self.source, TargetWorkload):
            self.index = FragmentationIndex.shared(state, self.source, self.gpu_choice)
        else:
            self.index = FragmentationIndex(state, TargetWorkload.from_counts({}), self.gpu_choice)
        self._cpu_row = state.res_index[CPU]

    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        index = self.index
        if index is None:
            raise MissingState("FGD: not attached to a ClusterState")
        shape = task_shape(request.workload.requests)
        if isinstance(self.source, OnlineTarget):
            self.source.observe((shape[0], shape[2], shape[1], constraint_text(request)))
            if self.source.version != self._online_version and self.source.target is not None:
                index.set_target(self.source.target)
                self._online_version = self.source.version
        cache = index.deltas(shape)
        delta = cache.delta / max(index.target.total, 1)
        if self.cpu_aware > 0:
            delta = delta + self.cpu_aware * self._stranding_delta(index, shape)
        scores = np.where(cache.fits, fgd_score(delta), 0)
        cycle.write(FGD_STATE, FGDState(scores))
        cycle.write(DEVICE_CHOOSER, GpuPick(cache.gpu, shape[1] == 1 and shape[2] < MILLI))
        return SUCCESS

    def _stranding_delta(self, index: FragmentationIndex, shape: Shape) -> FloatArray:
        n = index.state.n
        rho = index.target.cpu_per_gpu_milli
        idle = index.idle().astype(np.float64)
        cpu = index.state.free[self._cpu_row, :n].astype(np.float64)
        cpu_task, k, d = shape
        return stranded_milli(idle - k * d, cpu - cpu_task, rho) - stranded_milli(idle, cpu, rho)

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        return nodes.take(cycle.read(FGD_STATE).scores)
