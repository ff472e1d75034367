"""The fused scalar decision path (sched/fused.py): filter and score without the plugin round trip.

ResourcesFit offers it (`ResourcesFit.fuse`). For the common case -- a scalar request under a profile
whose active filters are ResourcesFit, NodeUnschedulable (and any label filter, run as is) and
whose scorers are the share scorers of plugins/scoring.py -- `FusedScalar.evaluate` computes the
same mask and, on every feasible node, the same total: the same numpy operations in the same order,
or (two share classes, `_total_two`) fewer ones that are exact identities in IEEE arithmetic, so
the decision is bit for bit the generic one (tests/test_fused_scalar.py holds the two equal on
random clusters).

Anything it does not cover goes the generic way: `FusedScalar.build` returns None for a profile
with other scorers, a score normalizer or a pre_score plugin it does not know, and `path` answers
None per cycle while a filter or pre_score plugin it cannot stand in for is active (devices,
CPU pinning, NUMA, a request for a resource no node offers). When no node is feasible the caller
re-runs the generic filters for the diagnosis (FitError reasons), which only the plugins can word.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from finesched.plugins.node_unschedulable import UNSCHEDULABLE_LABEL, NodeUnschedulable
from finesched.plugins.scoring import _EPS, _ShareScorer, least_requested, most_allocated, most_balanced
from finesched.plugins.shares import Shares
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import (
    MAX_SCORE,
    BoolArray,
    FilterPlugin,
    NodeBatch,
    PreScorePlugin,
    ScoreArray,
    ScorePlugin,
)
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState

#: The score functions the fused path evaluates itself, by the plugin class attribute they sit in.
_FUSABLE_SCORES = (least_requested, most_allocated, most_balanced)
#: pre_score plugins that add nothing in a cycle where their own pre_filter asked to be skipped
#: (DeviceShare publishes device shares only for a device request, which it skips without).
_QUIET_WHEN_SKIPPED = frozenset({"DeviceShare"})
#: Filters the fused path runs unchanged (label and tenant masks: a cached mask and a gather, read
#: nothing pre_score writes); any other filter must have skipped at pre_filter.
_AS_IS = frozenset({"NodeSelector", "TenantIsolation"})
#: The float constants of the score passes as 0-d float64 arrays: the same values the Python
#: numbers convert to (MAX_SCORE, MAX_SCORE // 2, MAX_SCORE + _EPS, _EPS are exact or rounded once
#: either way), but a ufunc takes an array operand without converting a Python scalar each call,
#: which on a memo patch of ~100 nodes costs as much as the arithmetic.
_MAX_F = np.array(float(MAX_SCORE))
_HALF_MAX_F = np.array(float(MAX_SCORE // 2))
_TOP_F = np.array(MAX_SCORE + _EPS)
_EPS_F = np.array(_EPS)
#: Empty operands of the compiled patch (plugins/fused_kernel.py): "no such mask / no ranks".
_NO_MASK = np.zeros(0, dtype=bool)
#: The score constants as Python floats for the kernel: the values the 0-d arrays above hold.
_TOP, _MAX, _HALF_MAX = MAX_SCORE + _EPS, float(MAX_SCORE), float(MAX_SCORE // 2)
_NO_RANKS = np.zeros(0, dtype=np.int64)
#: The compiled patch kernel once imported; None: not loaded (yet), False: numba is not available.
_KERNEL: Callable[..., int] | bool | None = None
_LOADER: threading.Thread | None = None
#: Numpy patches before the kernel is loaded (see `_kernel_ready`), and how many there were so far:
#: the load's cost in patches it saves (~0.45 s / ~10 us), the ski-rental rule -- a process then
#: spends at most twice what the better choice for its lifetime would have (no kernel for a short
#: run, the kernel from the start for a long one).
KERNEL_AFTER_PATCHES = 40_000
_PATCHES = 0


def _load_kernel() -> None:
    global _KERNEL
    try:
        from finesched.plugins.fused_kernel import patch_two
    except Exception:  # numba missing or broken on this platform: the numpy passes decide the same
        _KERNEL = False
    else:
        _KERNEL = patch_two


def _start_loading() -> None:
    global _LOADER
    _LOADER = threading.Thread(target=_load_kernel, name="finesched-fused-kernel", daemon=True)
    _LOADER.start()


def _kernel_ready() -> bool:
    """Whether plugins/fused_kernel.py's `patch_two` is loaded; counts the calls until it is and
    starts its load after `KERNEL_AFTER_PATCHES` of them (one per memoized fused decision).

    Loading costs ~0.45 s of CPU (numba's import and its target context, which imports
    scipy.linalg) and ~120 MiB of RSS (LLVM) with the compiled code in numba's on-disk cache,
    ~0.9 s when it compiles (the first run after an install), while the kernel saves ~10 us per
    patch. So the load waits until the process has patched that many times with numpy (a short
    run, the CLI, the tests never pay it; a server's start-up never imports numba) and then runs
    on a background thread, so no decision stalls on it; until it is done the numpy passes patch
    (the same results, bit for bit). `wait_for_kernel` loads it at once (a benchmark's steady state)."""
    global _PATCHES
    if _KERNEL is None:
        if _LOADER is None:
            _PATCHES += 1
            if _PATCHES >= KERNEL_AFTER_PATCHES:
                _start_loading()
        return False
    return _KERNEL is not False


def wait_for_kernel() -> bool:
    """Load the compiled patch kernel now (or wait for the background load); whether it is usable."""
    if _KERNEL is None and _LOADER is None:
        _start_loading()
    if _LOADER is not None:
        _LOADER.join()
    return bool(_KERNEL)


def share_scorers(
    score: Sequence[tuple[ScorePlugin, int]],
) -> list[tuple[Callable[[Shares, int], ScoreArray], int]] | None:
    """The (score function, weight) of each score plugin when every one is a share scorer of
    plugins/scoring.py a fused path evaluates itself; None when any is not."""
    scorers = []
    for plugin, weight in score:
        function = getattr(type(plugin), "FUNCTION", None)
        if function not in _FUSABLE_SCORES or type(plugin).score is not _ShareScorer.score:  # type: ignore[attr-defined]
            return None
        scorers.append((function, weight))
    return scorers


class FusedScalar:
    """The fused filter and score of one profile's plugins (see the module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        others: Sequence[FilterPlugin],
        must_skip: frozenset[str],
        scorers: Sequence[tuple[Callable[[Shares, int], ScoreArray], int]],
        unschedulable: bool,
        fit: bool,
    ):
        self._state = state
        #: Filters run as they are (label filters: a cached mask and a gather, nothing to fuse).
        self._others = tuple(others)
        #: Plugins (filter or pre_score) that must have skipped at pre_filter for the path to apply.
        self._must_skip = must_skip
        self._scorers = tuple((f, w) for f, w in scorers if w != 0)
        functions = {f for f, _ in self._scorers}
        self._needs_mean = least_requested in functions or most_allocated in functions
        self._needs_variance = most_balanced in functions
        self._unschedulable = unschedulable
        self._fit = fit
        self._marked: BoolArray | None = None
        self._marked_version = (-1, -1)
        #: Whether `patch` may use the compiled kernel (tests turn it off to compare the two).
        self.use_kernel = fit
        codes = {most_balanced: 0, least_requested: 1, most_allocated: 2}  # fused_kernel's codes
        self._codes = np.array([codes[f] for f, _ in self._scorers], dtype=np.int64)
        self._weights = np.array([w for _, w in self._scorers], dtype=np.int64)

    @classmethod
    def build(
        cls,
        state: ClusterState,
        filters: Sequence[FilterPlugin],
        pre_score: Sequence[PreScorePlugin],
        score: Sequence[tuple[ScorePlugin, int]],
        normalizing: bool,
    ) -> FusedScalar | None:
        """The fused path for these plugins, or None when the profile needs the generic one."""
        scorers = share_scorers(score)
        if normalizing or scorers is None:
            return None
        must_skip: set[str] = set()
        fit = any(p.NAME == "ResourcesFit" for p in filters)
        for plugin in pre_score:
            if plugin.NAME == "ResourcesFit":
                continue
            name = getattr(plugin, "NAME", "")
            if name not in _QUIET_WHEN_SKIPPED:
                return None
            must_skip.add(name)
        if not fit and scorers:
            return None  # the share scorers read what ResourcesFit's pre_score publishes
        others: list[FilterPlugin] = []
        for plugin in filters:
            if plugin.NAME == "ResourcesFit" or isinstance(plugin, NodeUnschedulable):
                continue
            if plugin.NAME in _AS_IS:
                others.append(plugin)
            else:
                must_skip.add(plugin.NAME)
        unschedulable = any(isinstance(p, NodeUnschedulable) for p in filters)
        return cls(state, others, frozenset(must_skip), scorers, unschedulable, fit)

    def path(self, request: ScheduleRequest, skipped: set[str]) -> FusedScalar | None:
        """This path when the cycle may take it (pre_filter has run; `skipped` is its answer), else None."""
        return self if not request.unknown and self._must_skip <= skipped else None

    def evaluate(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, skipped: set[str]
    ) -> tuple[BoolArray, ScoreArray]:
        """The feasibility mask and weighted score total of `nodes` (what run_filter and run_score
        return). The total is exact on the feasible nodes; elsewhere it is whatever the arithmetic
        gives (the scheduler's key is -1 there)."""
        state = self._state
        index = nodes.index
        if index is None:
            n = state.n
            mask = self._fit_all(request, n) if self._fit else np.ones(n, dtype=bool)
            if self._unschedulable:
                mask &= self._schedulable(n)
        else:
            n = len(index)
            floor = request.floor
            if self._fit and floor is not None and len(floor) == len(state.resources):
                mask = np.logical_and.reduce(state.free_at(index) >= floor, axis=0)
            elif self._fit:
                mask = self._fit_all(request, state.n)[index]
            else:
                mask = np.ones(n, dtype=bool)
            if self._unschedulable:
                mask &= self._schedulable(state.n)[index]
        for plugin in self._others:
            if plugin.NAME not in skipped:
                mask &= plugin.filter(cycle, request, nodes).mask
        return mask, self._total(request, index, n)

    def patchable(self, request: ScheduleRequest, skipped: set[str]) -> bool:
        """Whether `patch` may take this request: the kernel is loaded and the request is of the two
        share classes with floor and share rows for every resource (decided before the memo lookup,
        which then hands out the change log with repeats: the kernel's count is exact with them)."""
        if not self.use_kernel or not _kernel_ready() or len(request.share_pairs) != 2:
            return False
        rows = len(self._state.resources)
        floor, add = request.floor, request.share_add
        return floor is not None and len(floor) == rows and add is not None and len(add) == rows

    def patch(
        self,
        cycle: CycleState,
        request: ScheduleRequest,
        nodes: NodeBatch,
        skipped: set[str],
        feasible: BoolArray,
        key: ScoreArray,
        ranks: npt.NDArray[np.int64] | None,
    ) -> int | None:
        """Write the mask and selection key of the nodes `nodes.index` (may repeat) into a memo
        entry's `feasible` and `key` in one compiled pass; return the change of its feasible count,
        or None (nothing written) when an operand does not fit the kernel's signature: the caller then
        runs `evaluate`. Same values as `evaluate` and the scheduler's key (`ranks`: the seeded
        tie-break ranks). Only after `patchable` said yes (the kernel is loaded)."""
        kernel = _KERNEL
        assert callable(kernel)
        state = self._state
        index = nodes.index
        assert index is not None
        if index.flags.writeable:  # the kernel's signature takes the change log's read-only view
            index = index.view()
            index.flags.writeable = False
        allow: BoolArray | None = None
        for plugin in self._others:
            if plugin.NAME not in skipped:
                mask = plugin.filter(cycle, request, nodes).mask
                allow = mask if allow is None else allow & mask
        (r0, _), (r1, _) = request.share_pairs
        free, used, inv = state.column_buffers()
        try:
            return kernel(
                index, free, request.floor, used, request.share_add, inv, r0, r1, self._codes, self._weights,
                _TOP, _MAX, _HALF_MAX, _EPS,
                self._schedulable(state.n) if self._unschedulable else _NO_MASK,
                _NO_MASK if allow is None else allow, _NO_RANKS if ranks is None else ranks, state.n, feasible, key,
            )  # fmt: skip
        except TypeError:  # an operand of another layout or type (e.g. a non-contiguous entry array)
            return None

    def _fit_all(self, request: ScheduleRequest, n: int) -> BoolArray:
        free = self._state.free
        pairs = request.pairs
        r, amount = pairs[0]
        mask = free[r] >= amount
        for r, amount in pairs[1:]:
            mask &= free[r] >= amount
        return mask

    def _schedulable(self, n: int) -> BoolArray:
        """[n] NodeUnschedulable's mask: False on nodes labelled unschedulable. Labels change only
        with the node set (`nodes_version`, which the score memo relies on as well)."""
        version = (self._state.nodes_version, n)
        if self._marked is None or self._marked_version != version:
            self._marked = ~self._state.labels.has_key(UNSCHEDULABLE_LABEL, n)
            self._marked_version = version
        return self._marked

    def _total(self, request: ScheduleRequest, index: npt.NDArray[np.intp] | None, n: int) -> ScoreArray:
        """The weighted sum of the share scorers, with ResourcesFit's pre_score shares (same operations)."""
        scorers = self._scorers
        if not scorers:
            return np.zeros(n, dtype=np.int64)
        state = self._state
        share_pairs = request.share_pairs
        arrays: list[npt.NDArray[np.float64]] = []
        if self._fit and len(share_pairs) == 2:
            (r0, amount0), (r1, amount1) = share_pairs
            if index is None:
                used, inv = state.used_float, state.inv_allocatable
                a0 = used[r0] + float(amount0)
                np.multiply(a0, inv[r0], out=a0)
                a1 = used[r1] + float(amount1)
                np.multiply(a1, inv[r1], out=a1)
                return self._total_two(a0, a1)
            add = request.share_add
            if add is not None and len(add) == len(state.resources):
                block = state.used_float_at(index)  # ResourcesFit.pre_score's subset arithmetic
                block += add
                block *= state.inv_allocatable_at(index)
                return self._total_two(block[r0], block[r1])
        if self._fit:
            if index is None:
                used, inv = state.used_float, state.inv_allocatable
                for r, amount in share_pairs:
                    share = used[r] + float(amount)
                    arrays.append(np.multiply(share, inv[r], out=share))
            elif share_pairs and request.share_add is not None and len(request.share_add) == len(state.resources):
                block = state.used_float_at(index)
                block += request.share_add
                block *= state.inv_allocatable_at(index)
                arrays = [block[r] for r, _ in share_pairs]
            else:
                used, inv = state.used_float, state.inv_allocatable
                for r, amount in share_pairs:
                    share = used[r][index] + float(amount)
                    arrays.append(np.multiply(share, inv[r][index], out=share))
        shares = Shares(n, arrays)
        total: ScoreArray | None = None
        for function, weight in scorers:
            scores = function(shares, n)
            if weight != 1:
                scores = scores * weight
            total = scores if total is None else np.add(total, scores, out=total)
        assert total is not None
        return total

    def _total_two(self, a0: npt.NDArray[np.float64], a1: npt.NDArray[np.float64]) -> ScoreArray:
        """`_total` for two share classes (cpu and memory, the usual request): `a0`, `a1` are the
        shares (this cycle's own arrays, overwritten here).

        The values of Shares.mean / Shares.variance and the score functions of plugins/scoring.py,
        with fewer passes over the nodes (over 100,000 nodes each pass is a megabyte), every
        shortcut exact in IEEE double arithmetic (round to nearest, no overflow, no subnormals:
        shares lie in [0, ~1]):

        * ``100 * ((a + b) * 0.5) == 50 * (a + b)``: the halving is exact, so both round the
          same real number once;
        * ``400 * (((a - b) * 0.5) ** 2) == 100 * ((a - b) ** 2)``: halving and quartering are
          exact scalings, which commute with rounding;
        * no clamping to [0, MAX_SCORE]: on a feasible node every share is at most 1 (give or
          take one rounding of 1/allocatable, far below the 1e-9 epsilon), so every score
          already lies in range; infeasible nodes get the key -1 whatever their total.
        """
        twice_mean = square_diff = None
        if self._needs_mean:
            twice_mean = a0 + a1
        if self._needs_variance:
            np.subtract(a0, a1, out=a0)
            square_diff = np.multiply(a0, a0, out=a0)
        buf = a1  # no longer needed: a scratch buffer for each scorer's float values
        total: ScoreArray | None = None
        for function, weight in self._scorers:
            if function is most_balanced:
                np.multiply(square_diff, _MAX_F, out=buf)
                np.subtract(_TOP_F, buf, out=buf)
            elif function is least_requested:
                np.multiply(twice_mean, _HALF_MAX_F, out=buf)
                np.subtract(_TOP_F, buf, out=buf)
            else:  # most_allocated
                np.multiply(twice_mean, _HALF_MAX_F, out=buf)
                np.add(buf, _EPS_F, out=buf)
            scores = buf.astype(np.int64)  # _to_score's truncation
            if weight != 1:
                scores *= weight
            total = scores if total is None else np.add(total, scores, out=total)
        assert total is not None
        return total
