"""The placement policies of the FGD benchmark as finesched profiles, plus ours.

Each baseline is one score plugin (the artifact enables exactly one, with weight 1000; one plugin
at weight 1 ranks the same), behind the same filters (node affinity on ``gpu-model``, CPU and
memory fit, the device plugin's GPU fit), with ties broken by a seeded random node order
(`Profile.tie_break = "random"`). Scores follow ../shared/reference/FGD-PROTOCOL.md §4 and the
artifact's integer arithmetic. Constants: MaxSpecCpu = 128,000 m, MaxSpecGpu = 8,000 m.

GPU choice inside the chosen node: the best-fit GPU (least free that fits, lowest minor among
equals) is the device plugin's ``MostAllocated`` card strategy, which also gives whole-GPU tasks
the first fully free GPUs by minor. Random's uniform GPU and FGD's GPU of least fragmentation
increase go through `DEVICE_CHOOSER` (plugins/shared_keys.py): `GpuSelect` and `FGDScore` write one.

Ours, FGD-CPU: FGD plus a CPU-stranding term (plugins/fragmentation/, ``cpuAware``), with the
target workload from the trace (as FGD) or learned online (FGD-CPU-Online). FGD-CPU-Exact: FGD-CPU
whose select takes, among the first K (``exact``, 24) nodes of FGD-CPU's order (score, then the
seeded tie order), the one with the smallest exact Δ' (`FGDExact`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from finesched.errors import ValidationError
from finesched.model.resources import CPU, GPU
from finesched.plugins.fragmentation import MAX_CLASSES, MILLI, FGDScore, GpuView, task_shape
from finesched.plugins.shared_keys import DEVICE_CHOOSER
from finesched.sched.cycle_state import CycleState, StateKey
from finesched.sched.framework import MAX_SCORE, SUCCESS, NodeBatch, ScoreArray, Status
from finesched.sched.registry import Registry, default_registry, no_args
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


class _ViewUser:
    """A plugin reading the per-GPU mirror (attached to the state once, shared by all users)."""

    view: GpuView
    cpu_row: int

    def attach(self, state: ClusterState) -> None:
        self.view = state.attach(GpuView())
        self.cpu_row = state.res_index[CPU]

    def _gpu(self, nodes: NodeBatch) -> np.ndarray:
        return nodes.take(self.view.free)

    def _cpu(self, nodes: NodeBatch) -> np.ndarray:
        return nodes.row(nodes.state.free, self.cpu_row)


# GPU choice -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Chooser:
    view: GpuView
    method: str
    rng: np.random.Generator | None
    share: bool

    def choose(self, node: int, device_type: str, fitting: Sequence[int], count: int) -> Sequence[int] | None:
        if device_type != GPU or not fitting:
            return None
        if not self.share:
            return list(fitting[:count])
        if self.method == "random":
            assert self.rng is not None
            return [fitting[int(self.rng.integers(len(fitting)))]]
        free = self.view.free[node]
        return [min(fitting, key=lambda g: (int(free[g]), g))]


class GpuSelect(_ViewUser):
    """Chooses the GPU of a share task: ``method: best`` (least free that fits) or ``random`` (seeded)."""

    NAME: ClassVar[str] = "GpuSelect"

    def __init__(self, method: str = "best", seed: int = 0):
        self.method = method
        self.rng = np.random.default_rng(seed) if method == "random" else None

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> GpuSelect:
        method = args.get("method", "best")
        if method not in ("best", "random"):
            raise ValidationError("method must be best or random", path="plugins.GpuSelect.args.method", value=method)
        return cls(method, int(args.get("seed", 0)))

    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        _, k, d = task_shape(request.workload.requests)
        cycle.write(DEVICE_CHOOSER, _Chooser(self.view, self.method, self.rng, k == 1 and d < MILLI))
        return SUCCESS


# Baseline scores -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Picked:
    node: int


_RANDOM_PICK = StateKey("RandomScore/node", _Picked)


class RandomScore:
    """One feasible node drawn uniformly (seeded) scores 100, every other node 0."""

    NAME: ClassVar[str] = "RandomScore"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> RandomScore:
        return cls(int(args.get("seed", 0)))

    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        feasible = nodes.indices
        cycle.write(_RANDOM_PICK, _Picked(int(feasible[self.rng.integers(len(feasible))]) if len(feasible) else -1))
        return SUCCESS

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        picked = cycle.read(_RANDOM_PICK).node
        index = np.arange(nodes.n) if nodes.index is None else nodes.index
        return np.where(index == picked, MAX_SCORE, 0).astype(np.int64)


def dot_product_score(cpu_free: np.ndarray, gpu_free_total: np.ndarray, cpu: int, gpu_total: int) -> ScoreArray:
    """⌊100·(1 − ½[(c_n/128000)(cpu/128000) + (R_n/8000)(k·d/8000)])⌋; 0 where c_n < cpu.

    Example: c_n = 64000, R_n = 4000, a task of 32000 m CPU and 1000 m GPU:
    ½(0.5·0.25 + 0.5·0.125) = 0.09375 -> ⌊90.625⌋ = 90.
    """
    dot = (cpu_free / MAX_SPEC_CPU) * (cpu / MAX_SPEC_CPU) + (gpu_free_total / MAX_SPEC_GPU) * (
        gpu_total / MAX_SPEC_GPU
    )
    score = np.floor(MAX_SCORE * (1.0 - dot / 2)).astype(np.int64)
    return np.where(cpu_free >= cpu, np.clip(score, 0, MAX_SCORE), 0)


class DotProd(_ViewUser):
    """Tetris-style dot product as the artifact computes it (the smallest product wins)."""

    NAME: ClassVar[str] = "DotProd"
    NODE_LOCAL: ClassVar[bool] = True

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        cpu, k, d = task_shape(request.workload.requests)
        return dot_product_score(self._cpu(nodes), self._gpu(nodes).sum(axis=1), cpu, k * d)


def gpu_packing_score(gpu_free: np.ndarray, gpu_count: np.ndarray, k: int, d: int) -> ScoreArray:
    """The artifact's GpuPacking: a partly used GPU > a free GPU on a used node > an idle node.

    * every GPU of the node free: max(33 − #free, #free);
    * the task needs j >= 1 fully free GPUs on a used node: max(50 − j, 33);
    * it fits on used GPUs only (least free first): max(100 − ⌊Σ ⌊r_g·100/1000⌋ / 10⌋, 50).
    CPU-only tasks score 0. Example: GPUs at 1000, 600, 200 and a 500 m task -> the 600 m GPU:
    100 − ⌊60 / 10⌋ = 94.
    """
    n, width = gpu_free.shape
    if k == 0:
        return np.zeros(n, dtype=np.int64)
    full = (gpu_free == MILLI).sum(axis=1)
    slots = np.arange(width)[None, :] < gpu_count[:, None]
    # The k GPUs the artifact takes: ascending free, stable, among those with free >= d.
    key = np.where(slots & (gpu_free >= d), gpu_free, MILLI + 1)
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    taken = np.take_along_axis(gpu_free, order, axis=1)
    ok = np.take_along_axis(key, order, axis=1) <= MILLI
    taken = np.where(ok, taken, 0)
    fresh = (ok & (taken == MILLI)).sum(axis=1)
    used_ratio = (taken * 100 // MILLI).sum(axis=1)
    case1 = np.maximum(MAX_SCORE - used_ratio // 10, MAX_SCORE // 2)
    case2 = np.maximum(MAX_SCORE // 2 - fresh, MAX_SCORE // 3)
    case3 = np.maximum(MAX_SCORE // 3 - full, full)
    score = np.where(fresh > 0, case2, case1)
    return np.where(full == gpu_count, case3, score).astype(np.int64)


class GpuPacking(_ViewUser):
    NAME: ClassVar[str] = "GpuPacking"
    NODE_LOCAL: ClassVar[bool] = True

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        _, k, d = task_shape(request.workload.requests)
        return gpu_packing_score(self._gpu(nodes), nodes.take(self.view.count), k, d)


def task_class(k: int, d: int) -> int:
    """GpuClustering's class: 0 for a share task, k for k whole GPUs, -1 for CPU-only."""
    if k == 0:
        return -1
    return 0 if k == 1 and d < MILLI else min(k, MAX_CLASSES - 1)


def gpu_clustering_score(classes: np.ndarray, gpu_free_total: np.ndarray, cls: int) -> ScoreArray:
    """Group like-sized GPU tasks, then pack: u = ⌊25·(8000 − R_n)/8000⌋ plus 75 (the node hosts only
    this class), 50 (this class among others), 25 (no GPU tasks) or 0 (only other classes).
    CPU-only tasks score 0. Example: R_n = 4000 on a node hosting only this class: 75 + 12 = 87.
    """
    if cls < 0:
        return np.zeros(len(gpu_free_total), dtype=np.int64)
    u = (MAX_SCORE // 4) * (MAX_SPEC_GPU - gpu_free_total) // MAX_SPEC_GPU
    hosted = (classes > 0).sum(axis=1)
    mine = classes[:, cls] > 0
    base = np.where(mine, np.where(hosted == 1, 75, 50), np.where(hosted == 0, 25, 0))
    return (base + u).astype(np.int64)


class GpuClustering(_ViewUser):
    NAME: ClassVar[str] = "GpuClustering"
    NODE_LOCAL: ClassVar[bool] = True

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        _, k, d = task_shape(request.workload.requests)
        return gpu_clustering_score(nodes.take(self.view.classes), self._gpu(nodes).sum(axis=1), task_class(k, d))


def best_fit_raw(cpu_free: np.ndarray, gpu_free_total: np.ndarray, cpu: int, gpu_total: int) -> ScoreArray:
    """⌊100·(1 − [½(c_n − cpu)/128000 + ½(R_n − k·d)/8000])⌋ before normalizing (less leftover wins).

    Example: c_n − cpu = 64000, R_n − k·d = 2000: 0.25 + 0.125 -> ⌊62.5⌋ = 62.
    """
    raw = (cpu_free - cpu) / MAX_SPEC_CPU * 0.5 + (gpu_free_total - gpu_total) / MAX_SPEC_GPU * 0.5
    return np.trunc((1.0 - raw) * MAX_SCORE).astype(np.int64)


def min_max_normalize(scores: ScoreArray, feasible: np.ndarray) -> ScoreArray:
    """(s − lo)·100 // (hi − lo) over the feasible nodes (all 0 when hi == lo), clipped elsewhere."""
    if not feasible.any():
        return np.zeros_like(scores)
    lo, hi = int(scores[feasible].min()), int(scores[feasible].max())
    if hi == lo:
        return np.zeros_like(scores)
    return np.clip((scores - lo) * MAX_SCORE // (hi - lo), 0, MAX_SCORE)


class BestFit(_ViewUser):
    NAME: ClassVar[str] = "BestFit"

    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        cpu, k, d = task_shape(request.workload.requests)
        return best_fit_raw(self._cpu(nodes), self._gpu(nodes).sum(axis=1), cpu, k * d)

    def normalize_score(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, scores: ScoreArray
    ) -> ScoreArray:
        feasible = np.ones(nodes.n, dtype=bool) if nodes.mask is None else nodes.mask
        return min_max_normalize(scores, feasible)


# Profiles ---------------------------------------------------------------------------------------------------------
#: Canonical policy names (CLI accepts any case); "best" names our best policy.
BASELINES = ("Random", "DotProd", "GpuPacking", "GpuClustering", "BestFit", "FGD")
#: Ours: CPU-aware FGD (plugins/fragmentation/ `FGDScore` with cpuAware), with M from the trace or
#: learned online; FGD-Online is plain FGD with the online M (no oracle view of the trace).
OURS = ("FGD-CPU", "FGD-CPU-Online", "FGD-Online", "FGD-CPU-Exact")
BEST = "FGD-CPU"
#: λ of the stranding term in our policy (results are flat for λ in 0.25..4 on the default trace).
CPU_AWARE_WEIGHT = 1.0
#: K of FGD-CPU-Exact: how many nodes of FGD-CPU's order the exact Δ' chooses among.
EXACT_CANDIDATES = 24
POLICIES = (*BASELINES, *OURS)
PUBLISHED_130 = {
    "FGD": 95.39,
    "BestFit": 93.08,
    "GpuPacking": 92.00,
    "GpuClustering": 91.88,
    "DotProd": 90.85,
    "Random": 87.47,
}


def resolve_policy(name: str) -> str:
    """The canonical name of a policy ("best" -> ours); ValueError listing valid names otherwise."""
    lookup = {p.lower(): p for p in POLICIES}
    key = name.strip().lower()
    if key == "best":
        return BEST
    if key not in lookup:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}, best")
    return lookup[key]


def sim_registry() -> Registry:
    """The default registry plus the benchmark's policies (and the device plugin)."""
    return default_registry().with_plugins(
        {
            "GpuSelect": GpuSelect.from_args,
            "RandomScore": RandomScore.from_args,
            "DotProd": no_args(DotProd),
            "GpuPacking": no_args(GpuPacking),
            "GpuClustering": no_args(GpuClustering),
            "BestFit": no_args(BestFit),
            "FGD": FGDScore.from_args,
        }
    )


def policy_profile(policy: str, seed: int, target_specs: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile (as data) of `policy` for one seed; `target_specs` is M for the FGD family."""
    policy = resolve_policy(policy)
    # Best-fit GPU for share tasks = the device plugin's MostAllocated card strategy (most used
    # device that still fits, lowest minor among equals); whole GPUs: the first free ones by minor.
    device = {"name": "DeviceShare", "args": {"strategy": "MostAllocated"}}
    filters = [{"name": "NodeSelector"}, {"name": "ResourcesFit"}, device]
    scorers: list[dict[str, Any]]
    if policy == "Random":
        random_gpu = {"name": "GpuSelect", "args": {"method": "random", "seed": seed + 1}}
        scorers = [{"name": "RandomScore", "args": {"seed": seed}}, random_gpu]
    elif policy in ("FGD", "FGD-Online", "FGD-CPU", "FGD-CPU-Online", "FGD-CPU-Exact"):
        args: dict[str, Any] = {"target": "online" if policy.endswith("Online") else target_specs}
        if policy.startswith("FGD-CPU"):
            args["cpuAware"] = CPU_AWARE_WEIGHT
        if policy == "FGD-CPU-Exact":
            args["exact"] = EXACT_CANDIDATES
        scorers = [{"name": "FGD", "args": args}]
    else:
        scorers = [{"name": policy}]
    return {"name": policy, "plugins": filters + scorers, "tieBreak": "random", "seed": seed}
