"""Run many policy x seed experiments, in parallel processes (``--jobs``), with progress reports.

Each run is independent (its own ClusterState and Scheduler), so runs go to a `multiprocessing`
pool; workers read the trace files themselves (cached per process) and send back compact results:
the result row, binned curves for plots (one value per integer percent of arrived demand) or a
down-sampled time series (replay). Workers report progress through a queue; the parent folds it
into one fraction per run for the progress bar.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from finesched.sim import metrics
from finesched.sim.experiment import inflate, run_fill
from finesched.sim.lp_bound import lp_bound
from finesched.sim.replay import run_replay
from finesched.sim.trace import NodeTable, PodTable, load_nodes, load_pods

#: Curves are binned at every integer percent of arrived demand up to this.
CURVE_MAX = 130
SERIES_POINTS = 2000
OnProgress = Callable[[float], None]


@dataclass(frozen=True)
class RunSpec:
    """One run: which protocol, trace files, policy and seed, and the protocol's knob."""

    mode: str  # "fill" | "replay" | "mig" (sim/mig.py: one MIG mode of `sim fill --mig`)
    nodes: str
    pods: str
    policy: str
    seed: int
    inflation: float = 1.3
    time_scale: float = 1.0
    preemption: bool = False
    priorities: tuple[float, ...] = ()
    #: `sim fill --mig`: share of GPU nodes in MIG mode, the product, and this run's mode.
    mig_share: float = 0.0
    mig_product: str = "A100-80GB"
    mig_mode: str = ""
    #: `sim fill --gpu-partitions`: give every GPU node a partition table under this policy.
    gpu_partitions: str = ""
    #: `sim replay --defragment`: the profile's defragmentation settings (pairs; () for the
    #: defaults); None: the defragmenter is off.
    defragmentation: tuple[tuple[str, float], ...] | None = None


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,45,50`` or ``42`` (ranges and lists mix: ``1-3,7``); ValueError when malformed.

    Errors start with ``--seeds:`` and quote only the offending element, so in ``1-5,5x`` the user
    sees ``'5x'`` rather than having to find the bad part of the whole value.
    """
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match:
            # an empty element ("1-5,,7") is only findable with the whole value beside it
            where = f" (an empty element of {text.strip()!r})" if not part and text.strip() else ""
            raise ValueError(f"--seeds: bad seed range {part!r}{where}: use N, N-M or a comma list (e.g. 42-51)")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) else lo
        if hi < lo:
            raise ValueError(f"--seeds: bad seed range {part!r}: the end is below the start")
        if hi - lo >= 10_000:
            raise ValueError(f"--seeds: bad seed range {part!r}: more than 10,000 seeds")
        seeds.extend(range(lo, hi + 1))
    return list(dict.fromkeys(seeds))


@lru_cache(maxsize=8)
def _nodes(path: str) -> NodeTable:
    return load_nodes(path)


@lru_cache(maxsize=8)
def _pods(path: str) -> PodTable:
    return load_pods(path)


def execute(spec: RunSpec, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one spec in this process; the result row plus what plots need."""
    nodes, pods = _nodes(spec.nodes), _pods(spec.pods)
    if spec.mode == "mig":
        from finesched.sim.mig import run_mig_fill

        run = run_mig_fill(
            nodes, pods, spec.policy, spec.seed, share=spec.mig_share, product=spec.mig_product,
            mode=spec.mig_mode, inflation=spec.inflation,
        )  # fmt: skip
        return {"record": run.record()}
    target = metrics.target_workload(pods)
    common: dict[str, Any] = {
        "target": target,
        "progress": progress,
        "preemption": spec.preemption,
        "priorities": spec.priorities,
    }
    if spec.mode == "fill":
        run = run_fill(
            nodes, pods, spec.policy, spec.seed, spec.inflation, gpu_partitions=spec.gpu_partitions or None, **common
        )
        xs = list(range(CURVE_MAX + 1))
        curves = {
            "x": xs,
            "alloc": list(metrics.bin_at(run.arrived, run.alloc, xs).values()),
            "frag_amount": list(metrics.bin_at(run.arrived, run.frag_amount, xs).values()),
            "frag_ratio": list(metrics.bin_at(run.arrived, run.frag_ratio, xs).values()),
        }
        return {"record": run.record(), "curves": curves}
    defrag = None if spec.defragmentation is None else dict(spec.defragmentation)
    replay = run_replay(nodes, pods, spec.policy, spec.seed, spec.time_scale, defragmentation=defrag, **common)
    # The plot shows the arrival window (and a little after): long-running pods leave much later.
    shown = replay.times <= replay.last_arrival * 1.1 + 1.0
    times, alloc, queued = replay.times[shown], replay.alloc[shown], replay.queued[shown]
    step = max(1, len(times) // SERIES_POINTS)
    series = {"t": times[::step].tolist(), "alloc": alloc[::step].tolist(), "queued": queued[::step].tolist()}
    return {"record": replay.record(), "series": series, "delays": np.sort(replay.delays).tolist()}


def bounds(nodes_path: str, pods_path: str, seeds: Sequence[int], inflation: float) -> dict[str, dict[str, float]]:
    """Per seed, the LP upper bound (percent) at each report point, over the arrivals up to that demand."""
    nodes, pods = _nodes(nodes_path), _pods(pods_path)
    out: dict[str, dict[str, float]] = {}
    for seed in seeds:
        arrivals = inflate(pods, inflation, nodes.gpu_capacity_milli, np.random.default_rng(seed))
        arrived = metrics.percent(np.cumsum(arrivals.gpu_request_milli), nodes.gpu_capacity_milli)
        row = {}
        for point in metrics.REPORT_POINTS:
            count = int(np.searchsorted(arrived, point + 0.5))
            if count == 0 or arrived[-1] < point - 0.5:
                continue
            row[str(point)] = round(lp_bound(nodes, arrivals.take(np.arange(count))).percent, 4)
        out[str(seed)] = row
    return out


# Parallel execution --------------------------------------------------------------------------------------
_QUEUE: Any = None


def _init_worker(progress_queue: Any) -> None:
    global _QUEUE
    _QUEUE = progress_queue


def _worker(item: tuple[int, RunSpec]) -> tuple[int, dict[str, Any]]:
    index, spec = item

    def report(done: int, total: int) -> None:
        if _QUEUE is not None:
            _QUEUE.put((index, done / max(total, 1)))

    return index, execute(spec, report)


def run_all(
    specs: Sequence[RunSpec],
    jobs: int = 1,
    on_progress: OnProgress | None = None,
    on_start: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Execute `specs` (in order of the result list); `jobs` > 1 uses that many worker processes.

    `on_progress` gets the number of runs done so far, fractional (e.g. 3.4 of 10). `on_start` is
    called once the workers exist: start threads (a progress bar) there, not before, because the
    workers are forked and a fork must not copy a lock some other thread holds.
    """
    results: list[dict[str, Any] | None] = [None] * len(specs)
    fraction = [0.0] * len(specs)

    def tell() -> None:
        if on_progress is not None:
            on_progress(sum(fraction))

    if jobs <= 1 or len(specs) == 1:
        if on_start is not None:
            on_start()
        for i, spec in enumerate(specs):

            def local(done: int, total: int, i: int = i) -> None:
                fraction[i] = done / max(total, 1)
                tell()

            results[i] = execute(spec, local)
            fraction[i] = 1.0
            tell()
        return [r for r in results if r is not None]
    # fork: workers inherit the loaded modules and tables, and callers need no __main__ guard
    # (spawn and forkserver re-import the caller's main module).
    context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    progress_queue = context.Queue()
    with context.Pool(min(jobs, len(specs)), initializer=_init_worker, initargs=(progress_queue,)) as pool:
        if on_start is not None:
            on_start()
        pending = pool.imap_unordered(_worker, list(enumerate(specs)))
        remaining = len(specs)
        while remaining:
            try:
                index, result = pending.next(timeout=0.2)
            except mp.TimeoutError:
                pass
            else:
                results[index] = result
                fraction[index] = 1.0
                remaining -= 1
            _drain(progress_queue, fraction, results)
            tell()
    return [r for r in results if r is not None]


def _drain(progress_queue: Any, fraction: list[float], results: list[dict[str, Any] | None]) -> None:
    while True:
        try:
            index, value = progress_queue.get_nowait()
        except queue_mod.Empty:
            return
        if results[index] is None:
            fraction[index] = value
