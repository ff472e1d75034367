"""Runs a profile's plugins at each extension point (the Kubernetes framework runtime, vectorized).

It owns the rules no plugin may bend: pre_filter SKIP skips that plugin's filter; scores must be
int64 in [0, MAX_SCORE] after normalize (else `ScoreRangeError` names the plugin); weights
multiply and sum; a failed reserve unreserves every reserve plugin in reverse order.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import (
    MAX_SCORE,
    NO_LIMIT,
    SUCCESS,
    BoolArray,
    Code,
    Count,
    CountArray,
    ExtensionPoints,
    FilterPlugin,
    FilterResult,
    NodeBatch,
    NormalizeScorePlugin,
    Plugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ResourceOwner,
    ScoreArray,
    ScorePlugin,
    SelectPlugin,
    ShapeKeyPlugin,
    StateUser,
    Status,
)
from finesched.sched.fused import FusedEvaluator, FusingPlugin
from finesched.sched.profile import Profile
from finesched.sched.registry import Registry
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState

#: The class attribute a reserve/pre_bind plugin sets to True when its reserve, unreserve and
#: pre_bind do nothing in a cycle where its own pre_filter returned SKIP (`Framework.active`).
IDLE_WHEN_SKIPPED = "IDLE_WHEN_SKIPPED"


class ScoreRangeError(RuntimeError):
    """A score plugin returned values outside [0, MAX_SCORE] or not int64 (a plugin bug)."""


class PreFilterFailed(Exception):
    """A pre_filter plugin ended the cycle before any node was looked at."""

    def __init__(self, status: Status):
        self.status = status
        super().__init__(f"{status.plugin}: {status.message()}")


class Framework:
    """The plugins of one profile, grouped by extension point, bound to one ClusterState."""

    def __init__(self, profile: Profile, registry: Registry, state: ClusterState):
        self.profile = profile
        self.plugins: list[Plugin] = []
        self.points = ExtensionPoints()
        self.owners: list[ResourceOwner] = []
        # Protocol isinstance checks are slow; decide once which scorers normalize.
        self._normalizers: dict[str, NormalizeScorePlugin] = {}
        errors: list[ValidationError] = []
        for index, config in enumerate(profile.plugins):
            try:
                plugin = registry.create(config.name, config.args)
            except ValidationError as exc:
                errors.append(ValidationError([e.located("", f"plugins[{index}]") for e in exc.errors]))
                continue
            self._add(plugin, config.weight, index, errors)
            if "weight" in config.model_fields_set and not isinstance(plugin, ScorePlugin):
                # A weight only scales scores: on a filter it would be silently meaningless.
                errors.append(
                    ValidationError(
                        f"{plugin.NAME} does not score; a weight applies to score plugins only",
                        path=f"plugins[{index}].weight",
                        value=config.weight,
                    )
                )
        if errors:
            raise ValidationError([e.located(profile.source) for e in ValidationError.collect(errors).errors])
        for plugin in self.plugins:
            if isinstance(plugin, StateUser):
                plugin.attach(state)
        evaluated = [*self.points.filter, *(p for p, _ in self.points.score)]
        #: Whether filter/score results may be memoized per request shape (sched/memo.py).
        self.node_local = not self._normalizers and all(getattr(p, "NODE_LOCAL", False) for p in evaluated)
        #: Plugins whose verdicts also read something the request shape leaves out (the memo key adds it).
        self.shape_keys = [p for p in self.plugins if isinstance(p, ShapeKeyPlugin)]
        #: Reserve and pre_bind plugins that declare IDLE_WHEN_SKIPPED (see `active_reserve`).
        self._idle_when_skipped = frozenset(
            p.NAME for p in [*self.points.reserve, *self.points.pre_bind] if getattr(p, IDLE_WHEN_SKIPPED, False)
        )
        self._active: dict[frozenset[str], tuple[list[ReservePlugin], list[PreBindPlugin]]] = {}

    def _add(self, plugin: Plugin, weight: int, index: int, errors: list[ValidationError]) -> None:
        if any(p.NAME == plugin.NAME for p in self.plugins):
            errors.append(ValidationError("enabled twice", path=f"plugins[{index}].name", value=plugin.NAME))
            return
        self.plugins.append(plugin)
        points = self.points
        if isinstance(plugin, PreFilterPlugin):
            points.pre_filter.append(plugin)
        if isinstance(plugin, FilterPlugin):
            points.filter.append(plugin)
            if isinstance(plugin, Count):
                points.count.append(plugin)
        if isinstance(plugin, PreScorePlugin):
            points.pre_score.append(plugin)
        if isinstance(plugin, ScorePlugin):
            points.score.append((plugin, weight))
            if isinstance(plugin, NormalizeScorePlugin):
                self._normalizers[plugin.NAME] = plugin
        if isinstance(plugin, SelectPlugin):
            if points.select is not None:
                errors.append(
                    ValidationError(
                        f"only one select plugin per profile ({points.select.NAME} already)",
                        path=f"plugins[{index}].name",
                        value=plugin.NAME,
                    )
                )
            points.select = plugin
        if isinstance(plugin, ReservePlugin):
            points.reserve.append(plugin)
        if isinstance(plugin, PreBindPlugin):
            points.pre_bind.append(plugin)
        if isinstance(plugin, ResourceOwner):
            self.owners.append(plugin)
        if isinstance(plugin, PostFilterPlugin):
            if points.post_filter is not None:
                errors.append(
                    ValidationError(
                        f"only one post_filter plugin per profile ({points.post_filter.NAME} already)",
                        path=f"plugins[{index}].name",
                        value=plugin.NAME,
                    )
                )
            points.post_filter = plugin

    def fused(self, state: ClusterState) -> FusedEvaluator | None:
        """A fused filter and score path for this profile's plugins (sched/fused.py), or None."""
        points = self.points
        # A plugin whose fused path wraps another's (FUSES_OTHERS: DeviceShare's wraps ResourcesFit's) first.
        for plugin in sorted(self.plugins, key=lambda p: not getattr(p, "FUSES_OTHERS", False)):
            if isinstance(plugin, FusingPlugin):
                fused = plugin.fuse(state, points.filter, points.pre_score, points.score, bool(self._normalizers))
                if fused is not None:
                    return fused
        return None

    def owns(self, resource: str) -> bool:
        """Whether a plugin (not the scalar fit) owns this request name."""
        return any(owner.owns(resource) for owner in self.owners)

    # Points ----------------------------------------------------------------------------------------------
    def run_pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> set[str]:
        """Run every pre_filter; return the names of plugins that asked to skip their filter."""
        skipped: set[str] = set()
        for plugin in self.points.pre_filter:
            status = plugin.pre_filter(cycle, request, nodes)
            if status.code == Code.SKIP:
                skipped.add(plugin.NAME)
            elif not status.ok:
                raise PreFilterFailed(Status(status.code, status.reasons, plugin.NAME))
        cycle.skipped, cycle.plugins = skipped, None
        return skipped

    def run_filter(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, skipped: set[str]
    ) -> tuple[BoolArray, list[tuple[FilterPlugin, FilterResult]]]:
        """AND of every filter's mask (a fresh array), with each result kept for diagnosis."""
        results: list[tuple[FilterPlugin, FilterResult]] = []
        mask: BoolArray | None = None
        for plugin in self.points.filter:
            if plugin.NAME in skipped:
                continue
            result = plugin.filter(cycle, request, nodes)
            results.append((plugin, result))
            mask = result.mask.copy() if mask is None else np.logical_and(mask, result.mask, out=mask)
        return (np.ones(nodes.n, dtype=bool) if mask is None else mask), results

    def run_count(
        self,
        cycle: CycleState,
        request: ScheduleRequest,
        nodes: NodeBatch,
        feasible: BoolArray,
        skipped: set[str] | frozenset[str] = frozenset(),
    ) -> CountArray:
        """[n] int64: how many copies of `request` fit on each node of `nodes` as the state is now.

        Call it after `run_pre_filter` (same `cycle`; pass the `skipped` set it returned, as for
        `run_filter`) and `run_filter` (`feasible` is its mask over the same batch). The answer is
        the minimum over the filter plugins that implement `Count` and whose filter ran (a plugin
        skipped at pre_filter has nothing to count); 0 where `feasible` is False; `NO_LIMIT`
        (2**31 - 1) where no counting plugin limits the node (a profile without one, or a
        request that none of them is asked about). Filters without `count` put no limit beyond
        their mask, so the answer is exact only as far as the counting plugins are (each says
        where it is an upper bound).
        """
        out = np.full(nodes.n, NO_LIMIT, dtype=np.int64)
        for plugin in self.points.count:
            if plugin.NAME in skipped:
                continue
            np.minimum(out, plugin.count(cycle, request, nodes), out=out)
        np.maximum(out, 0, out=out)
        out[~feasible] = 0
        return out

    def run_pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> None:
        for plugin in self.points.pre_score:
            status = plugin.pre_score(cycle, request, nodes)
            if not status.ok:
                raise PreFilterFailed(Status(status.code, status.reasons, plugin.NAME))

    def run_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        """Weighted sum of every score plugin's checked scores ([n] int64; zeros without scorers).

        The result is a fresh array (callers may keep it); plugins' own arrays are never written.
        """
        total: ScoreArray | None = None
        fresh = False  # whether `total` is our own array (else a plugin's, which we must not write)
        normalizers = self._normalizers
        for plugin, weight in self.points.score:
            scores = plugin.score(cycle, request, nodes)
            if normalizers:
                normalizer = normalizers.get(plugin.NAME)
                if normalizer is not None:
                    scores = normalizer.normalize_score(cycle, request, nodes, scores)
            _check_range(plugin, scores, nodes.n)
            if weight == 0:
                continue
            weighted = scores if weight == 1 else scores * weight
            if total is None:
                total, fresh = weighted, weight != 1
            elif fresh:
                np.add(total, weighted, out=total)
            else:
                total, fresh = total + weighted, True
        if total is None:
            return np.zeros(nodes.n, dtype=np.int64)
        return total if fresh else total.copy()

    def active(self, skipped: set[str] | frozenset[str]) -> tuple[list[ReservePlugin], list[PreBindPlugin]]:
        """The reserve and pre_bind plugins a cycle runs, given the plugins its pre_filter skipped.

        A plugin that declares IDLE_WHEN_SKIPPED (its reserve, unreserve and pre_bind do nothing in
        a cycle where its pre_filter returned SKIP) is left out of such a cycle; every other plugin
        runs. SKIP alone does not say so (a plugin may skip its filter and still reserve, e.g.
        NUMA hints on BestEffort nodes), hence the explicit declaration."""
        idle = self._idle_when_skipped
        if not idle or idle.isdisjoint(skipped):
            return self.points.reserve, self.points.pre_bind
        key = idle.intersection(skipped)
        lists = self._active.get(key)
        if lists is None:
            lists = self._active[key] = (
                [p for p in self.points.reserve if p.NAME not in key],
                [p for p in self.points.pre_bind if p.NAME not in key],
            )
        return lists

    def _plugins_of(self, cycle: CycleState) -> tuple[list[ReservePlugin], list[PreBindPlugin]]:
        """`active(cycle.skipped)`, worked out once per cycle (reserve and pre_bind both ask)."""
        lists = cycle.plugins
        if lists is None:
            lists = cycle.plugins = self.active(cycle.skipped)
        return lists

    def run_reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        """Reserve on `node` with every plugin of the cycle (`active(cycle.skipped)`); on the first
        failure unreserve all in reverse."""
        for plugin in self._plugins_of(cycle)[0]:
            status = plugin.reserve(cycle, request, node)
            if not status.ok:
                self.run_unreserve(cycle, request, node)
                return Status(status.code, status.reasons, plugin.NAME)
        return SUCCESS

    def run_unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        for plugin in reversed(self._plugins_of(cycle)[0]):
            plugin.unreserve(cycle, request, node)

    def run_pre_bind(self, cycle: CycleState, request: ScheduleRequest, node: int, binding: Binding) -> Binding:
        for plugin in self._plugins_of(cycle)[1]:
            binding = plugin.pre_bind(cycle, request, node, binding)
        return binding

    def select(self) -> SelectPlugin | None:
        return self.points.select

    def names(self) -> Iterable[str]:
        return (p.NAME for p in self.plugins)


_INT64 = np.dtype(np.int64)  # comparing with a dtype instance skips converting the scalar type each time


def _check_range(plugin: Plugin, scores: ScoreArray, n: int) -> None:
    if not isinstance(scores, np.ndarray) or scores.dtype != _INT64 or scores.shape != (n,):
        shape = getattr(scores, "shape", None)
        dtype = getattr(scores, "dtype", type(scores).__name__)
        raise ScoreRangeError(
            f"plugin {plugin.NAME!r} returned scores of dtype {dtype} shape {shape}; want int64 [{n}]"
        )
    # One pass checks both bounds: a negative int64 viewed as uint64 is huge. (count_nonzero is a
    # plain C call; ndarray.any goes through Python-level dispatch, which dominates on small batches.)
    if n and np.count_nonzero(scores.view(np.uint64) > MAX_SCORE):
        raise ScoreRangeError(
            f"plugin {plugin.NAME!r} returned an invalid score in [{scores.min()}, {scores.max()}]; "
            f"scores must lie in [0, {MAX_SCORE}] after normalizing"
        )
