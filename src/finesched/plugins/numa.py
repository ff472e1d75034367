"""NUMAAlign: NUMA topology alignment decided in the scheduler, for CPUs, memory and devices (seed S3.7).

Koordinator's topologymanager, itself the kubelet's Topology Manager moved into the scheduler:

1. **Hint providers** say, per resource, which sets of NUMA nodes could hold the request
   (`generate_hints`, plugins/numa_hints.py): every non-empty set whose *available* amount covers the request is a
   hint; it is *preferred* when it is as small as the smallest set whose *capacity* covers it.
   Providers here: cpu (exclusive requests count the CPUs their bind policy may use on each NUMA
   node: whole free cores under required FullPCPUs, one CPU per core under required
   SpreadByPCPUs; other requests count millicores left by NUMA-bound workloads), memory
   (per-NUMA bytes from the node's NUMA zones), and devices (per type: devices on the NUMA
   nodes where one instance of the DeviceShare request fits, against all healthy devices there;
   with a deviceAllocateHint only the devices the hint admits, in one scope group when it
   requires one; devices without a NUMA node count nowhere: plugins/numa_devices.py).
2. **A policy merges them** (`merge_hints`, numa_hints.py, the kubelet's mergeFilteredHints): every
   combination of one hint per resource is ANDed; preferred beats non-preferred, then the
   narrower mask wins (fewer nodes, then lower ids). None admits without alignment; BestEffort
   admits with the best hint; Restricted admits only a preferred hint; SingleNUMANode considers
   only single-node (or don't-care) preferred hints and admits only a preferred single node.
3. **Each provider allocates under the merged hint**: `NUMA_AFFINITY` (required for
   Restricted / SingleNUMANode) is read by CPUOrchestration and DeviceShare, which run after
   this plugin in the reserve order; memory (and cpu of workloads without a cpuset) is split
   over the chosen nodes here (`split_by_numa`) and recorded as the binding's NUMA grants.

Policy: the workload's (``numaTopologyPolicy`` or the numa-topology-spec annotation), else the
node's (label ``node.koordinator.sh/numa-topology-policy``, the older
``...-alignment-policy``, or ``policies.numaTopologyPolicy``). When both are set and differ the
node is filtered out ("node(s) NUMA Topology policy not match", Koordinator's rule). BE
workloads run in the BE pool across NUMA nodes and are not aligned.

The filter is vectorized: for SingleNUMANode it keeps only nodes where one NUMA node covers cpu,
memory and every requested device type at once (per-NUMA arrays of state/cpus.py and the device
accounts), a necessary condition of the exact merge; Restricted is decided exactly in reserve.
Its "cannot fit on a single NUMA node" is unresolvable on a node where no NUMA node could hold
the request even idle (capacity below the request), whatever the other nodes are.
A workload without a policy of its own skips the filter while no node has a strict one (it
could reject nothing).

Choices where the peers leave room (documented here, pinned by tests/test_numa.py):
* Among equally good hints the kubelet's tie-break applies (the narrower mask, then lower NUMA
  ids); the NUMA allocate strategy orders CPUs *within* the chosen nodes, not the choice itself.
* BestEffort: when the merged hint cannot hold the split (it is a preference), the workload is
  placed without per-NUMA grants; a preferred "any NUMA node" hint does not constrain the cpuset.
* Restricted / SingleNUMANode on a node that reports no NUMA nodes: filtered out.
* Exclusive workloads get their per-NUMA cpu grants from CPUOrchestration's cpuset; without that
  plugin in the profile only their memory is granted per NUMA node.
* Profile order: NUMAAlign before CPUOrchestration and DeviceShare (reserve runs in profile order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.resources import CPU, MEMORY
from finesched.plugins.cpu.koordinator import split_by_numa
from finesched.plugins.cpu.prefilter import (
    BIND_CODE,
    NO_NUMA,
    POLICY_MISMATCH,
    RESTRICTED,
    SINGLE,
    SINGLE_NUMA,
    Checks,
    filter_result,
    numa_checks,
    numa_inputs,
    usable_cpus_of,
)
from finesched.plugins.cpu.request import CPU_OFFER, NUMA_OFFER, CPURequest, NUMAOffer, cpu_request
from finesched.plugins.deviceshare.count import copies_over_devices, device_copies
from finesched.plugins.deviceshare.hints import device_labels
from finesched.plugins.deviceshare.request import compile_rule, fit_mask
from finesched.plugins.numa_devices import device_fits, device_request, idle_counts, type_counts
from finesched.plugins.numa_hints import Hints, TopologyHint, generate_hints, hints_by, merge_hints, single_hints
from finesched.plugins.resource_status import merge_numa_grants, with_resource_status
from finesched.plugins.shared_keys import NUMA_AFFINITY, NUMAAffinity
from finesched.sched.cycle_state import CycleState, MissingState
from finesched.sched.framework import NO_LIMIT, SKIP, SUCCESS, CountArray, FilterResult, NodeBatch, Status
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState
from finesched.state.cpu_config import NUMA_POLICY_CODE
from finesched.state.cpu_topology import InsufficientCPUs
from finesched.state.cpus import CPUAccounts
from finesched.state.devices import node_rows

#: Bound on NUMAAlign's memo of reserve decisions (cleared when full).
_DECIDED_LIMIT = 4096


class NUMAAlign:
    """PreFilter, Filter, Reserve and PreBind for NUMA alignment (see the module docstring).

    Profile order: NUMAAlign before CPUOrchestration and DeviceShare, so their reserve sees the
    affinity it writes.
    """

    NAME: ClassVar[str] = "NUMAAlign"
    #: The filter's verdict on a node depends only on the workload and that node (memoizable).
    NODE_LOCAL: ClassVar[bool] = True

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self._accounts: CPUAccounts | None = None
        self._strict: tuple[int, bool] = (-1, True)  # (nodes_version, some node has a strict policy)
        self._decided: dict[tuple[Any, ...], Any] = {}  # see `reserve`

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> NUMAAlign:
        if args:
            raise ValidationError("NUMAAlign takes no args", path="plugins.NUMAAlign.args", value=dict(args))
        return cls()

    def attach(self, state: ClusterState) -> None:
        """Remember the state; the CPU accounts are taken on first use, so that CPUOrchestration
        (which comes later in the profile but owns ``maxRefCount``) attaches them first."""
        self.state, self._accounts, self._strict = state, None, (-1, True)
        self._decided = {}

    @property
    def accounts(self) -> CPUAccounts:
        if self._accounts is None:
            if self.state is None:
                raise MissingState("NUMAAlign: not attached to a ClusterState")
            existing = self.state.extras.get(CPUAccounts.name)
            self._accounts = existing if isinstance(existing, CPUAccounts) else self.state.attach(CPUAccounts())
        return self._accounts

    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        try:
            req = cpu_request(cycle, request.workload, request.shape)
        except ValueError as exc:
            return Status.error(str(exc))
        if req.qos == "BE" or not (req.numa_policy or self._any_strict_node()):
            return SKIP
        return SUCCESS

    def _any_strict_node(self) -> bool:
        """Whether some node's own policy is Restricted or SingleNUMANode (cached per node set).

        Without a workload policy only such nodes can fail the filter (no mismatch, no NUMA
        requirement elsewhere), so a cluster without them needs no filter pass at all: it
        would cost a full numpy pass per new shape and one per memo refresh, to pass every node.
        Node policies change only with the node set, which `nodes_version` tracks.
        """
        state = self.state
        if state is None:
            return True
        version, strict = self._strict
        if version != state.nodes_version:
            policy = self.accounts.numa_policy[: state.n]
            strict = bool(np.count_nonzero((policy == RESTRICTED) | (policy == SINGLE)))
            self._strict = (state.nodes_version, strict)
        return strict

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        req = cpu_request(cycle, request.workload, request.shape)
        checks = numa_checks(self.accounts, req, nodes, device_fits(cycle, self.state, nodes))
        result = filter_result(checks, nodes.n)
        if SINGLE_NUMA not in checks:
            return result
        return FilterResult(result.mask, lambda: self._explain(cycle, req, nodes, checks))

    def count(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> CountArray:
        """[batch] copies of the request the node's NUMA nodes hold under SingleNUMANode.

        Each copy sits on one NUMA node, so the node holds the sum over its NUMA nodes of what
        each holds alone: the least of free millicores // cpu (for an exclusive cpuset also its
        CPUs there // cpus: whole-core CPUs under a required FullPCPUs, else every available CPU,
        an upper bound under SpreadByPCPUs), free memory // memory, and per requested
        device type the copies of that type on the devices of that NUMA node (deviceshare/count.py).
        Exact where those counts are (nothing is shared between NUMA nodes); hinted device types
        are left to DeviceShare's count (an upper bound here). Restricted, BestEffort and no
        policy put no limit of their own (NO_LIMIT: a copy may span NUMA nodes).
        """
        req = cpu_request(cycle, request.workload, request.shape)
        acc, n = self.accounts, nodes.n
        out = np.full(n, NO_LIMIT, dtype=np.int64)
        node_policy = nodes.take(acc.numa_policy)
        pod = NUMA_POLICY_CODE.get(req.numa_policy, 0) if req.numa_policy else 0
        policy = np.where((node_policy == pod) | (node_policy == 0), pod, -1) if pod else node_policy
        at = np.flatnonzero(policy == SINGLE)
        if not len(at):
            return out
        rows = at if nodes.index is None else nodes.index[at]  # state indices
        zones = acc.numa_valid[rows].astype(np.int64) * NO_LIMIT  # [rows, NUMA slots]
        if req.cpu_milli > 0:
            free = np.maximum(acc.numa_cpu_cap[rows] - acc.numa_cpu_used[rows], 0) // req.cpu_milli
            excl = np.ones(len(rows), dtype=bool) if req.exclusive else acc.kubelet_static[rows] & req.static_exclusive
            if excl.any() and req.cpus > 0:
                cpus = _countable_cpus(acc, req, rows) * acc.max_ref_count // req.cpus
                free = np.where(excl[:, None], np.minimum(free, cpus), free)
            zones = np.where(acc.has_topo[rows][:, None], np.minimum(zones, free), zones)
        if req.memory > 0:
            mem = np.maximum(acc.numa_mem_cap[rows] - acc.numa_mem_used[rows], 0) // req.memory
            zones = np.where(acc.mem_tracked[rows][:, None], np.minimum(zones, mem), zones)
        found = device_request(cycle, self.state)
        if found is not None:
            dreq, devices = found
            numa_id = acc.numa_id[rows]
            for kind, tr in dreq.types.items():
                typed = devices.types.get(kind)
                if typed is None:
                    zones[:] = 0
                    continue
                if tr.hint is not None:
                    continue
                per_device = device_copies(compile_rule(tr, typed.dims), *node_rows(typed, rows))
                dev_numa = typed.numa.take(rows, axis=0)
                for z in range(numa_id.shape[1]):
                    here = np.where(dev_numa == numa_id[:, z : z + 1], per_device, 0)
                    np.minimum(zones[:, z], copies_over_devices(here, tr.count), out=zones[:, z])
        out[at] = np.minimum(zones.sum(axis=1), NO_LIMIT)
        return out

    def _explain(self, cycle: CycleState, req: CPURequest, nodes: NodeBatch, checks: Checks) -> Checks:
        """The checks with "cannot fit on a single NUMA node" unresolvable where no NUMA node of the
        node could hold cpu, memory and the devices even idle (per node: the module docstring)."""
        failed, _ = checks[SINGLE_NUMA]
        at = np.flatnonzero(failed)
        never = np.zeros(nodes.n, dtype=bool)
        never[at] = ~self._single_numa_possible(cycle, req, at if nodes.index is None else nodes.index[at])
        return {**checks, SINGLE_NUMA: (failed, never)}

    def _single_numa_possible(self, cycle: CycleState, req: CPURequest, rows: np.ndarray) -> np.ndarray:
        """[len(rows)] whether some NUMA node of each node, idle, could hold the whole request: the
        SingleNUMANode filter's conditions (cpu_prefilter.numa_checks) on capacities, not free amounts."""
        acc = self.accounts
        ok = acc.numa_valid[rows].copy()  # [rows, NUMA slots]
        if req.cpu_milli > 0:
            ok &= (acc.numa_cpu_cap[rows] >= req.cpu_milli) | ~acc.has_topo[rows][:, None]
        if req.memory > 0:
            ok &= (acc.numa_mem_cap[rows] >= req.memory) | ~acc.mem_tracked[rows][:, None]
        found = device_request(cycle, self.state)
        if found is None or self.state is None:
            return ok.any(axis=1)
        dreq, devices = found
        numa_id = acc.numa_id[rows]
        for kind, tr in dreq.types.items():
            typed = devices.types.get(kind)
            if typed is None:
                return np.zeros(len(rows), dtype=bool)
            if tr.hint is None:
                total = typed.total[:, rows]
                fits = fit_mask(compile_rule(tr, typed.dims), total, total, typed.valid[rows])  # idle cards
                same = fits[:, None, :] & (typed.numa[rows][:, None, :] == numa_id[:, :, None])
                ok &= same.sum(axis=2) >= tr.count
                continue
            for r, node in enumerate(rows.tolist()):  # a hint's verdict is taken per node (hints.py)
                nd = devices.node_devices(node, kind, copy=False)
                counts = None if nd is None else idle_counts(tr, nd, device_labels(self.state.nodes[node], kind))
                holds = counts.holds(counts.available) if counts is not None else (lambda _mask: False)
                ok[r] &= [holds(frozenset((int(n),))) for n in numa_id[r]]
        return ok.any(axis=1)

    def reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        req = cpu_request(cycle, request.workload, request.shape)
        acc = self.accounts
        policy = effective_policy(req, acc.config[node].numa_policy)
        if req.qos == "BE" or policy in ("None", ""):
            return SUCCESS
        if policy == "mismatch":
            return Status.unschedulable(POLICY_MISMATCH)
        numa_ids = acc.numa_ids[node]
        if not numa_ids:
            return SUCCESS if policy == "BestEffort" else Status.unschedulable(NO_NUMA)
        if device_request(cycle, self.state) is None:
            # Without devices the decision reads only the request, the node's config and a few
            # of its per-NUMA numbers (`numa_inputs`): memoized, since nodes of one shape pass
            # through the same numbers again and again.
            key = numa_inputs(acc, req, node)
            outcome = self._decided.get(key)
            if outcome is None:
                if len(self._decided) >= _DECIDED_LIMIT:
                    self._decided.clear()
                outcome = self._decided[key] = self._decide(cycle, req, node, policy, numa_ids)
        else:
            outcome = self._decide(cycle, req, node, policy, numa_ids)
        if isinstance(outcome, Status):
            return outcome
        chosen, required, packed = outcome
        cycle.write(NUMA_AFFINITY, NUMAAffinity(node, chosen, required))
        cycle.write(NUMA_OFFER, NUMAOffer(node, packed))
        return SUCCESS

    def _decide(
        self, cycle: CycleState, req: CPURequest, node: int, policy: str, numa_ids: tuple[int, ...]
    ) -> Status | tuple[frozenset[int], bool, tuple[tuple[int, tuple[tuple[str, int], ...]], ...]]:
        """Merge the providers' hints on `node`: a failure Status, or (chosen NUMA ids, required, grants)."""
        single = policy == "SingleNUMANode"
        providers: list[Hints] = [self.hints(req, node, single), self.device_hints(cycle, node, single)]
        best, admit = merge_hints(policy, numa_ids, providers)
        if not admit:
            wanted = [r for hints in providers for r, h in hints.items() if h is not None]
            return Status.unschedulable(f"node(s) cannot align {', '.join(wanted)} under NUMA policy {policy}")
        chosen = best.affinity if best.affinity is not None else frozenset(numa_ids)
        required = policy in ("Restricted", "SingleNUMANode")
        try:
            grants = self._grants(req, node, chosen)
        except InsufficientCPUs as exc:
            if required:
                return Status.unschedulable(str(exc))
            grants = {}
        return chosen, required, tuple((n, tuple(sorted(g.items()))) for n, g in sorted(grants.items()))

    def unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        affinity = cycle.get(NUMA_AFFINITY)
        if affinity is not None and affinity.node == node:
            cycle.delete(NUMA_AFFINITY)
        offer = cycle.get(NUMA_OFFER)
        if offer is not None and offer.node == node:
            cycle.delete(NUMA_OFFER)

    def pre_bind(self, cycle: CycleState, request: ScheduleRequest, node: int, binding: Binding) -> Binding:
        offer = cycle.get(NUMA_OFFER)
        if offer is None or offer.node != node or not offer.grants:
            return binding
        cpu_offer = cycle.get(CPU_OFFER)
        if cpu_offer is not None and cpu_offer.node == node:
            return binding  # CPUOrchestration.pre_bind applies these grants with its own, in one copy
        return with_resource_status(binding, numa=merge_numa_grants(binding.numa, offer.as_dict()))

    # Providers -------------------------------------------------------------------------------------------------
    def hints(self, req: CPURequest, node: int, single_only: bool = False) -> dict[str, list[TopologyHint] | None]:
        """The cpu and memory providers' hints on `node` (single-node hints only under SingleNUMANode)."""
        acc = self.accounts
        view = acc.view(node)
        out: dict[str, list[TopologyHint] | None] = {}
        if single_only:  # the same hints from the view's aligned tuples, without building dicts
            if req.cpu_milli > 0 and acc.topo[node] is not None:
                out[CPU] = single_hints(view.numa_ids, req.cpu_milli, self._cpu_available(req, node), view.cpu_cap)
            if req.memory > 0 and view.mem_free is not None and view.mem_cap is not None:
                out[MEMORY] = single_hints(view.numa_ids, req.memory, view.mem_free, view.mem_cap)
            return out
        if req.cpu_milli > 0 and acc.topo[node] is not None:
            available, capacity = self.cpu_free(req, node)
            out[CPU] = generate_hints(view.numa_ids, req.cpu_milli, available, capacity, single_only)
        if req.memory > 0 and view.mem_free is not None and view.mem_cap is not None:
            free = dict(zip(view.numa_ids, view.mem_free, strict=True))
            capacity = dict(zip(view.numa_ids, view.mem_cap, strict=True))
            out[MEMORY] = generate_hints(view.numa_ids, req.memory, free, capacity, single_only)
        return out

    def device_hints(
        self, cycle: CycleState, node: int, single_only: bool = False
    ) -> dict[str, list[TopologyHint] | None]:
        """The device provider's hints on `node`, one entry per requested device type: sets of
        NUMA nodes holding the devices the request may take there (plugins/numa_devices.py)."""
        found = device_request(cycle, self.state)
        if found is None or self.state is None:
            return {}
        dreq, devices = found
        numa_ids = self.accounts.numa_ids[node]
        out: dict[str, list[TopologyHint] | None] = {}
        for kind, tr in dreq.types.items():
            nd = devices.node_devices(node, kind, copy=False)
            if nd is None:
                out[kind] = []
                continue
            if tr.hint is not None:
                counts = type_counts(tr, nd, device_labels(self.state.nodes[node], kind))
                holds, could = counts.holds(counts.available), counts.holds(counts.capacity)
                out[kind] = hints_by(numa_ids, holds, could, single_only)
                continue
            fits = fit_mask(compile_rule(tr, nd.dims), nd.free, nd.total, nd.healthy)
            # Counted in Python over the node's few devices (numpy calls per NUMA id cost more).
            available, capacity = dict.fromkeys(numa_ids, 0), dict.fromkeys(numa_ids, 0)
            for fit, healthy, numa in zip(fits.tolist(), nd.healthy.tolist(), nd.numa.tolist(), strict=True):
                if numa in capacity:
                    available[numa] += fit
                    capacity[numa] += healthy
            out[kind] = generate_hints(numa_ids, tr.count, available, capacity, single_only)
        return out

    def cpu_free(self, req: CPURequest, node: int) -> tuple[dict[int, int], dict[int, int]]:
        """(available, capacity) millicores per NUMA id for `req` on `node` (see the module docstring)."""
        view = self.accounts.view(node)
        capacity = dict(zip(view.numa_ids, view.cpu_cap, strict=True))
        return dict(zip(view.numa_ids, self._cpu_available(req, node), strict=True)), capacity

    def _cpu_available(self, req: CPURequest, node: int) -> tuple[int, ...]:
        """`cpu_free`'s available millicores per NUMA slot (ids ascending)."""
        acc = self.accounts
        free = acc.view(node).cpu_free
        if req.exclusive_on(acc.config[node].kubelet_static):
            free = tuple(min(f, 1000 * u) for f, u in zip(free, usable_cpus_of(acc, req, node), strict=True))
        return free

    def _grants(self, req: CPURequest, node: int, chosen: frozenset[int]) -> dict[int, dict[str, int]]:
        """Memory (and cpu, for workloads without a cpuset) split over the chosen NUMA nodes."""
        acc = self.accounts
        grants: dict[int, dict[str, int]] = {}
        cpu_free, mem_free = acc.numa_free(node)
        if req.cpu_milli > 0 and not req.exclusive_on(acc.config[node].kubelet_static):
            for n, amount in split_by_numa(req.cpu_milli, cpu_free, chosen, what="cpu").items():
                grants.setdefault(n, {})[CPU] = amount
        if req.memory > 0 and mem_free:
            for n, amount in split_by_numa(req.memory, mem_free, chosen, what="memory").items():
                grants.setdefault(n, {})[MEMORY] = amount
        return grants


def _countable_cpus(acc: CPUAccounts, req: CPURequest, rows: np.ndarray) -> np.ndarray:
    """[rows, NUMA slots] CPUs copies of an exclusive request can take one after another per NUMA
    node: whole-core CPUs under a required FullPCPUs (each copy takes whole cores), else every
    available CPU. (The filter's `usable_cpus` counts cores with a free CPU under SpreadByPCPUs,
    right for one copy; a copy leaves the cores' other CPUs free for the next.)"""
    pod_req = BIND_CODE.get(req.required_bind, 0)
    if pod_req:
        full = np.full(len(rows), pod_req == 1, dtype=bool)
    else:  # as `usable_cpus`: kubelet-mode nodes count any available CPU
        full = ~acc.kubelet_mode[rows] & (acc.required_bind[rows] == 1)
    return np.where(full[:, None], acc.numa_whole[rows], acc.numa_avail[rows])


def effective_policy(req: CPURequest, node_policy: str) -> str:
    """The workload's policy, else the node's; "mismatch" when both are set and differ."""
    node_set = node_policy not in ("", "None")
    if req.numa_policy and node_set and req.numa_policy != node_policy:
        return "mismatch"
    return req.numa_policy or node_policy or "None"
