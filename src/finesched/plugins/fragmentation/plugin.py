"""The FGD score plugin (and its CPU-aware variant) over the fragmentation index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.model.resources import CPU, GPU, GPU_CORE, WHOLE_GPU_NAMES
from finesched.plugins.fragmentation.index import FragmentationIndex, fgd_scores
from finesched.plugins.fragmentation.target import GPU_MODEL_LABEL, MILLI, OnlineTarget, Shape, TargetWorkload
from finesched.plugins.shared_keys import DEVICE_CHOOSER
from finesched.sched.cycle_state import CycleState, MissingState, StateKey
from finesched.sched.framework import SUCCESS, NodeBatch, ScoreArray, Status
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


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
    #: [n] the exact Δ' behind each node's score, and where FGD found the task fits (its score is
    #: 0 elsewhere); kept for the ``exact`` select (`FGDExact`), None otherwise.
    delta: FloatArray | None = None
    fits: BoolArray | None = None


FGD_STATE = StateKey("FGD/scores", FGDState)


@dataclass
class _Scored:
    """One shape's scores and Δ' per node, as of the index version `seen` of each node."""

    seen: IntArray
    scores: ScoreArray
    delta: FloatArray
    clock: int = -1  # the index's clock when `seen` was brought up to date


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
            exact: 24             # optional: among the first K nodes of the score order, the least Δ' (`FGDExact`)
    """

    NAME: ClassVar[str] = "FGD"
    ARGS: ClassVar[frozenset[str]] = frozenset(
        {"target", "window", "refresh", "gpuChoice", "coverage", "cpuAware", "exact"}
    )
    #: Whether pre_score keeps the exact Δ' per node in the cycle (the ``exact`` select reads it).
    KEEP_DELTA: ClassVar[bool] = False

    def __init__(self, target: TargetWorkload | OnlineTarget, gpu_choice: str = "score", cpu_aware: float = 0.0):
        self.source = target
        self.gpu_choice = gpu_choice
        self.cpu_aware = cpu_aware
        self.index: FragmentationIndex | None = None
        self._online_version = -1
        #: Scores per task shape, refreshed on the nodes that changed (`pre_score`); dropped with
        #: the index's caches (its epoch).
        self._scores: dict[Shape, _Scored] = {}
        self._scored_epoch = -1
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
        exact = args.get("exact")
        if exact is not None and (isinstance(exact, bool) or not isinstance(exact, int) or not 1 <= exact <= MAX_EXACT):
            raise ValidationError(f"must be an integer in 1..{MAX_EXACT}", path=f"{where}.exact", value=exact)
        target = args.get("target")
        if target == "online":
            online = {}
            for name, kind in (("window", int), ("refresh", int), ("coverage", float)):
                value = args.get(name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                    raise ValidationError("must be a number > 0", path=f"{where}.{name}", value=value)
                if value is not None:
                    online[name] = kind(value)
            return cls._made(OnlineTarget(**online), choice, float(cpu_aware), exact)
        if not isinstance(target, list) or not target:
            raise ValidationError("must be a non-empty list of specs or 'online'", path=f"{where}.target")
        return cls._made(TargetWorkload.from_specs(target), choice, float(cpu_aware), exact)

    @classmethod
    def _made(cls, target: TargetWorkload | OnlineTarget, choice: str, cpu_aware: float, exact: int | None) -> FGDScore:
        """The plugin of checked args: FGDScore, or FGDExact (also a select plugin) with ``exact``."""
        if exact is None:
            return cls(target, choice, cpu_aware)
        return FGDExact(target, choice, cpu_aware, exact=exact)

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
        scored = self._scored(index, shape)
        if scored.clock != cache.clock:  # Δ' and the score of a node change only with the node
            stale = np.flatnonzero(scored.seen != cache.seen)
            delta = cache.delta[stale] / max(index.target.total, 1)
            if self.cpu_aware > 0:
                delta = delta + self.cpu_aware * self._stranding_delta(index, shape, stale)
            scored.scores[stale] = np.where(cache.fits[stale], fgd_scores(delta), 0)
            scored.delta[stale] = delta
            scored.seen[stale] = cache.seen[stale]
            scored.clock = cache.clock
        if self.KEEP_DELTA:
            cycle.write(FGD_STATE, FGDState(scored.scores.copy(), scored.delta.copy(), cache.fits))
        else:
            cycle.write(FGD_STATE, FGDState(scored.scores.copy()))
        cycle.write(DEVICE_CHOOSER, GpuPick(cache.gpu, shape[1] == 1 and shape[2] < MILLI))
        return SUCCESS

    def _scored(self, index: FragmentationIndex, shape: Shape) -> _Scored:
        """This plugin's scores of `shape` (per plugin: λ differs between plugins sharing an index)."""
        if self._scored_epoch != index.epoch:
            self._scores.clear()
            self._scored_epoch = index.epoch
        scored = self._scores.get(shape)
        if scored is None:
            n = index.state.n
            scored = self._scores[shape] = _Scored(
                np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.float64)
            )
        return scored

    def _stranding_delta(self, index: FragmentationIndex, shape: Shape, nodes: IntArray) -> FloatArray:
        rho = index.target.cpu_per_gpu_milli
        idle = index.idle()[nodes].astype(np.float64)
        cpu = index.state.free[self._cpu_row][nodes].astype(np.float64)
        cpu_task, k, d = shape
        return stranded_milli(idle - k * d, cpu - cpu_task, rho) - stranded_milli(idle, cpu, rho)

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        return nodes.take(cycle.read(FGD_STATE).scores)


#: The largest ``exact`` K accepted: a bound on input, not on the cluster (a K above the feasible node
#: count lets Δ' choose among all of them, i.e. scoring by exact Δ', which FGD does worse with).
MAX_EXACT = 1000


class FGDExact(FGDScore):
    """FGD (usually CPU-aware: FGD-CPU-Exact) that also selects: among the first K feasible nodes of
    the score order, the one with the smallest exact Δ' (``exact: K`` in the FGD args).

    Why: the score ⌊100·σ(−Δ'/1000)⌋ is an integer, so nodes whose Δ' differ by less than about
    40 milli-GPU tie and the seeded tie order decides among them. The select keeps the ranking
    (total score descending, then the profile's tie order: the key the scheduler passes) but lets
    the exact Δ' decide among its first K; ties in Δ' keep the earlier node. The chosen node comes
    first, then every other feasible node in the usual order (reserve may refuse the first).

    The Δ' of a node is the one its score came from, computed for the GPU that `GpuPick` (this
    plugin's DEVICE_CHOOSER) reserves, so the GPU placed on is the one Δ' describes. Per-shape
    memoization (sched/memo.py) keeps only filter results and the score key; pre_score runs every
    cycle and reads Δ' for all nodes from the fragmentation index (refreshed where nodes changed),
    so the select always sees the current Δ' of every node, memoized or not.
    """

    KEEP_DELTA: ClassVar[bool] = True

    def __init__(
        self,
        target: TargetWorkload | OnlineTarget,
        gpu_choice: str = "score",
        cpu_aware: float = 0.0,
        *,
        exact: int = 24,
    ):
        super().__init__(target, gpu_choice, cpu_aware)
        #: K: how many nodes of the score order the exact Δ' chooses among.
        self.exact = exact

    def select(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, total: ScoreArray) -> Iterator[int]:
        kept = cycle.read(FGD_STATE)
        if kept.delta is None:
            raise MissingState("FGD exact: pre_score did not keep Δ'")
        yield from exact_order(total, kept.delta, self.exact, nodes.mask, kept.fits)


def first_k(key: ScoreArray, k: int, feasible: BoolArray | None = None) -> IntArray:
    """The first `k` feasible nodes by `key` descending, the lowest index among equal keys: the
    order in which the scheduler tries nodes without a select plugin. Feasible: `feasible` (all
    nodes when None) and key >= 0 (the scheduler's key is −1 on infeasible nodes).

    Cost: one partition and one comparison over the nodes (a few µs at 1,000s of nodes), then
    work on the k candidates only."""
    if feasible is not None:
        key = np.where(feasible, key, -1)
    n = len(key)
    if n > k:
        cut = np.partition(key, n - k)[n - k]  # the k-th largest key
        top = np.flatnonzero(key >= cut)
        if len(top) > k:  # equal keys straddle the cut: those above it, then the lowest-index equals
            above = top[key[top] > cut]
            top = np.sort(np.concatenate([above, top[key[top] == cut][: k - len(above)]]))
    else:
        top = np.arange(n)
    keys = key[top]
    ok = keys >= 0
    top, keys = top[ok], keys[ok]
    return top[np.argsort(-keys, kind="stable")]


def exact_order(
    key: ScoreArray, delta: FloatArray, k: int, feasible: BoolArray | None = None, fits: BoolArray | None = None
) -> Iterator[int]:
    """Feasible nodes in FGDExact's order: the least `delta` among the first `k` by `key` (the earlier
    among equals; a node where `fits` is False counts as +inf), then every other feasible node by
    `key` descending, lowest index among equals."""
    top = first_k(key, k, feasible)
    if len(top) == 0:
        return
    exact = delta[top] if fits is None else np.where(fits[top], delta[top], np.inf)
    chosen = int(top[int(np.argmin(exact))])
    yield chosen
    rest = key.copy() if feasible is None else np.where(feasible, key, -1)  # only when reserve refused it
    rest[chosen] = -1
    while True:
        best = int(rest.argmax())
        if rest[best] < 0:
            return
        yield best
        rest[best] = -1
