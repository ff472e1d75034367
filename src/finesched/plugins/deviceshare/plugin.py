"""DeviceShare: the device plugin's extension points (S0.3, S0.5, S1.2-S1.8). The work lives in
request.py (normalization, fit rule), allocator.py (exact choice), scoring.py (shares) and
state/devices.py (accounts); this file only wires them into the cycle:

* pre_filter: normalize the request once (`DEVICE_REQUEST`, memoized per distinct request); a
  bad request is the user's error (ERROR, never retried);
* filter: per type, the count of healthy devices fitting one instance >= count, from the
  accounts' incremental cache over all nodes (O(N) per full batch), or evaluated directly on a
  subset batch; then the joint scope. NODE_LOCAL: the scheduler's per-shape memo re-runs it on
  changed nodes only;
* pre_score: publish device shares (LeastRequested / MostBalanced / DeviceScore read them);
* reserve: the exact offer on the candidate node, computed once, kept under "DeviceShare/offers";
* pre_bind: the binding gets the offer's grants and the device-allocated annotation.

MIG instances (mig.py, counters in state/mig_slices.py) and GPU partition tables (partitions.py,
tables in state/gpu_partitions.py) join each point through their own module. ``nvidia.com/mig-*``
names belong to this plugin once a node has a MIG GPU (before that they stay scalar resources, as
a device plugin's advertised counts).

Card-level strategy (S0.5), first set wins: the workload's deviceAllocateStrategy, the node's
(policies or label `STRATEGY_LABEL`), this plugin's ``strategy`` arg — MostAllocated in the
built-in ``binpack`` profile, LeastAllocated (the default) in ``default``, ``spread`` and ``buckets``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar, TypeVar

import numpy as np

from finesched.hashed import HashedOnce
from finesched.model.base import fast_copy
from finesched.model.binding import Binding
from finesched.model.device_allocated import DEVICE_ALLOCATED
from finesched.model.mig import mig_profile_of
from finesched.model.resources import GPU
from finesched.model.workload import Workload
from finesched.plugins.deviceshare.allocator import DeviceAllocation, InsufficientDevices, allocate_devices
from finesched.plugins.deviceshare.count import mig_copies, partition_copies, type_copies
from finesched.plugins.deviceshare.hint_filter import HintChecks
from finesched.plugins.deviceshare.hints import Labels
from finesched.plugins.deviceshare.mig import choose_mig, explain_mig, mig_grants, mig_mask, mig_request, mig_share
from finesched.plugins.deviceshare.partitions import (
    PartitionRule,
    explain_partitions,
    partition_mask,
    partition_request,
    rule_for,
)
from finesched.plugins.deviceshare.request import (
    DeviceRequest,
    FitRule,
    InvalidDeviceRequest,
    TypeRequest,
    compile_rule,
    device_resource,
    explain_type,
    fit_mask,
    normalize_device_request,
)
from finesched.plugins.deviceshare.scoring import DEVICE_SHARES, DeviceShares, device_shares, strategy_arg
from finesched.plugins.shared_keys import DEVICE_CHOOSER, NUMA_AFFINITY, NUMAAffinity
from finesched.plugins.shares import add_shares
from finesched.sched.cycle_state import CycleState, MissingState, StateKey
from finesched.sched.framework import (
    NO_LIMIT,
    SKIP,
    SUCCESS,
    BoolArray,
    Code,
    CountArray,
    Explanation,
    FilterPlugin,
    FilterResult,
    NodeBatch,
    PreScorePlugin,
    ScorePlugin,
    Status,
)
from finesched.sched.fused import FusedEvaluator
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState
from finesched.state.devices import DeviceAccounts, attach_device_accounts, node_rows
from finesched.state.gpu_partitions import PartitionTables, attach_partition_tables
from finesched.state.mig_slices import MIGSlices, attach_mig_slices

DEVICE_REQUEST = StateKey("DeviceShare/request", DeviceRequest)


class DeviceOffers:
    """The exact offer per node index tried this cycle (reserve writes, pre_bind reads)."""

    __slots__ = ("by_node",)

    def __init__(self) -> None:
        self.by_node: dict[int, DeviceAllocation] = {}


DEVICE_OFFERS = StateKey("DeviceShare/offers", DeviceOffers)


@dataclass(frozen=True, slots=True)
class _Rules(HashedOnce):
    """Each requested type with its fit rule against the type's dimensions (None: no node has the type)."""

    items: tuple[tuple[TypeRequest, FitRule | None], ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    __hash__ = HashedOnce.__hash__  # part of the offer memo's key: hashed once (finesched/hashed.py)


_RULES = StateKey("DeviceShare/rules", _Rules)
#: A workload's normalized request and rules, its invalid-request error, or None (asks no device).
_Prepared = tuple[DeviceRequest, _Rules] | InvalidDeviceRequest | None
_NORMALIZED_CACHE = 512
_OFFERS_CACHE = 4096
_MISSING = object()
E = TypeVar("E")


def _attached(extra: E | None) -> E:
    if extra is None:
        raise MissingState("DeviceShare: not attached to a ClusterState")
    return extra


class DeviceShare:
    """Fractional and multi-device scheduling of GPUs, RDMA, FPGA and manifest-defined device types."""

    NAME: ClassVar[str] = "DeviceShare"
    #: Filter and score read only the workload and each node's own devices (sched/memo.py).
    NODE_LOCAL: ClassVar[bool] = True
    #: When pre_filter skips (the workload asks for no device), reserve, unreserve and pre_bind have
    #: nothing to do: the runtime leaves them out (sched/runtime.py, IDLE_WHEN_SKIPPED).
    IDLE_WHEN_SKIPPED: ClassVar[bool] = True
    #: Its fused path (fused.py) wraps ResourcesFit's: the framework asks it first (Framework.fused).
    FUSES_OTHERS: ClassVar[bool] = True

    def __init__(self, strategy: str = "LeastAllocated"):
        self.strategy = strategy
        self.accounts: DeviceAccounts | None = None
        self.mig: MIGSlices | None = None
        self.partitions: PartitionTables | None = None
        self._hints: HintChecks | None = None
        self._normalized: OrderedDict[tuple[Any, ...], object] = OrderedDict()
        self._offers: dict[tuple[Any, ...], DeviceAllocation | Status] = {}  # see `reserve`
        self._interned: dict[tuple[DeviceRequest, _Rules], tuple[DeviceRequest, _Rules]] = {}
        self._hinted: dict[DeviceRequest, bool] = {}  # whether a requested type has a hint (`reserve`)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> DeviceShare:
        """args: ``{strategy: LeastAllocated | MostAllocated}`` (the card-level default)."""
        return cls(strategy_arg(args, "LeastAllocated"))

    def attach(self, state: ClusterState) -> None:
        self.accounts = attach_device_accounts(state)
        self.mig = attach_mig_slices(state)
        self.partitions = attach_partition_tables(state)
        self._hints = HintChecks(self.accounts, state, self.strategy)
        self._offers = {}

    def _checks(self) -> HintChecks:
        if self._hints is None:
            raise MissingState("DeviceShare: not attached to a ClusterState")
        return self._hints

    def _acc(self) -> DeviceAccounts:
        if self.accounts is None:
            raise MissingState("DeviceShare: not attached to a ClusterState")
        return self.accounts

    def _mig(self) -> MIGSlices:
        return _attached(self.mig)

    def _tables(self) -> PartitionTables:
        return _attached(self.partitions)

    def owns(self, resource: str) -> bool:
        types = self.accounts.types if self.accounts is not None else ()
        if device_resource(resource, types) is not None:
            return True
        return self.mig is not None and self.mig.has_cards() and mig_profile_of(resource) is not None

    # PreFilter / Filter -----------------------------------------------------------------------------
    def normalize(self, workload: Workload) -> DeviceRequest:
        """The workload's DeviceRequest (cached per distinct request); raises InvalidDeviceRequest."""
        prepared = self._prepare(workload)
        if isinstance(prepared, InvalidDeviceRequest):
            raise prepared
        return DeviceRequest() if prepared is None else prepared[0]

    def _prepare(self, workload: Workload, shape: Hashable | None = None) -> _Prepared:
        """Normalized request and fit rules (None: no device asked), memoized per request and layout.

        `shape` (sched/memo.py), when the scheduler has it, covers the requests and the joint
        spec and is hashed once per decision; the key falls back to those two fields.
        """
        accounts = self._acc()
        if shape is None:
            joint = workload.device_joint_allocate
            shape = (
                workload.requests,
                None if joint is None else (joint.device_types, joint.required_scope),
                workload.device_allocate_hint or None,
                workload.gpu_partition_spec,
            )
        mig_owned = self._mig().has_cards()
        key = (shape, accounts.epoch, mig_owned)
        hit = self._normalized.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._compute(workload, accounts, mig_owned)
            if isinstance(hit, tuple):
                # One object per distinct request (shapes differing in scalar amounts share it):
                # the offer memo's key then compares it by identity, not field by field.
                if len(self._interned) >= _NORMALIZED_CACHE:
                    self._interned.clear()
                hit = self._interned.setdefault(hit, hit)
            self._normalized[key] = hit
            if len(self._normalized) > _NORMALIZED_CACHE:
                self._normalized.popitem(last=False)
        return hit  # type: ignore[return-value]

    @staticmethod
    def _compute(
        workload: Workload, accounts: DeviceAccounts, mig_owned: bool = False
    ) -> tuple[DeviceRequest, _Rules] | InvalidDeviceRequest | None:
        types = tuple(accounts.types)
        mig = mig_request(workload.requests) if mig_owned else None
        if mig is None and not any(device_resource(name, types) for name in workload.requests):
            return None
        try:
            dreq = normalize_device_request(
                workload.requests,
                device_types=types,
                joint=workload.device_joint_allocate,
                hints=workload.device_allocate_hint,
            )
        except InvalidDeviceRequest as exc:
            return exc
        if mig is not None and GPU in dreq.types:  # the Workload model refuses this too
            return InvalidDeviceRequest("a workload asks for MIG instances or for GPUs, not both")
        dreq = replace(dreq, mig=mig, partition=workload.gpu_partition_spec)
        if not dreq.types and mig is None:
            return None
        items = []
        for kind, tr in dreq.types.items():
            acc = accounts.types.get(kind)
            items.append((tr, None if acc is None else compile_rule(tr, acc.dims)))
        return dreq, _Rules(tuple(items))

    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        """Normalize once per distinct request (memoized); a bad request is the user's error (ERROR)."""
        prepared = self._prepare(request.workload, request.shape)
        if prepared is None:
            return SKIP
        if isinstance(prepared, InvalidDeviceRequest):
            return Status.error(str(prepared))
        cycle.write(DEVICE_REQUEST, prepared[0])
        cycle.write(_RULES, prepared[1])
        return SUCCESS

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        """Every requested type has `count` healthy devices that fit one instance (and the joint scope holds).

        A full batch reads the accounts' per-node cache (refreshed where nodes changed); a subset
        batch (the NODE_LOCAL memo's changed nodes) is evaluated directly on its few rows.
        """
        mask = self.filter_mask(cycle, request, nodes)
        return FilterResult(mask, lambda: self._explain(cycle, nodes, mask))

    def filter_mask(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> BoolArray:
        """`filter`'s mask alone (a fresh array): what the fused path (fused.py) asks."""
        accounts, everyone, index = self._acc(), nodes.state.n, nodes.index
        rules = cycle.read(_RULES)
        mask: BoolArray | None = None
        fits_at: dict[str, BoolArray] = {}  # a subset's [batch, D] fits per type, reused by the joint scope
        for tr, rule in rules.items:
            if rule is None:
                ok = np.zeros(nodes.n, dtype=bool)
            elif index is None:
                ok = accounts.fit_counts(tr.type, rule, partial(fit_mask, rule), everyone)[0] >= tr.count
            else:  # a few changed nodes: evaluate them directly
                fits = fits_at[tr.type] = fit_mask(rule, *node_rows(accounts.types[tr.type], index))
                # the ufuncs' own reductions (ndarray.sum / .any go through Python wrappers)
                ok = np.logical_or.reduce(fits, axis=1) if tr.count == 1 else np.add.reduce(fits, axis=1) >= tr.count
            if mask is None:
                mask = ok  # a new array: owned here, ANDed in place below
            else:
                mask &= ok
            if tr.hint is not None and rule is not None:
                mask &= self._checks().type_ok(tr, rule, everyone, index)
        if mask is None:  # a MIG-only request
            mask = np.ones(nodes.n, dtype=bool)
        dreq = cycle.read(DEVICE_REQUEST)
        joint = dreq.joint
        if joint is not None:
            mask &= self._joint_ok(rules, joint.types, joint.scope, everyone, index, fits_at)
            if any(dreq.types[t].hint is not None for t in joint.types):
                mask &= self._checks().joint_ok(dreq, rules, everyone, index)
        if dreq.mig is not None:
            mask &= mig_mask(self._mig(), dreq.mig, everyone, index)
        partition_rule = self._partition_fit_rule(rules, dreq)
        if partition_rule is not None:
            mask &= partition_mask(accounts, self._tables(), dreq, partition_rule, everyone, index)
        return mask

    def count(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> CountArray:
        """[batch] copies of the device request each node holds, placed one after another
        (deviceshare/count.py: exact for shares on one device, whole devices, partition tables and
        one MIG profile; an upper bound for multi-device shares, hints, joint scopes, several MIG
        profiles). Runs after this plugin's pre_filter (not called when it skipped)."""
        accounts, everyone, index = self._acc(), nodes.state.n, nodes.index
        rows: Any = slice(0, everyone) if index is None else index
        rules = cycle.read(_RULES)
        out = np.full(nodes.n, NO_LIMIT, dtype=np.int64)
        for tr, rule in rules.items:
            np.minimum(out, type_copies(accounts, tr, rule, rows, nodes.n), out=out)
        dreq = cycle.read(DEVICE_REQUEST)
        if dreq.mig is not None:
            np.minimum(out, mig_copies(self._mig(), dreq.mig, everyone, index), out=out)
        partition_rule = self._partition_fit_rule(rules, dreq)
        if partition_rule is not None:
            node_ids = np.arange(everyone) if index is None else index
            picks = partition_copies(accounts, self._tables(), dreq, partition_rule, node_ids, rows)
            if picks is not None:
                np.minimum(out, picks, out=out)
        return out

    def _partition_fit_rule(self, rules: _Rules, dreq: DeviceRequest) -> FitRule | None:
        """The gpu FitRule when partition tables can matter for `dreq` (whole GPUs, and some node
        has a table or Honor, or the workload a spec); None keeps every other request off this path."""
        tr = partition_request(dreq)
        if tr is None or (dreq.partition is None and not self._tables().active):
            return None
        return next((rule for t, rule in rules.items if t is tr and rule is not None), None)

    def _joint_ok(
        self,
        rules: _Rules,
        types: tuple[str, ...],
        scope: str,
        n: int,
        index: np.ndarray | None,
        fits_at: Mapping[str, BoolArray] | None = None,
    ) -> BoolArray:
        """[batch] nodes where the joint scope can hold (all n nodes cached like the fit counts, or `index`).

        Exact for one first-type device: some fitting first-type device has, on its PCIe switch
        (NUMA node), enough fitting devices of every other type. For several first-type devices
        it over-approximates (the other types' fitting devices on scopes of any fitting first-type
        device suffice); the exact allocator decides. `fits_at`: the subset's fits per type, when
        the filter has them already (the same `fit_mask` on the same rows; never modified here).
        """
        accounts = self._acc()
        by_type = {tr.type: (tr, rule) for tr, rule in rules.items}
        if any(by_type[t][1] is None for t in types):
            return np.zeros(n if index is None else len(index), dtype=bool)

        def compute(rows: Any) -> tuple[np.ndarray, ...]:
            fits, scopes = {}, {}
            for kind in types:
                acc, rule = accounts.types[kind], by_type[kind][1]
                assert rule is not None
                known = None if fits_at is None or isinstance(rows, slice) else fits_at.get(kind)
                fits[kind] = fit_mask(rule, *node_rows(acc, rows)) if known is None else known
                scope_of = acc.pcie if scope == "SamePCIe" else acc.numa
                scopes[kind] = scope_of[rows] if isinstance(rows, slice) else scope_of.take(rows, axis=0)
            first = types[0]
            scope_p = scopes[first]
            fit_p = fits[first] & (scope_p >= 0)
            if by_type[first][0].count == 1:
                ok_p = fit_p.copy()
                for kind in types[1:]:
                    same = (scopes[kind][:, None, :] == scope_p[:, :, None]) & fits[kind][:, None, :]
                    ok_p &= same.sum(axis=2) >= by_type[kind][0].count
                return (ok_p.any(axis=1),)
            ok = np.ones(fit_p.shape[0], dtype=bool)
            for kind in types[1:]:
                near = ((scopes[kind][:, None, :] == scope_p[:, :, None]) & fit_p[:, :, None]).any(axis=1)
                ok &= (near & fits[kind]).sum(axis=1) >= by_type[kind][0].count
            return (ok,)

        if index is not None:
            return compute(index)[0]
        key = ("joint", types, scope, tuple(by_type[t] for t in types))
        return accounts.cached(key, compute, n)[0]

    def _explain(self, cycle: CycleState, nodes: NodeBatch, mask: BoolArray) -> Explanation:
        accounts, n = self._acc(), nodes.n
        rows = slice(0, nodes.state.n) if nodes.index is None else nodes.index
        out: dict[str, tuple[BoolArray, Code | BoolArray]] = {}
        per_type_ok = np.ones(n, dtype=bool)
        for tr, rule in cycle.read(_RULES).items:
            acc = accounts.types.get(tr.type)
            if acc is None or rule is None:
                out[f"node has no {tr.type}"] = (np.ones(n, dtype=bool), Code.UNRESOLVABLE)
                per_type_ok[:] = False
                continue
            free, total, healthy = acc.free[:, rows], acc.total[:, rows], acc.healthy[rows]
            out.update(explain_type(tr.type, rule, tr.count, acc.dims, free, total, healthy, acc.valid[rows]))
            per_type_ok &= fit_mask(rule, free, total, healthy).sum(axis=1) >= tr.count
        node_ids = list(range(nodes.state.n)) if nodes.index is None else nodes.index.tolist()
        dreq = cycle.read(DEVICE_REQUEST)
        self._checks().explain(dreq, cycle.read(_RULES).items, node_ids, per_type_ok, mask, out)
        if dreq.mig is not None:
            out.update(explain_mig(self._mig(), dreq.mig, node_ids))
        if self._partition_fit_rule(cycle.read(_RULES), dreq) is not None:
            out.update(explain_partitions(self._tables(), dreq, node_ids, per_type_ok & ~mask))
        joint = dreq.joint
        if joint is not None:
            where = "PCIe switch" if joint.scope == "SamePCIe" else "NUMA node"
            reason = f"no free {joint.types[0]} shares a {where} with enough free {', '.join(joint.types[1:])}"
            earlier = out.get(reason)  # the allocator may have given hinted nodes the same reason
            hit = per_type_ok & ~mask if earlier is None else (per_type_ok & ~mask) | earlier[0]
            out[reason] = (hit, Code.UNSCHEDULABLE)
        return out

    # Score ------------------------------------------------------------------------------------------
    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        if cycle.get(_RULES) is None:
            return SUCCESS
        shares = self.share_arrays(cycle, nodes)
        for share in shares:
            add_shares(cycle, share)
        cycle.write(DEVICE_SHARES, DeviceShares(tuple(shares)))
        return SUCCESS

    def share_arrays(self, cycle: CycleState, nodes: NodeBatch) -> list[np.ndarray]:
        """The device shares pre_score publishes, in its order (none when no rules were written)."""
        rules = cycle.get(_RULES)
        if rules is None:
            return []
        shares = device_shares(self._acc(), [tr for tr, _ in rules.items], nodes)
        dreq = cycle.read(DEVICE_REQUEST)
        if dreq.mig is not None:
            shares.append(mig_share(self._mig(), dreq.mig, nodes.state.n, nodes.index))
        return shares

    def fuse(
        self,
        state: ClusterState,
        filters: Sequence[FilterPlugin],
        pre_score: Sequence[PreScorePlugin],
        score: Sequence[tuple[ScorePlugin, int]],
        normalizing: bool,
    ) -> FusedEvaluator | None:
        """The fused device path (fused.py), wrapping the scalar one, when the profile allows it."""
        from finesched.plugins.deviceshare.fused import FusedDevice  # it reads this module's class

        return FusedDevice.build(self, state, filters, pre_score, score, normalizing)

    # Reserve / PreBind ------------------------------------------------------------------------------
    def reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        dreq = cycle.get(DEVICE_REQUEST)
        if dreq is None or (not dreq.types and dreq.mig is None):
            return SUCCESS
        accounts = self._acc()
        offers = cycle.get(DEVICE_OFFERS)
        if offers is None:
            offers = DeviceOffers()
            cycle.write(DEVICE_OFFERS, offers)
        affinity = cycle.get(NUMA_AFFINITY)
        if affinity is not None and affinity.node != node:
            affinity = None
        chooser = cycle.get(DEVICE_CHOOSER)
        strategy = request.workload.device_allocate_strategy or accounts.strategy_of(node) or self.strategy
        hinted = self._hinted.get(dreq)
        if hinted is None:  # the requests are interned (`_prepare`): a lookup by identity
            if len(self._hinted) >= _NORMALIZED_CACHE:
                self._hinted.clear()
            hinted = self._hinted[dreq] = any(tr.hint is not None for tr in dreq.types.values())
        # neither MIG nor whole GPUs (a share): no cards or partition rule to read
        plain = dreq.mig is None and partition_request(dreq) is None
        extra = None if plain else self._extra_rules(dreq, node)
        if chooser is None:
            # The offer is a pure function of the request, the strategy, the affinity and the
            # node's devices of the requested types (layout and free amounts), MIG cards and
            # partition rule: memoized, since nodes of one shape pass through the same device
            # states again and again. The key holds the whole DeviceRequest (hashed once), so
            # an offer is only ever reused for an equal request (its MIG profiles and counts too).
            key = (
                dreq,
                cycle.get(_RULES),
                strategy,
                None if affinity is None else (affinity.numa, affinity.required),
                accounts.epoch,
                tuple([accounts.device_state_key(node, kind) for kind in dreq.types]),
                extra,
                self._checks().hint_labels(dreq, node) if hinted else None,
            )
            outcome = self._offers.get(key)
            if outcome is None:
                if len(self._offers) >= _OFFERS_CACHE:
                    self._offers.clear()
                outcome = self._offers[key] = self._offer(
                    accounts, dreq, node, strategy, affinity, None, key[-1], extra
                )
        else:
            outcome = self._offer(
                accounts,
                dreq,
                node,
                strategy,
                affinity,
                partial(chooser.choose, node),
                self._checks().hint_labels(dreq, node),
                extra,
            )
        if isinstance(outcome, Status):
            return outcome
        offers.by_node[node] = outcome
        return SUCCESS

    def _extra_rules(self, dreq: DeviceRequest, node: int) -> tuple[Any, PartitionRule | None] | None:
        """The node's MIG cards (for a MIG request) and its partition rule (for a whole-GPU request
        where tables matter): hashable, part of the offer memo's key. None when neither applies."""
        cards = self._mig().cards[node] if dreq.mig is not None else None
        rule = None
        if partition_request(dreq) is not None and (dreq.partition is not None or self._tables().active):
            rule = rule_for(self._tables(), node, dreq.partition)
        return None if cards is None and rule is None else (cards, rule)

    @staticmethod
    def _offer(
        accounts: DeviceAccounts,
        dreq: DeviceRequest,
        node: int,
        strategy: str,
        affinity: NUMAAffinity | None,
        choose: Any,
        labels: tuple[tuple[str, Labels], ...] | None = None,
        extra: tuple[Any, PartitionRule | None] | None = None,
    ) -> DeviceAllocation | Status:
        """The exact offer on `node`, or the Status saying why there is none."""
        cards, partition = extra if extra is not None else (None, None)
        devices = {kind: accounts.node_devices(node, kind, copy=False) for kind in dreq.types}
        try:
            allocation = allocate_devices(
                devices,
                dreq,
                strategy=strategy,
                affinity=affinity,
                chooser=choose,
                labels=dict(labels or ()),
                partition=partition,
            )
        except InsufficientDevices as exc:
            return Status.unschedulable(exc.reason)
        except ValueError as exc:  # a DeviceChooser answered outside the fitting devices: a plugin bug
            return Status.error(str(exc))
        if dreq.mig is None or cards is None:
            return allocation
        choice = choose_mig(cards, dreq.mig)
        if choice is None:
            return Status.unschedulable(f"no MIG layout fits {dreq.mig.describe()}")
        return DeviceAllocation({**allocation.devices, GPU: mig_grants(cards, choice)})

    def unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        offers = cycle.get(DEVICE_OFFERS)
        if offers is not None:
            offers.by_node.pop(node, None)

    def pre_bind(self, cycle: CycleState, request: ScheduleRequest, node: int, binding: Binding) -> Binding:
        dreq = cycle.get(DEVICE_REQUEST)
        if dreq is None or (not dreq.types and dreq.mig is None):
            return binding
        offers = cycle.get(DEVICE_OFFERS)
        offer = None if offers is None else offers.by_node.get(node)
        if offer is None:
            raise MissingState(f"DeviceShare/offers: no offer for node {node}; did reserve run?")
        devices = offer.binding_devices()
        annotations = {**binding.annotations, DEVICE_ALLOCATED: offer.annotation()}
        return fast_copy(binding, {"devices": devices, "annotations": annotations})
