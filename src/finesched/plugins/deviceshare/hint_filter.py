"""The DeviceShare filter's deviceAllocateHint checks over many nodes (hints.py says what a hint means).

A hint's verdict depends on device labels, exclusivity and scopes, which the vectorized fit counts
do not see, so it is taken per node in Python: over all nodes through the accounts' per-node cache
(first call O(N), then only changed nodes), or directly on a subset batch. Requests without hints
never reach this module. A joint request with a hinted type asks the exact allocator itself, so
the filter never passes a node the offer then fails on. A hint reason is unresolvable on a node
whose devices could not serve the hint even idle and healthy (e.g. no device matches the selector).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.plugins.deviceshare.allocator import InsufficientDevices, allocate_devices
from finesched.plugins.deviceshare.hints import Labels, device_labels, hint_problem
from finesched.plugins.deviceshare.request import DeviceRequest, FitRule, TypeRequest, fit_mask
from finesched.sched.framework import Code
from finesched.state.cluster import ClusterState
from finesched.state.devices import DeviceAccounts

BoolArray = npt.NDArray[np.bool_]
Reasons = dict[str, tuple[BoolArray, Code | BoolArray]]


class HintChecks:
    """Per-node hint verdicts for one attached state (DeviceShare holds one per `attach`)."""

    def __init__(self, accounts: DeviceAccounts, state: ClusterState, strategy: str):
        self.accounts, self.state, self.strategy = accounts, state, strategy

    def labels_of(self, node: int, kind: str) -> Labels:
        """Node `node`'s device labels of `kind` in slot order (what hint selectors read)."""
        return device_labels(self.state.nodes[node], kind)

    def hint_labels(self, dreq: DeviceRequest, node: int) -> tuple[tuple[str, Labels], ...] | None:
        """Device labels of the types whose hint has a selector, hashable (part of the offer memo key);
        None without one, so hint-less requests read no labels and their memo key is as before."""
        kinds = [k for k, tr in dreq.types.items() if tr.hint is not None and tr.hint.selector is not None]
        return tuple((k, self.labels_of(node, k)) for k in kinds) or None

    def problem(self, tr: TypeRequest, rule: FitRule, node: int, idle: bool = False) -> str | None:
        """hints.py's verdict for one hinted type on one node (the allocator reaches the same one);
        with `idle`, the verdict were every device of the node healthy and unused."""
        nd = self.accounts.node_devices(node, tr.type, copy=False)
        if nd is not None and idle:
            nd = replace(nd, free=nd.total, healthy=np.ones(len(nd), dtype=bool))
        fits = None if nd is None else fit_mask(rule, nd.free, nd.total, nd.healthy)
        return hint_problem(nd, tr, self.labels_of(node, tr.type) if nd is not None else (), fits)

    def joint_problem(self, dreq: DeviceRequest, node: int) -> str | None:
        """The exact allocator's verdict for a joint request with hints on one node (None: it can serve).

        The card-level strategy only orders equally valid sets, so the node's stands in for the
        workload's.
        """
        devices = {kind: self.accounts.node_devices(node, kind, copy=False) for kind in dreq.types}
        labels = dict(self.hint_labels(dreq, node) or ())
        strategy = self.accounts.strategy_of(node) or self.strategy
        try:
            allocate_devices(devices, dreq, strategy=strategy, labels=labels)
        except InsufficientDevices as exc:
            return exc.reason
        return None

    def _mask(self, key: Hashable, verdict: Callable[[int], str | None], n: int, index: Any) -> BoolArray:
        def compute(rows: Any) -> tuple[np.ndarray, ...]:
            ids = range(rows.start or 0, rows.stop) if isinstance(rows, slice) else rows.tolist()
            return (np.fromiter((verdict(i) is None for i in ids), dtype=bool, count=len(ids)),)

        if index is not None:
            return compute(index)[0]
        return self.accounts.cached(key, compute, n)[0]

    def type_ok(self, tr: TypeRequest, rule: FitRule, n: int, index: Any) -> BoolArray:
        """[batch] nodes where the hinted type can be served (all n nodes, cached, or `index`)."""
        return self._mask(("hint", tr, rule), lambda i: self.problem(tr, rule, i), n, index)

    def joint_ok(self, dreq: DeviceRequest, key: Hashable, n: int, index: Any) -> BoolArray:
        """[batch] nodes where the joint request with hints can be served; `key` names the request."""
        return self._mask(("joint-hint", key, dreq.joint), lambda i: self.joint_problem(dreq, i), n, index)

    def explain(
        self,
        dreq: DeviceRequest,
        rules: Iterable[tuple[TypeRequest, FitRule | None]],
        node_ids: list[int],
        per_type_ok: BoolArray,
        mask: BoolArray,
        out: Reasons,
    ) -> None:
        """Add the hint reasons of the nodes the counts passed (`per_type_ok`, updated) to `out`."""

        own: set[str] = set()  # reasons whose arrays this call made (others' arrays may be shared)

        def add(reason: str, row: int, never: bool) -> None:
            if reason not in own:
                n = len(node_ids)
                hit, code = out.get(reason, (np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)))
                out[reason] = (hit.copy(), code.copy() if isinstance(code, np.ndarray) else code)
                own.add(reason)
            hit, code = out[reason]
            hit[row] = True
            if isinstance(code, np.ndarray):
                code[row] = never
            per_type_ok[row] = False

        for tr, rule in rules:
            if tr.hint is None or rule is None:
                continue
            for row, node in enumerate(node_ids):
                if per_type_ok[row] and (problem := self.problem(tr, rule, node)) is not None:
                    add(problem, row, self.problem(tr, rule, node, idle=True) is not None)
        joint = dreq.joint
        if joint is not None and any(dreq.types[t].hint is not None for t in joint.types):
            for row, node in enumerate(node_ids):
                if per_type_ok[row] and not mask[row]:
                    add(self.joint_problem(dreq, node) or "no joint allocation fits", row, False)
