"""The benchmark's metrics (FGD-PROTOCOL.md §3-4), as pure functions over per-arrival samples.

* GPU allocation rate after each arrival: allocated GPU milli / (1000 x GPUs), in percent.
* Arrived demand: Σ k·d of the pods arrived so far (placed or failed) / capacity, in percent.
* Binning: arrived demand is rounded to an integer percent x; the allocation rate at x is the mean
  of the samples whose rounded demand equals x, or, when there are none, of those within x ± 1.
* Fragmentation amount F / capacity and ratio F / Σ R_n (plugins/fragmentation/ has F).
* The target workload M comes from `TargetWorkload.from_pods` (top specs covering 95 % of pods).

Worked binning example: arrived 89.6, 90.2, 90.4, 91.7 % with alloc 80, 81, 82, 83 % -> at 90:
mean(80, 81, 82) = 81 (89.6 and 90.4 round to 90); at 92: 91.7 rounds to 92 -> 83; at 93 nothing
rounds to 93, so the samples within 92..94 are used -> 83.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from finesched.plugins.fragmentation import TargetWorkload
from finesched.sim.trace import PodTable

FloatArray = npt.NDArray[np.float64]

#: Arrived-demand points the protocol reports (percent of GPU capacity).
REPORT_POINTS = (90, 95, 100, 110, 120, 130)


def percent(amount_milli: npt.ArrayLike, capacity_milli: int) -> FloatArray:
    """100 · amount / capacity."""
    return 100.0 * np.asarray(amount_milli, dtype=np.float64) / capacity_milli


def bin_at(arrived_pct: FloatArray, values: FloatArray, points: Iterable[int]) -> dict[int, float]:
    """Mean of `values` whose arrived demand rounds to each point (±1 fallback); NaN when none.

    Rounding is half to even (90.5 -> 90, 91.5 -> 92), as Python's ``round(x, 0)`` in the
    artifact's merge_alloc_discrete.py.
    """
    rounded = np.round(np.asarray(arrived_pct)).astype(np.int64)
    out: dict[int, float] = {}
    for x in points:
        hit = rounded == x
        if not hit.any():
            hit = np.abs(rounded - x) <= 1
        out[int(x)] = float(np.mean(values[hit])) if hit.any() else float("nan")
    return out


def target_workload(pods: PodTable, coverage: float = 0.95) -> TargetWorkload:
    """The protocol's M for a pod list (CPU-only pods included, GPU-model constraint part of the spec)."""
    return TargetWorkload.from_pods(pods.cpu_milli, pods.num_gpu, pods.gpu_milli, pods.gpu_spec, coverage)


def unallocated_reduction(alloc_ours: float, alloc_base: float) -> float:
    """The paper's "reduces unallocated GPUs by X": 1 − (100 − ours) / (100 − base)."""
    return 1.0 - (100.0 - alloc_ours) / (100.0 - alloc_base)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value), NaNs ignored."""
    arr = np.asarray([v for v in values if v == v], dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def summarize(results: Iterable[Mapping[str, object]], point: int = 130) -> dict[str, dict[str, float]]:
    """Per policy: mean and std over seeds of the allocation rate at `point`, plus the seed count."""
    by_policy: dict[str, list[float]] = {}
    for r in results:
        alloc = r["alloc"]
        assert isinstance(alloc, Mapping)
        by_policy.setdefault(str(r["policy"]), []).append(float(alloc[str(point)]))
    out = {}
    for policy, values in by_policy.items():
        mean, std = mean_std(values)
        out[policy] = {f"mean_{point}": round(mean, 4), f"std_{point}": round(std, 4), "seeds": len(values)}
    return out


def queueing_stats(delays: FloatArray) -> dict[str, float]:
    """Mean, median, p95 and max of queueing delays (seconds); zeros when there are none."""
    if delays.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    return {
        "mean": float(delays.mean()),
        "p50": float(np.percentile(delays, 50)),
        "p95": float(np.percentile(delays, 95)),
        "max": float(delays.max()),
    }
