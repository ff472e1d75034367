"""Why a workload fits nowhere: per-reason node counts, as the Kubernetes scheduler reports them.

``0/3 nodes available: 3 insufficient cpu, 3 insufficient nvidia.com/gpu, 2 insufficient memory``.
Every reason of every filter that rejected a node is counted on that node: a node short of CPU,
memory and GPUs counts under all three, whichever filter saw which (kube-scheduler's
NodeResourcesFit reports every insufficient resource of a node). The filters themselves stop
nothing: each runs vectorized over all nodes, so their verdicts are all at hand; only the
explanations (`FilterResult.explain`) are computed here, on the failing path. Nodes that passed
every filter but failed the exact reserve step are counted under the reserve plugin's reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from finesched.sched.framework import BoolArray, FilterPlugin, FilterResult, unresolvable_where


class FitError(Exception):
    """No node can take the workload. `reasons` maps reason -> number of nodes it applies to."""

    def __init__(
        self,
        workload: str,
        total_nodes: int,
        reasons: Mapping[str, int],
        *,
        unresolvable: bool = False,
        detail: str = "",
        no_node_passed: bool = False,
    ):
        self.workload = workload
        #: Raised because no node passed the filters: nothing after filtering ran (no scoring, no
        #: seeded draws, no reserve), so the same state and request give the same error again.
        self.no_node_passed = no_node_passed
        self.total_nodes = total_nodes
        self.reasons = dict(reasons)
        self.unresolvable = unresolvable
        self.detail = detail
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self.detail:
            return self.detail
        ordered = sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = ", ".join(f"{count} {reason}" for reason, count in ordered)
        return f"0/{self.total_nodes} nodes available: {parts}" if parts else f"0/{self.total_nodes} nodes available"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self.workload, self.total_nodes, self.reasons, self.unresolvable, self.detail))

    def detached(self) -> FitError:
        """This error without its traceback and chained exceptions, to be kept (a parked unit's last
        error). A caught exception holds every frame it was raised through, with their locals (the
        decision's requests, cycle state and per-node arrays: about 4 KB a workload), and a cycle
        through the frame that caught it, which only the cyclic collector frees. Kept for every unit
        of a flood that fits nowhere, that was most of the server's memory (BENCHMARKS.md)."""
        self.__traceback__ = None
        self.__context__ = None
        self.__cause__ = None
        return self


def _rebuild(workload: str, total: int, reasons: dict[str, int], unresolvable: bool, detail: str) -> FitError:
    return FitError(workload, total, reasons, unresolvable=unresolvable, detail=detail)


def gang_fit_error(gang: str, exc: FitError, outcome: str) -> FitError:
    """The FitError of a gang one of whose members does not fit (`outcome`: what was undone)."""
    return FitError(
        exc.workload,
        exc.total_nodes,
        exc.reasons,
        unresolvable=exc.unresolvable,
        detail=f"gang {gang}: member {exc.workload} does not fit ({exc.message}); {outcome}",
    )


class QuotaWait(FitError):
    """The workload waits because its tenant is at its quota (it is not failed)."""


class InvalidRequest(FitError):
    """The workload's own request is invalid (a plugin's pre_filter error): no node is ever tried.

    `schedule_one` raises the ValidationError itself; `schedule_batch` and `run` report it in
    place of the workload's result so one bad workload does not stop the others. Unresolvable:
    the workload is not retried until it is fixed and submitted again.
    """

    def __init__(self, workload: str, total_nodes: int, problem: str):
        super().__init__(workload, total_nodes, {}, unresolvable=True, detail=f"invalid request: {problem}")


def diagnose(
    workload: str,
    n: int,
    results: Sequence[tuple[FilterPlugin, FilterResult]],
    reserve_failures: Mapping[str, int] | None = None,
    *,
    no_node_passed: bool = False,
) -> FitError:
    """Build the FitError for a cycle where no node passed (or every reserve failed).

    Unresolvable when every node is (`unresolvable_nodes`) and no reserve failed: then no
    eviction anywhere could make the workload fit.
    """
    counts: Counter[str] = Counter()
    explained: list[tuple[BoolArray, Mapping]] = []
    for plugin, result in results:
        rejected = ~result.mask
        if not rejected.any():
            continue
        explanation = result.explain() if result.explain is not None else {}
        explained.append((rejected, explanation))
        covered = np.zeros(n, dtype=bool)
        for reason, (mask, _code) in explanation.items():
            hit = rejected & mask
            if hit.any():
                counts[reason] += int(hit.sum())
                covered |= hit
        rest = rejected & ~covered
        if rest.any():
            counts[f"rejected by {plugin.NAME}"] += int(rest.sum())
    for reason, count in (reserve_failures or {}).items():
        counts[reason] += count
    unresolvable_all = n > 0 and not reserve_failures and bool(_unresolvable(explained, n).all())
    return FitError(workload, n, counts, unresolvable=unresolvable_all, no_node_passed=no_node_passed)


def unresolvable_nodes(results: Sequence[tuple[FilterPlugin, FilterResult]], n: int) -> BoolArray:
    """[n] True where a filter rejects the node for a reason that is UNRESOLVABLE on it.

    Such a node could not fit the workload even with every workload on it gone (one condition no
    eviction can change is enough, as kube-scheduler's Fit returns UnschedulableAndUnresolvable
    when any insufficient resource is), so preemption skips it and the Kubernetes extender
    reports it in FailedAndUnresolvableNodes. The answer for a node reads only that node's
    verdicts (explanation codes are per node) and only conditions of the node itself, so adding
    or changing another node, or binding and releasing workloads, never changes it. A rejection
    without reasons counts as resolvable.
    """
    explained = []
    for _plugin, result in results:
        rejected = ~result.mask
        if rejected.any():
            explained.append((rejected, result.explain() if result.explain is not None else {}))
    return _unresolvable(explained, n)


def _unresolvable(explained: Sequence[tuple[BoolArray, Mapping]], n: int) -> BoolArray:
    out = np.zeros(n, dtype=bool)
    for rejected, explanation in explained:
        for mask, code in explanation.values():
            out |= rejected & mask & unresolvable_where(code, n)
    return out
