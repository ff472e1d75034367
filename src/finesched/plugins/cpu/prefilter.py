"""The vectorized prefilters of CPUOrchestration and NUMAAlign (issue 5, deliverable 7).

Each check is a *necessary* condition of the exact step, so a node it rejects could not have
been used (the property tests hold reserve to that). Two paths compute the same answer:

* numpy over the batch (`NodeBatch.take`), for full evaluations of many nodes;
* plain Python over `CPUAccounts.view` for small batches: with the scheduler's per-shape memo a
  batch is usually the one or two nodes that changed since the last decision, where numpy's
  per-call cost (tens of calls, microseconds each) would dominate.

Both return ``{reason: (failed mask, code)}``; a node fails when any reason's mask covers it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from finesched.plugins.cpu.request import CPURequest
from finesched.sched.framework import BoolArray, Code, FilterResult, NodeBatch
from finesched.state.cpu_config import NUMA_POLICY_CODE
from finesched.state.cpus import CPUAccounts

NO_TOPOLOGY = "node(s) have no CPU topology for an exclusive cpuset"
BIND_CONFLICT = "node(s) cpu bind policy conflicts with the workload's required cpu bind policy"
SMT_ALIGNMENT = "node(s) SMT Alignment Error: requested cpus not multiple cpus per core"
NOT_ENOUGH_EXCLUSIVE = "insufficient CPUs for an exclusive cpuset"
BAD_NODE_POLICY = "node(s) have an invalid CPU/NUMA policy label"
NO_SHARED_POOL = "no NUMA node has a CPU shared pool big enough for ConstrainedBurst"
POLICY_MISMATCH = "node(s) NUMA Topology policy not match"
NO_NUMA = "node(s) report no NUMA topology"
SINGLE_NUMA = "node(s) cannot fit the request on a single NUMA node"
CODES = {
    NO_TOPOLOGY: Code.UNRESOLVABLE,
    BIND_CONFLICT: Code.UNRESOLVABLE,
    SMT_ALIGNMENT: Code.UNRESOLVABLE,
    NOT_ENOUGH_EXCLUSIVE: Code.UNSCHEDULABLE,
    BAD_NODE_POLICY: Code.UNRESOLVABLE,
    NO_SHARED_POOL: Code.UNSCHEDULABLE,
    POLICY_MISMATCH: Code.UNRESOLVABLE,
    NO_NUMA: Code.UNRESOLVABLE,
    SINGLE_NUMA: Code.UNSCHEDULABLE,
}
#: Batches up to this size take the plain-Python path.
SMALL_BATCH = 16
BIND_CODE = {"": 0, "FullPCPUs": 1, "SpreadByPCPUs": 2}
SINGLE = NUMA_POLICY_CODE["SingleNUMANode"]
RESTRICTED = NUMA_POLICY_CODE["Restricted"]

Checks = dict[str, tuple[BoolArray, Code]]


def filter_result(checks: Checks, n: int) -> FilterResult:
    """The FilterResult of `checks` over a batch of `n` nodes: a node passes when no check failed it."""
    mask = np.ones(n, dtype=bool)
    for failed, _ in checks.values():
        mask &= ~failed
    return FilterResult(mask, lambda: dict(checks))


#: Per requested device type: (count, [n, D] one instance fits on the device, [n, D] its NUMA id), batch rows.
#: The count is one int, or [n] per node (a deviceAllocateHint's ApplyForAll takes every matching device).
DeviceFits = Sequence[tuple["int | np.ndarray", np.ndarray, np.ndarray]]


def _count_at(count: int | np.ndarray, k: int) -> int:
    return count if isinstance(count, int) else int(count[k])


def exclusive_checks(acc: CPUAccounts, req: CPURequest, nodes: NodeBatch, small: int = SMALL_BATCH) -> Checks:
    """CPUOrchestration's conditions: exclusive requests need a CPU topology, valid policy labels,
    no bind-policy conflict, SMT alignment under required FullPCPUs and enough available CPUs
    (whole-core CPUs under required FullPCPUs, cores with a free CPU under required
    SpreadByPCPUs); ConstrainedBurst needs a NUMA shared pool holding the workload's CPU limit."""
    if nodes.n <= small:
        return _by_node(nodes, lambda k, i: _exclusive_reasons_memo(acc, req, i))
    n, take = nodes.n, nodes.take
    zero = np.zeros(n, dtype=bool)
    if req.exclusive:
        excl = np.ones(n, dtype=bool)
    elif req.static_exclusive:
        excl = take(acc.kubelet_static).copy()
    else:
        excl = zero
    out: Checks = {}
    if excl.any():
        r = req.cpus
        node_req = take(acc.required_bind)
        pod_req = BIND_CODE.get(req.required_bind, 0)
        effective = np.full(n, pod_req, dtype=np.int8) if pod_req else node_req
        has = take(acc.has_topo)
        smt = (effective == 1) & (r % take(acc.cpus_per_core) != 0)
        enough = np.where(
            effective == 1,
            take(acc.numa_whole).sum(axis=1) >= r,
            np.where(effective == 2, take(acc.numa_cores_free).sum(axis=1) >= r, take(acc.numa_avail).sum(axis=1) >= r),
        )
        conflict = (node_req != 0) & (node_req != pod_req) if pod_req else zero
        out[NO_TOPOLOGY] = (excl & ~has, CODES[NO_TOPOLOGY])
        out[BAD_NODE_POLICY] = (excl & take(acc.bad_config), CODES[BAD_NODE_POLICY])
        out[BIND_CONFLICT] = (excl & has & conflict, CODES[BIND_CONFLICT])
        out[SMT_ALIGNMENT] = (excl & has & smt, CODES[SMT_ALIGNMENT])
        out[NOT_ENOUGH_EXCLUSIVE] = (excl & has & ~smt & ~enough, CODES[NOT_ENOUGH_EXCLUSIVE])
    if req.constrained_burst and not req.exclusive:
        fits = ((take(acc.numa_shared) * 1000 >= req.cpu_limit_milli) & take(acc.numa_valid)).any(axis=1)
        out[NO_SHARED_POOL] = (~excl & ~fits, CODES[NO_SHARED_POOL])
    return out


def _exclusive_reasons(acc: CPUAccounts, req: CPURequest, i: int) -> list[str]:
    cfg, topo = acc.config[i], acc.topo[i]
    excl = req.exclusive_on(cfg.kubelet_static)
    out: list[str] = []
    if excl:
        node_req, pod_req = BIND_CODE[cfg.required_bind], BIND_CODE.get(req.required_bind, 0)
        effective = pod_req or node_req
        if topo is None:
            out.append(NO_TOPOLOGY)
        if cfg.problems:
            out.append(BAD_NODE_POLICY)
        if topo is not None:
            view = acc.view(i)
            if pod_req and node_req and node_req != pod_req:
                out.append(BIND_CONFLICT)
            smt = effective == 1 and req.cpus % topo.cpus_per_core != 0
            counts = view.whole if effective == 1 else view.cores_free if effective == 2 else view.avail
            if smt:
                out.append(SMT_ALIGNMENT)
            elif sum(counts) < req.cpus:
                out.append(NOT_ENOUGH_EXCLUSIVE)
    burst_fits = not req.constrained_burst or excl or any(s * 1000 >= req.cpu_limit_milli for s in acc.view(i).shared)
    if not burst_fits:
        out.append(NO_SHARED_POOL)
    return out


def usable_cpus(acc: CPUAccounts, req: CPURequest, rows: np.ndarray) -> np.ndarray:
    """[rows, K] CPUs an exclusive request may use per NUMA slot under each node's required bind policy."""
    pod_req = BIND_CODE.get(req.required_bind, 0)
    if pod_req:
        effective = np.full(len(rows), pod_req, dtype=np.int8)
    else:  # kubelet-mode nodes count any available CPU (the kubelet's own hints do)
        effective = np.where(acc.kubelet_mode[rows], 0, acc.required_bind[rows])
    return np.where(
        (effective == 1)[:, None],
        acc.numa_whole[rows],
        np.where((effective == 2)[:, None], acc.numa_cores_free[rows], acc.numa_avail[rows]),
    )


def usable_cpus_of(acc: CPUAccounts, req: CPURequest, i: int) -> tuple[int, ...]:
    """`usable_cpus` for one node, per NUMA slot."""
    cfg, view = acc.config[i], acc.view(i)
    effective = BIND_CODE.get(req.required_bind, 0) or (0 if cfg.kubelet_mode else BIND_CODE[cfg.required_bind])
    return view.whole if effective == 1 else view.cores_free if effective == 2 else view.avail


def numa_checks(
    acc: CPUAccounts, req: CPURequest, nodes: NodeBatch, devices: DeviceFits = (), small: int = SMALL_BATCH
) -> Checks:
    """NUMAAlign's conditions: a workload policy that differs from the node's is a mismatch;
    Restricted / SingleNUMANode need NUMA nodes; SingleNUMANode needs one NUMA node holding the
    cpu, the memory and every device type's count at once (every provider must hint it)."""
    if nodes.n <= small:
        if not devices:
            return _by_node(nodes, lambda k, i: _numa_reasons_memo(acc, req, i))
        return _by_node(
            nodes, lambda k, i: _numa_reasons(acc, req, i, [(_count_at(c, k), w[k], d[k]) for c, w, d in devices])
        )
    n, take = nodes.n, nodes.take
    node_policy = take(acc.numa_policy)
    out: Checks = {}
    pod = NUMA_POLICY_CODE.get(req.numa_policy, 0) if req.numa_policy else 0
    if pod:
        out[POLICY_MISMATCH] = ((node_policy != 0) & (node_policy != pod), CODES[POLICY_MISMATCH])
        policy = np.where((node_policy == pod) | (node_policy == 0), pod, -1)
    else:
        policy = node_policy
    strict = (policy == RESTRICTED) | (policy == SINGLE)
    out[NO_NUMA] = (strict & ~take(acc.numa_valid).any(axis=1), CODES[NO_NUMA])
    single = policy == SINGLE
    if not single.any():
        return out
    rows = np.flatnonzero(single)  # positions within the batch
    node_rows = rows if nodes.index is None else nodes.index[rows]  # state indices
    ok = acc.numa_valid[node_rows].copy()
    if req.cpu_milli > 0:
        free = acc.numa_cpu_cap[node_rows] - acc.numa_cpu_used[node_rows]
        excl = np.ones(len(rows), dtype=bool) if req.exclusive else acc.kubelet_static[node_rows] & req.static_exclusive
        usable = np.where(excl[:, None], np.minimum(free, 1000 * usable_cpus(acc, req, node_rows)), free)
        ok &= (usable >= req.cpu_milli) | ~acc.has_topo[node_rows][:, None]
    if req.memory > 0:
        mem = acc.numa_mem_cap[node_rows] - acc.numa_mem_used[node_rows]
        ok &= (mem >= req.memory) | ~acc.mem_tracked[node_rows][:, None]
    numa_id = acc.numa_id[node_rows]
    for count, where, dev_numa in devices:
        same = where[rows][:, None, :] & (dev_numa[rows][:, None, :] == numa_id[:, :, None])
        ok &= same.sum(axis=2) >= (count if isinstance(count, int) else count[rows][:, None])
    failed = np.zeros(n, dtype=bool)
    failed[rows] = ~ok.any(axis=1)
    out[SINGLE_NUMA] = (failed, CODES[SINGLE_NUMA])
    return out


def _numa_reasons(
    acc: CPUAccounts, req: CPURequest, i: int, devices: Sequence[tuple[int, np.ndarray, np.ndarray]]
) -> list[str]:
    node_policy = NUMA_POLICY_CODE[acc.config[i].numa_policy]
    pod = NUMA_POLICY_CODE.get(req.numa_policy, 0) if req.numa_policy else 0
    out: list[str] = []
    policy = node_policy
    if pod:
        if node_policy not in (0, pod):
            out.append(POLICY_MISMATCH)
        policy = pod if node_policy in (0, pod) else -1
    view = acc.view(i)
    if policy in (RESTRICTED, SINGLE) and not view.numa_ids:
        out.append(NO_NUMA)
    if policy != SINGLE:
        return out
    k = len(view.numa_ids)
    ok = [True] * k
    if req.cpu_milli > 0 and acc.topo[i] is not None:
        free = view.cpu_free
        if req.exclusive_on(acc.config[i].kubelet_static):
            free = tuple(min(f, 1000 * u) for f, u in zip(free, usable_cpus_of(acc, req, i), strict=True))
        ok = [o and f >= req.cpu_milli for o, f in zip(ok, free, strict=True)]
    if req.memory > 0 and view.mem_free is not None:
        ok = [o and m >= req.memory for o, m in zip(ok, view.mem_free, strict=True)]
    for count, where, dev_numa in devices:
        fitting = [numa for fit, numa in zip(where.tolist(), dev_numa.tolist(), strict=True) if fit]
        per_numa = [fitting.count(nid) for nid in view.numa_ids]  # a few devices: Python beats numpy calls
        ok = [o and c >= count for o, c in zip(ok, per_numa, strict=True)]
    if not any(ok):
        out.append(SINGLE_NUMA)
    return out


# Small-batch verdicts, memoized. Without devices a node's reasons depend only on the request,
# its config, its topology and its per-NUMA numbers (`CPUAccounts.view`, a new object whenever
# the node changes); nodes of one shape pass through the same numbers again and again, and
# hashing those small tuples costs a fraction of deciding. Bounded; cleared when full.
_REASONS: dict[tuple[object, ...], Sequence[str]] = {}
_REASONS_LIMIT = 8192


def _remember(key: tuple[object, ...], compute: Callable[[], list[str]]) -> Sequence[str]:
    hit = _REASONS.get(key)
    if hit is None:
        if len(_REASONS) >= _REASONS_LIMIT:
            _REASONS.clear()
        hit = _REASONS[key] = tuple(compute())
    return hit


def _exclusive_reasons_memo(acc: CPUAccounts, req: CPURequest, i: int) -> Sequence[str]:
    key = ("exclusive", req, acc.config[i], acc.topo[i], acc.view(i))
    return _remember(key, lambda: _exclusive_reasons(acc, req, i))


def _numa_reasons_memo(acc: CPUAccounts, req: CPURequest, i: int) -> Sequence[str]:
    return _remember(("numa", *numa_inputs(acc, req, i)), lambda: _numa_reasons(acc, req, i, ()))


def numa_inputs(acc: CPUAccounts, req: CPURequest, i: int) -> tuple[object, ...]:
    """Everything NUMA alignment reads of node `i` for `req` without devices, as a memo key.

    The request, the node's config, whether it has a CPU topology, and the per-NUMA numbers the
    cpu and memory providers read: capacity and free cpu, the CPUs an exclusive request may use
    (exclusive requests only) and memory. Narrower than the whole `NodeView`, so nodes that
    differ only in what alignment ignores (e.g. their shared pools) share decisions.
    """
    view, cfg = acc.view(i), acc.config[i]
    usable = usable_cpus_of(acc, req, i) if req.exclusive_on(cfg.kubelet_static) else None
    return (req, cfg, acc.topo[i] is not None, view.numa_ids, view.cpu_cap, view.cpu_free, usable, view.mem_cap,
            view.mem_free)  # fmt: skip


def _by_node(nodes: NodeBatch, reasons_of: Callable[[int, int], Sequence[str]]) -> Checks:
    """Checks from `reasons_of(batch position, state index)`, the small-batch path."""
    out: Checks = {}
    for k in range(nodes.n):
        for reason in reasons_of(k, nodes.node(k)):
            if reason not in out:
                out[reason] = (np.zeros(nodes.n, dtype=bool), CODES[reason])
            out[reason][0][k] = True
    return out
