"""Why a workload fits nowhere: per-reason node counts, as the Kubernetes scheduler reports them.

``0/10000 nodes available: 9120 insufficient cpu, 880 node(s) didn't match node selector``.
Each rejected node is attributed to the first filter that rejected it; within that filter a
node may carry several reasons (k8s counts each). Nodes that passed every filter but failed the
exact reserve step are counted under the reserve plugin's reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from finesched.sched.framework import BoolArray, Code, FilterPlugin, FilterResult


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
    ):
        self.workload = workload
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
) -> FitError:
    """Build the FitError for a cycle where no node passed (or every reserve failed)."""
    counts: Counter[str] = Counter()
    pending: BoolArray = np.ones(n, dtype=bool)  # nodes not yet attributed to a filter
    unresolvable_all = n > 0
    for plugin, result in results:
        rejected = pending & ~result.mask
        if not rejected.any():
            continue
        pending &= result.mask
        explanation = result.explain() if result.explain is not None else {}
        covered = np.zeros(n, dtype=bool)
        resolvable = np.zeros(n, dtype=bool)
        for reason, (mask, code) in explanation.items():
            hit = rejected & mask
            if hit.any():
                counts[reason] += int(hit.sum())
                covered |= hit
                if code != Code.UNRESOLVABLE:
                    resolvable |= hit
        rest = rejected & ~covered
        if rest.any():
            counts[f"rejected by {plugin.NAME}"] += int(rest.sum())
            resolvable |= rest
        if resolvable.any():
            unresolvable_all = False
    for reason, count in (reserve_failures or {}).items():
        counts[reason] += count
        unresolvable_all = False
    return FitError(workload, n, counts, unresolvable=unresolvable_all)
