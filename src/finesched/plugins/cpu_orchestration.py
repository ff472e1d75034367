"""CPUOrchestration: exclusive cpusets and CPU pools decided in the scheduler (seed S3.1-S3.6, S3.8).

Public allocators (re-exported from `plugins/cpu/`): `take_cpus` (Koordinator's rules),
`kubelet_take_by_topology` and `kubelet_static_allocate` (the kubelet's), `allocate_cpus` (the
resource manager's required-policy and NUMA-hint steps around take_cpus), with `CPUTopology`,
`AllocatedCPU`, `InsufficientCPUs` and `SMTAlignmentError`.

The plugin, per workload:

* **QoS decides the pool (S3.1, S3.2).** LSE/LSR get an exclusive cpuset on every node;
  Guaranteed workloads with whole CPUs get one on kubelet-static nodes (the kubelet pins them
  anyway); LS/Burstable run in the shared pool, BE in the BE pool (nothing to choose here).
* **Bind policy (S3.4).** The workload's required policy, else the node's required one (label
  ``node.koordinator.sh/cpu-bind-policy`` or kubelet full-pcpus-only), else the workload's
  preferred one, else the profile default. A workload-required policy that conflicts with the
  node's filters the node out. Under a required policy available CPUs are pre-filtered and the
  result checked; required FullPCPUs also checks SMT alignment (request a multiple of CPUs per
  core), so the node never refuses what we place.
* **NUMA allocate strategy (S3.6)**: node label/policy, else the kubelet's
  distribute-cpus-across-numa (DistributeEvenly), else the profile default. DistributeEvenly has
  no Koordinator takeCPUs mode; it runs the kubelet's distributed algorithm (group = CPUs per
  core under FullPCPUs).
* **kubelet compatibility (S3.8)**: on a node whose kubelet is static with options and that sets
  no finesched policy, workloads without a required bind policy get `kubelet_static_allocate`.
* **NUMA**: `NUMAAlign` (plugins/numa.py) reserves first and writes `NUMA_AFFINITY`; a
  required affinity restricts the cpuset to those NUMA nodes (split as Koordinator's resource
  manager does), a preferred one is tried first. LS workloads with ConstrainedBurst, or with a
  required affinity, are bound to NUMA shared pools (``cpuSharedPools`` in resource-status).

Filter is vectorized over all nodes (state/cpus.py arrays) and only rejects nodes no exact
allocation could use; reserve computes the cpuset once on the candidate node and stores it
under `CPU_OFFER`; pre_bind copies it into the binding (cpuset, exclusive policy, per-NUMA cpu,
resource-status annotation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from finesched.cpuset import CPUSet
from finesched.errors import ValidationError
from finesched.model.base import fast_copy
from finesched.model.binding import Binding
from finesched.model.node import CPUTopology
from finesched.plugins.cpu.koordinator import allocate_cpus, filter_required, satisfies_required, take_cpus
from finesched.plugins.cpu.kubelet import kubelet_static_allocate, kubelet_take_by_topology
from finesched.plugins.cpu.prefilter import (
    BAD_NODE_POLICY,
    BIND_CODE,
    BIND_CONFLICT,
    NO_SHARED_POOL,
    NO_TOPOLOGY,
    exclusive_checks,
    filter_result,
)
from finesched.plugins.cpu.request import CPU_OFFER, CPU_REQUEST, NUMA_OFFER, CPUOffer, CPURequest, cpu_request
from finesched.plugins.resource_status import (
    ANNOTATION_RESOURCE_STATUS,
    SharedPool,
    merge_numa_grants,
    with_resource_status,
)
from finesched.plugins.shared_keys import NUMA_AFFINITY, NUMAAffinity
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NO_LIMIT, SKIP, SUCCESS, CountArray, FilterResult, NodeBatch, Status
from finesched.sched.request import ScheduleRequest
from finesched.state.cluster import ClusterState
from finesched.state.cpu_packed import kubelet_reserved_cpus
from finesched.state.cpu_topology import (
    BIND_POLICIES,
    DISTRIBUTE_EVENLY,
    EXCLUSIVE_POLICIES,
    FULL_PCPUS,
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    AllocatedCPU,
    CPUAllocationError,
    InsufficientCPUs,
    SMTAlignmentError,
    UnknownPolicy,
    check_choice,
)
from finesched.state.cpus import CPUAccounts

__all__ = [
    "CPU_OFFER",
    "AllocatedCPU",
    "CPUOffer",
    "CPUOrchestration",
    "CPUTopology",
    "InsufficientCPUs",
    "SMTAlignmentError",
    "UnknownPolicy",
    "allocate_cpus",
    "kubelet_reserved_cpus",
    "kubelet_static_allocate",
    "kubelet_take_by_topology",
    "take_cpus",
]

_ARGS = ("defaultBindPolicy", "defaultExclusivePolicy", "numaAllocateStrategy", "maxRefCount")
#: Bound on the memo of exclusive allocations (cleared when full).
_EXCLUSIVE_LIMIT = 4096


class CPUOrchestration:
    """PreFilter, Filter, Reserve and PreBind for exclusive cpusets and CPU pools (module docstring)."""

    NAME: ClassVar[str] = "CPUOrchestration"
    #: The filter's verdict on a node depends only on the workload and that node (memoizable).
    NODE_LOCAL: ClassVar[bool] = True

    def __init__(
        self,
        default_bind_policy: str = FULL_PCPUS,
        default_exclusive_policy: str = "None",
        numa_allocate_strategy: str = LEAST_ALLOCATED,
        max_ref_count: int = 1,
    ):
        self.default_bind = check_choice("defaultBindPolicy", default_bind_policy, BIND_POLICIES)
        self.default_exclusive = check_choice("defaultExclusivePolicy", default_exclusive_policy, EXCLUSIVE_POLICIES)
        self.strategy = check_choice(
            "numaAllocateStrategy", numa_allocate_strategy, (MOST_ALLOCATED, LEAST_ALLOCATED, DISTRIBUTE_EVENLY)
        )
        if not isinstance(max_ref_count, int) or max_ref_count < 1:
            raise ValueError(f"maxRefCount must be an int >= 1, got {max_ref_count!r}")
        self.max_ref_count = max_ref_count
        self.accounts = CPUAccounts(max_ref_count)
        self._exclusive: dict[tuple[Any, ...], Any] = {}  # see `reserve`
        self._bound: dict[tuple[Any, ...], Any] = {}  # see `pre_bind`

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> CPUOrchestration:
        """Build from profile args (``defaultBindPolicy``, ``defaultExclusivePolicy``, ``numaAllocateStrategy``,
        ``maxRefCount``); unknown keys or values raise ValidationError listing the valid ones."""
        unknown = sorted(set(args) - set(_ARGS))
        if unknown:
            raise ValidationError(f"unknown args {unknown}; valid: {', '.join(_ARGS)}", path="plugins.CPUOrchestration")
        try:
            return cls(
                args.get("defaultBindPolicy", FULL_PCPUS),
                args.get("defaultExclusivePolicy", "None"),
                args.get("numaAllocateStrategy", LEAST_ALLOCATED),
                args.get("maxRefCount", 1),
            )
        except ValueError as exc:
            raise ValidationError(str(exc), path="plugins.CPUOrchestration.args") from None

    def attach(self, state: ClusterState) -> None:
        """Attach the CPU accounts with this plugin's maxRefCount (re-counted if already attached)."""
        self.accounts = state.attach(CPUAccounts(self.max_ref_count))
        self.accounts.set_max_ref_count(self.max_ref_count)
        self._exclusive = {}

    # PreFilter / Filter ----------------------------------------------------------------------------------
    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        try:
            req = cpu_request(cycle, request.workload, request.shape)
        except ValueError as exc:
            return Status.error(str(exc))
        return SUCCESS if req.exclusive or req.static_exclusive or req.constrained_burst else SKIP

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        req = cycle.read(CPU_REQUEST)
        return filter_result(exclusive_checks(self.accounts, req, nodes), nodes.n)

    def count(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> CountArray:
        """[batch] exclusive cpusets of the request each node can still give, one after another.

        On nodes where the workload gets an exclusive cpuset of r CPUs: under required FullPCPUs
        ``CPUs of fully free cores // r`` (each copy takes r / threads-per-core whole cores), else
        ``available CPUs // r``. Exact with maxRefCount 1 and exclusive policy None; with an
        exclusive policy (PCPULevel / NUMANodeLevel keep siblings or NUMA nodes from other
        exclusive sets), under required SpreadByPCPUs (one CPU per core) or with maxRefCount m > 1
        (``m · available // r``) it is an upper bound. Per-NUMA limits are NUMAAlign's count.
        Shared-pool (LS) and ConstrainedBurst workloads are limited by ResourcesFit's cpu count
        only (NO_LIMIT here).
        """
        req = cycle.read(CPU_REQUEST)
        acc, take = self.accounts, nodes.take
        out = np.full(nodes.n, NO_LIMIT, dtype=np.int64)
        r = req.cpus
        excl = np.ones(nodes.n, dtype=bool) if req.exclusive else take(acc.kubelet_static).copy()
        if not (req.exclusive or req.static_exclusive) or r <= 0 or not excl.any():
            return out
        pod_req = BIND_CODE.get(req.required_bind, 0)
        effective = np.full(nodes.n, pod_req, dtype=np.int8) if pod_req else take(acc.required_bind)
        avail = np.where(effective == 1, take(acc.numa_whole).sum(axis=1), take(acc.numa_avail).sum(axis=1)) * np.int64(
            acc.max_ref_count
        )
        out[excl] = avail[excl] // r
        return out

    # Reserve -------------------------------------------------------------------------------------------------
    def reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        req = cpu_request(cycle, request.workload, request.shape)
        acc = self.accounts
        affinity = cycle.get(NUMA_AFFINITY)
        if affinity is not None and affinity.node != node:
            affinity = None
        cfg = acc.config[node]
        if req.exclusive_on(cfg.kubelet_static):
            # The cpuset is a pure function of these (see `_allocate`); nodes of one shape pass
            # through the same free sets again and again, so decisions are memoized.
            key = (
                req,
                cfg,
                acc.topo[node],
                acc.available(node),
                acc.reserved[node],
                acc.allocated(node, relevant_only=True),
                acc.max_ref_count,
                acc.view(node),
                None if affinity is None else (affinity.numa, affinity.required),
            )
            outcome = self._exclusive.get(key)
            if outcome is None:
                if len(self._exclusive) >= _EXCLUSIVE_LIMIT:
                    self._exclusive.clear()
                outcome = self._exclusive[key] = self._exclusive_offer(req, node, affinity)
            if isinstance(outcome, Status):
                return outcome
            cycle.write(CPU_OFFER, CPUOffer(node, *outcome))
            return SUCCESS
        if req.qos == "LS" and (req.constrained_burst or (affinity is not None and affinity.required)):
            pools = self._shared_pools(req, node, affinity)
            if not pools:
                return Status.unschedulable(NO_SHARED_POOL)
            cycle.write(CPU_OFFER, CPUOffer(node, CPUSet(), "None", (), pools))
            return SUCCESS
        cycle.delete(CPU_OFFER)
        return SUCCESS

    def _exclusive_offer(
        self, req: CPURequest, node: int, affinity: NUMAAffinity | None
    ) -> Status | tuple[CPUSet, str, tuple[tuple[int, int], ...], tuple[SharedPool, ...]]:
        """An exclusive workload's CPUOffer fields on `node` (all but the node), or why there is none."""
        try:
            cpuset = self._allocate(req, node, affinity)
        except CPUAllocationError as exc:
            return Status.unschedulable(str(exc))
        topo = self.accounts.topo[node]
        assert topo is not None
        per_numa: dict[int, int] = {}
        for cpu in cpuset:
            nid = topo.numa_ids[topo.numa_of[cpu]]
            per_numa[nid] = per_numa.get(nid, 0) + 1000
        policy = req.exclusive_policy or self.default_exclusive
        return cpuset, policy, tuple(sorted(per_numa.items())), ()

    def unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        offer = cycle.get(CPU_OFFER)
        if offer is not None and offer.node == node:
            cycle.delete(CPU_OFFER)

    def _allocate(self, req: CPURequest, node: int, affinity: NUMAAffinity | None) -> CPUSet:
        """The exact cpuset on `node` (raises CPUAllocationError when there is none)."""
        acc = self.accounts
        topo, cfg = acc.topo[node], acc.config[node]
        if topo is None:
            raise InsufficientCPUs(NO_TOPOLOGY)
        if cfg.problems:
            raise InsufficientCPUs(f"{BAD_NODE_POLICY}: {'; '.join(cfg.problems)}")
        bind, required = self._bind_policy(req, node)
        strategy = cfg.numa_strategy or self.strategy
        available = acc.available(node)
        hint = sorted(affinity.numa) if affinity is not None else None
        if affinity is not None and not affinity.required and set(affinity.numa) >= set(topo.numa_ids):
            hint = None  # a preferred "any NUMA node" hint says nothing
        if cfg.kubelet_mode and not req.required_bind:
            cpuset = kubelet_static_allocate(
                topo,
                available,
                req.cpus,
                reserved=acc.reserved[node],
                full_pcpus_only=cfg.full_pcpus_only,
                numa_hint=hint,
                align_by_socket=cfg.align_by_socket,
                distribute_across_numa=cfg.distribute_across_numa,
                distribute_across_cores=cfg.distribute_across_cores,
            )
        elif strategy == DISTRIBUTE_EVENLY and hint is None:
            pool = filter_required(topo, available, bind) if required else available
            group = topo.cpus_per_core if bind == FULL_PCPUS else 1
            cpuset = kubelet_take_by_topology(topo, pool, req.cpus, distribute_across_numa=True, cpu_group_size=group)
            if required and not satisfies_required(topo, cpuset, bind):
                raise InsufficientCPUs("node(s) cannot satisfy the required cpu bind policy")
        else:
            cpuset = self._koordinator(req, node, bind, required, strategy, available, hint, affinity)
        aligned = topo.cpus_in_numa_ids(affinity.numa) if affinity is not None and affinity.required else None
        if aligned is not None and not all(cpu in aligned for cpu in cpuset):
            raise InsufficientCPUs(f"cannot align {req.cpus} CPUs to NUMA node(s) {sorted(affinity.numa)}")
        return cpuset

    def _koordinator(
        self,
        req: CPURequest,
        node: int,
        bind: str,
        required: bool,
        strategy: str,
        available: frozenset[int],
        hint: list[int] | None,
        affinity: NUMAAffinity | None,
    ) -> CPUSet:
        acc = self.accounts
        topo = acc.topo[node]
        assert topo is not None
        if required and bind == FULL_PCPUS and req.cpus % topo.cpus_per_core:
            raise SMTAlignmentError(req.cpus, topo.cpus_per_core)
        options: dict[str, Any] = {
            "exclusive_policy": req.exclusive_policy or self.default_exclusive,
            "numa_strategy": strategy if strategy != DISTRIBUTE_EVENLY else LEAST_ALLOCATED,
            "allocated": acc.allocated(node, relevant_only=True),
            "max_ref_count": acc.max_ref_count,
        }
        if hint is not None:
            free_milli, _ = acc.numa_free(node)
            numa_free = {n: max(0, m) // 1000 for n, m in free_milli.items()}
            try:
                return allocate_cpus(
                    topo, available, req.cpus, bind_policy=bind, required=required, numa_hint=hint,
                    numa_free_cpus=numa_free, **options,
                )  # fmt: skip
            except InsufficientCPUs:
                if affinity is not None and affinity.required:
                    raise
        return allocate_cpus(topo, available, req.cpus, bind_policy=bind, required=required, **options)

    def _bind_policy(self, req: CPURequest, node: int) -> tuple[str, bool]:
        """(bind policy, required): workload-required, else node-required, else preferred, else default."""
        node_required = self.accounts.config[node].required_bind
        if req.required_bind in BIND_POLICIES:
            if node_required and node_required != req.required_bind:
                raise InsufficientCPUs(BIND_CONFLICT)
            return req.required_bind, True
        if node_required:
            return node_required, True
        return (req.preferred_bind if req.preferred_bind in BIND_POLICIES else self.default_bind), False

    def _shared_pools(self, req: CPURequest, node: int, affinity: NUMAAffinity | None) -> tuple[SharedPool, ...]:
        """The NUMA shared pools an LS workload binds to: the required affinity's nodes, or for
        ConstrainedBurst one NUMA node whose shared pool holds the workload's CPU limit
        (chosen by the NUMA allocate strategy: MostAllocated = the smallest pool that fits)."""
        acc = self.accounts
        topo = acc.topo[node]
        if topo is None:
            return ()
        socket = {nid: topo.socket_ids[topo.numa_sockets[k][0]] for k, nid in enumerate(topo.numa_ids)}
        candidates = [n for n in topo.numa_ids if affinity is None or n in affinity.numa]
        if not req.constrained_burst:
            return tuple((socket[n], n) for n in candidates)
        shared = acc.pools(node).numa_shared
        fits = [n for n in candidates if len(shared[n]) * 1000 >= req.cpu_limit_milli]
        if not fits:
            return ()
        most = (acc.config[node].numa_strategy or self.strategy) == MOST_ALLOCATED
        best = min(fits, key=lambda n: ((len(shared[n]) if most else -len(shared[n])), n))
        return ((socket[best], best),)

    # PreBind -------------------------------------------------------------------------------------------------
    def pre_bind(self, cycle: CycleState, request: ScheduleRequest, node: int, binding: Binding) -> Binding:
        offer = cycle.get(CPU_OFFER)
        if offer is None or offer.node != node:
            return binding
        # NUMAAlign leaves its grants to this pre_bind when both have an offer here (one copy).
        numa_offer = cycle.get(NUMA_OFFER)
        numa_grants = numa_offer.grants if numa_offer is not None and numa_offer.node == node else None
        status = binding.annotations.get(ANNOTATION_RESOURCE_STATUS)
        # What the binding gains is a pure function of the offers and of the fields it reads;
        # the same cpusets and grants recur (see `reserve`), and rendering them costs more
        # than this key: memoized as (updated fields, resource-status annotation).
        key = (offer.cpuset, offer.exclusive_policy, offer.numa_cpu, offer.shared_pools, numa_grants)
        key += (binding.numa, binding.cpuset, binding.cpu_exclusive_policy, status)
        hit = self._bound.get(key)
        if hit is None:
            pools = offer.shared_pools if offer.shared_pools else None
            update = self._update(binding, offer, numa_grants)
            done = with_resource_status(binding, pools, **update)
            if len(self._bound) >= _EXCLUSIVE_LIMIT:
                self._bound.clear()
            self._bound[key] = (update, done.annotations.get(ANNOTATION_RESOURCE_STATUS))
            return done
        # What with_resource_status does, from the remembered fields and annotation.
        update, status = hit
        annotations = {k: v for k, v in binding.annotations.items() if k != ANNOTATION_RESOURCE_STATUS}
        if status is not None:
            annotations[ANNOTATION_RESOURCE_STATUS] = status
        return fast_copy(binding, {**update, "annotations": annotations})

    @staticmethod
    def _update(binding: Binding, offer: CPUOffer, numa_grants: Any) -> dict[str, Any]:
        """The binding fields the offers set: cpuset and exclusive policy, NUMA grants (cpu and NUMAAlign's)."""
        grants = {n: dict(g) for n, g in numa_grants} if numa_grants is not None else {}
        for n, milli in offer.numa_cpu:
            grants.setdefault(n, {})["cpu"] = grants.get(n, {}).get("cpu", 0) + milli
        update: dict[str, Any] = {"numa": merge_numa_grants(binding.numa, grants)} if grants else {}
        if offer.cpuset:
            update |= {"cpuset": offer.cpuset, "cpu_exclusive_policy": offer.exclusive_policy}
        return update
