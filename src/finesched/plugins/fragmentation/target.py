"""The target workload M of fragmentation: task specs and their weights, from a trace or learned online."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


MILLI = 1000
#: GPU task classes the view counts per node: 0 = share-GPU tasks, k = tasks of k whole GPUs.
MAX_CLASSES = 17
GPU_MODEL_LABEL = "gpu-model"
#: A task shape as FGD sees it: (cpu milli, GPU count k, milli per GPU d).
Shape = tuple[int, int, int]


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

    # cached: the index and the plugins read these on every decision (the arrays are never changed)
    @cached_property
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

    @cached_property
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
