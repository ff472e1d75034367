"""The console's overview, computed from the leader's state: resources, GPU fragmentation, why work waits, tenants.

Everything is read under the loop's lock in one short step (`OverviewInput.capture`: array sums
and copies, the queue's waiting units, the tenants' usage), then shaped outside it, so a console
open on a 10,000-node cluster costs the scheduling loop milliseconds per refresh.

GPU fragmentation is the measure of the simulator and the FGD scorer (Weng et al., ATC 2023;
`plugins/fragmentation/index.py`): of the idle GPU capacity, the part that the typical request
can no longer use (a GPU with 30 % free cannot serve a request for 50 %; a node with free GPUs but
no free CPU cannot serve any). The typical request is learned from what runs and waits now: the
GPU shapes (cpu, GPUs, share of each) covering 95 % of the GPU workloads, as the simulator's
target workload is learned from its trace; with no GPU workload yet, one whole GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding
from finesched.model.resources import (
    CPU,
    GPU,
    GPU_CORE,
    MEMORY,
    PODS,
    human_amount,
    resource_kind,
    translate_gpu_shortcuts,
)
from finesched.model.topology import Topology
from finesched.model.workload import Workload
from finesched.plugins.deviceshare.request import InvalidDeviceRequest, normalize_device_request
from finesched.plugins.fragmentation.index import accessible, fragment_terms
from finesched.plugins.fragmentation.target import GPU_MODEL_LABEL, MILLI, TargetWorkload
from finesched.sched.queue import QueuedUnit, SchedulingQueue
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from finesched.state.devices import device_accounts
from finesched.state.topology import DomainIndex

IntArray = npt.NDArray[np.int64]
#: At most this many bindings are read to learn the typical GPU request (an even sample beyond).
TYPICAL_SAMPLE = 20_000
#: The typical request when no GPU workload runs or waits: one whole GPU.
WHOLE_GPU = TargetWorkload.from_specs([{"cpu": 0, "gpuCount": 1, "gpuMilli": MILLI, "count": 1}])


def gpu_core_rows(state: ClusterState) -> tuple[IntArray, IntArray] | None:
    """[n] each node's healthy GPU core (percent of one card, summed over its cards) in all and free;
    None when no node has GPUs with a core dimension. Views of the live arrays: copy to keep."""
    accounts = device_accounts(state)
    gpu = accounts.types.get(GPU) if accounts is not None else None
    if gpu is None or GPU_CORE not in gpu.dim_index:
        return None
    k, n = gpu.dim_index[GPU_CORE], state.n
    return gpu.htotal[k, :n], gpu.hfree[k, :n]


@dataclass
class Waiting:
    """One pending unit as the overview needs it: its workloads, tenant and why it waits."""

    keys: list[str]
    tenant: str
    reasons: dict[str, int]  # reason -> nodes it applies to (0: not about nodes)


@dataclass
class OverviewInput:
    """What the overview reads from the leader's state, captured in one step under the loop's lock."""

    nodes: int
    resources: list[tuple[str, int, int]]  # (name, allocatable, free)
    percent_dims: frozenset[str]  # device dimensions counted in percent of one device
    gpu_free_pct: IntArray  # [n, D] free gpu-core percent per healthy GPU slot (0 elsewhere)
    cpu_free_milli: IntArray  # [n]
    gpu_models: list[str]
    bindings: list[Binding]  # a sample, for the typical request
    waiting: list[Waiting]
    queued: list[Workload]
    tenants: dict[str, dict[str, Any]]  # name -> {weight, usage, share, min, max, quota}

    @classmethod
    def capture(cls, scheduler: Scheduler, queued: Iterable[Workload], tenant: str | None = None) -> OverviewInput:
        """Read everything the overview needs; the caller holds the loop's lock. With `tenant`, the
        bindings and queued workloads (what the typical request is learned from) are that tenant's
        own: a tenant learns nothing of the shapes or counts of the others' work."""
        state, n = scheduler.state, scheduler.state.n
        resources = [
            (name, int(state.allocatable[i].sum()), int(state.free[i].sum())) for i, name in enumerate(state.resources)
        ]
        devices = device_accounts(state)
        types = devices.types if devices is not None else {}
        percent: set[str] = set()
        for acc in types.values():
            for k, dim in enumerate(acc.dims):
                resources.append((dim, int(acc.htotal[k, :n].sum()), int(acc.hfree[k, :n].sum())))
                if resource_kind(dim) == "count":
                    percent.add(dim)
        gpu = types.get(GPU)
        if gpu is not None and GPU_CORE in gpu.dim_index:
            free = np.where(gpu.healthy[:n], gpu.free[gpu.dim_index[GPU_CORE], :n], 0)
        else:
            free = np.zeros((n, 0), dtype=np.int64)
        held = list(state.bindings.values())
        if tenant is not None:
            held = [b for b in held if b.tenant == tenant]
            queued = [w for w in queued if w.tenant == tenant]
        bindings = held[:: max(1, len(held) // TYPICAL_SAMPLE)]
        queue = scheduler.queue
        names = set(queue.quotas.tenants) | set(scheduler.usage.tenants())
        tenants = {name: _tenant_figures(scheduler, name) for name in sorted(names)}
        return cls(
            nodes=n,
            resources=resources,
            percent_dims=frozenset(percent),
            gpu_free_pct=free.astype(np.int64),
            cpu_free_milli=state.free[state.res_index[CPU]].copy(),
            gpu_models=[node.labels.get(GPU_MODEL_LABEL, "") for node in state.nodes] if gpu is not None else [],
            bindings=bindings,
            waiting=[_waiting(queue, unit, why) for unit, why in queue.waiting()],
            queued=list(queued),
            tenants=tenants,
        )


def _tenant_figures(scheduler: Scheduler, name: str) -> dict[str, Any]:
    queue = scheduler.queue
    tenant = queue.quotas.tenants.get(name)
    return {
        "weight": tenant.weight if tenant is not None else 1.0,
        "usage": {k: v for k, v in queue.usage(name).items() if v},
        "dominantShare": queue.dominant_share(name),
        "min": queue.quotas.min.get(name, {}),
        "max": queue.quotas.max.get(name, {}),
        "quota": queue.quotas.hard.get(name, {}),
        "parent": tenant.parent if tenant is not None else None,
    }


def _waiting(queue: SchedulingQueue, unit: QueuedUnit, why: str) -> Waiting:
    """Why a queued unit waits, as the loop writes it (server/loop/upkeep.py), with the per-reason node counts."""
    keys = [w.key for w in unit.workloads]
    if why == "unschedulable" and unit.last_error is not None:
        reasons = dict(unit.last_error.reasons) or {unit.last_error.message: 0}
    elif why == "quota":
        never = queue.quotas.never_admits(unit.tenant, unit.demand) is not None
        reasons = {f"tenant {unit.tenant}: {'over its quota by itself' if never else 'at its quota'}": 0}
    elif why == "gang":
        gang = unit.workloads[0].gang
        reasons = {f"gang incomplete ({len(keys)}/{gang.min_member if gang else '?'} members)": 0}
    else:  # in its tenant's line: grouped per tenant (where each stands is in its own reason)
        reasons = {f"queued in tenant {unit.tenant}, not tried yet": 0}
    return Waiting(keys, unit.tenant, reasons)


# Shaping (outside the lock) -------------------------------------------------------------------------------
def resources_view(data: OverviewInput) -> list[dict[str, Any]]:
    """Per resource class with capacity: allocatable, allocated (in use) and free, raw and for people."""
    out = []
    for name, allocatable, free in data.resources:
        if allocatable <= 0:
            continue
        allocated = allocatable - free
        out.append(
            {
                "name": name,
                "allocatable": allocatable,
                "allocated": allocated,
                "free": free,
                "device": name in data.percent_dims,
                "shown": {k: amount_text(name, v, data.percent_dims) for k, v in
                          (("allocatable", allocatable), ("allocated", allocated), ("free", free))},
            }
        )  # fmt: skip
    return out


def amount_text(name: str, value: int, percent_dims: Collection[str]) -> str:
    """An amount as every view shows it (`human_amount`: "102500m", "463Gi", "1.5Ti"), except device
    dimensions counted in percent of one device (DESIGN.md units), shown as devices ("2.5" GPUs of
    gpu-core)."""
    if name in percent_dims:
        text = f"{value / 100:,.2f}"
        return text.rstrip("0").rstrip(".")
    return human_amount(name, value)


def typical_request(bindings: Iterable[Binding], queued: Iterable[Workload]) -> tuple[TargetWorkload, bool]:
    """The GPU shapes covering 95 % of the GPU workloads bound and queued (False: none, one whole GPU)."""
    counts: Counter[tuple[int, int, int, str]] = Counter()
    for binding in bindings:
        grants = binding.devices.get(GPU) or ()
        if grants:
            core = max(g.resources.get(GPU_CORE, 0) for g in grants)
            counts[(binding.requests.get(CPU, 0), core * MILLI // 100, len(grants), "")] += 1
    for workload in queued:
        try:
            request = normalize_device_request(workload.requests).types.get(GPU)
        except InvalidDeviceRequest:
            continue
        if request is not None:
            core = request.per_device.get(GPU_CORE, 0)
            counts[(workload.requests.get(CPU, 0), core * MILLI // 100, request.count, "")] += 1
    if not counts:
        return WHOLE_GPU, False
    return TargetWorkload.from_counts(counts), True


def fragmentation(
    data: OverviewInput, target: TargetWorkload, learned: bool, learned_from: str = "cluster"
) -> dict[str, Any] | None:
    """Idle GPU capacity and the part of it the typical request can no longer use (None: no GPUs);
    `learned_from` says whose work the typical request was learned from ("cluster" or "tenant")."""
    if data.gpu_free_pct.shape[1] == 0:
        return None
    gpu_free = data.gpu_free_pct * (MILLI // 100)
    acc = accessible(data.gpu_models, target)
    frag = fragment_terms(data.cpu_free_milli, gpu_free, acc, target) @ target.counts / max(target.total, 1)
    idle, fragmented = int(gpu_free.sum()), float(frag.sum())
    return {
        "idleGPUs": idle / MILLI,
        "fragmentedGPUs": round(fragmented / MILLI, 3),
        "usableGPUs": round((idle - fragmented) / MILLI, 3),
        "fragmentedShare": round(fragmented / idle, 4) if idle else 0.0,
        "typical": target.to_specs(),
        "typicalLearned": learned,
        "typicalFrom": learned_from,
    }


def pending_by_reason(waiting: Iterable[Waiting], visible: set[str] | None) -> list[dict[str, Any]]:
    """Pending workloads grouped by the scheduler's reasons: how many workloads each blocks, on how many
    nodes (the largest count among them), and a few of them; only workloads in `visible` (None: all)."""
    groups: dict[str, dict[str, Any]] = {}
    for unit in waiting:
        keys = [k for k in unit.keys if visible is None or k in visible]
        if not keys:
            continue
        for reason, nodes in unit.reasons.items():
            group = groups.setdefault(reason, {"reason": reason, "workloads": 0, "nodes": 0, "examples": []})
            group["workloads"] += len(keys)
            group["nodes"] = max(group["nodes"], nodes)
            group["examples"] = (group["examples"] + keys)[:5]
    return sorted(groups.values(), key=lambda g: (-g["workloads"], g["reason"]))


def pending_total(waiting: Iterable[Waiting], visible: set[str] | None) -> int:
    """How many pending workloads there are (of those in `visible`; None: all)."""
    return sum(1 for unit in waiting for key in unit.keys if visible is None or key in visible)


def tenants_view(data: OverviewInput, visible: set[str] | None) -> list[dict[str, Any]]:
    """Each visible tenant's dominant share, weighted share, what it holds, min/max/quota and what it
    borrows (held above its `min`, per resource; elastic quotas, README "Preemption and elastic quotas")."""
    out = []
    for name, t in data.tenants.items():
        if visible is not None and name not in visible:
            continue
        usage = translate_gpu_shortcuts(t["usage"])
        borrowed = {r: usage.get(r, 0) - floor for r, floor in t["min"].items() if usage.get(r, 0) > floor}
        if t["min"]:  # a resource the min does not name is guaranteed none of
            borrowed.update({r: v for r, v in usage.items() if r not in t["min"] and r != PODS and v > 0})
        out.append(
            {
                "name": name,
                "weight": t["weight"],
                "dominantShare": round(t["dominantShare"], 4),
                "weightedShare": round(t["dominantShare"] / t["weight"], 4),
                "parent": t["parent"],
                **{key: _shown(t[key], data.percent_dims) for key in ("usage", "min", "max", "quota")},
                "borrowed": _shown(borrowed, data.percent_dims),
            }
        )
    return out


def _shown(amounts: Mapping[str, int], percent_dims: Collection[str]) -> dict[str, str]:
    return {name: amount_text(name, value, percent_dims) for name, value in amounts.items() if value}


# The node map grouped by a topology's domains ------------------------------------------------------------
#: The amounts a domain box shows: cpu and memory from the node arrays, whole GPUs from gpu-core.
DOMAIN_RESOURCES = (CPU, MEMORY)


@dataclass
class DomainInput:
    """One level of a topology over the nodes, captured under the loop's lock: the (cached, never
    written) domain index and copies of the per-node amounts the boxes sum (allocatable, free)."""

    topology: str
    level: str
    depth: int
    index: DomainIndex
    amounts: dict[str, tuple[IntArray, IntArray]]  # resource -> ([n] allocatable, [n] free)

    @classmethod
    def capture(cls, state: ClusterState, index: DomainIndex, topology: Topology, depth: int) -> DomainInput:
        """The caller holds the loop's lock; `index` is the scheduler's (`TopologyPlacer.domains`)."""
        amounts = {r: (state.allocatable[state.res_index[r]].copy(), state.free[state.res_index[r]].copy())
                   for r in DOMAIN_RESOURCES if r in state.res_index}  # fmt: skip
        gpu_core = gpu_core_rows(state)
        if gpu_core is not None:
            amounts[GPU_CORE] = (gpu_core[0].astype(np.int64), gpu_core[1].astype(np.int64))
        return cls(topology.name, topology.labels[depth], depth, index, amounts)


def domains_view(data: DomainInput, position: IntArray, missing: int) -> dict[str, Any]:
    """The boxes of the grouped map: per domain of the level (in the index's order: by label values)
    its name, node count, allocatable and free amounts (raw: cpu in millicores, memory in bytes,
    gpu-core in percent of one GPU, as the API writes them) and its nodes as positions in the map's
    order (`position`: state slot -> position); `outside`: the positions of the nodes in no domain of
    the level (a missing label) and of the `missing` stored nodes the scheduler does not hold, which
    follow the state's nodes in the map."""
    index, depth = data.index, data.depth
    ids = index.ids[depth]
    nodes = index.sum(np.ones(index.n, dtype=np.int64), depth)
    # Python lists, not numpy scalars: a level may have one domain per node (10,000 boxes' figures).
    sums = {
        r: (index.sum(alloc, depth).tolist(), index.sum(free, depth).tolist())
        for r, (alloc, free) in data.amounts.items()
    }
    # The members of every domain in one pass: node positions sorted by (domain, position).
    inside = np.flatnonzero(ids >= 0)
    order = np.lexsort((position[inside], ids[inside]))
    members = position[inside][order].tolist()
    bounds = np.concatenate(([0], np.cumsum(nodes))).tolist()
    counts = nodes.tolist()
    domains = []
    for domain in range(index.count(depth)):
        domains.append(
            {
                "name": index.name(depth, domain),
                "nodes": counts[domain],
                "allocatable": {r: a[domain] for r, (a, _) in sums.items() if a[domain]},
                "free": {r: f[domain] for r, (a, f) in sums.items() if a[domain]},
                "members": members[bounds[domain] : bounds[domain + 1]],
            }
        )
    outside = np.sort(position[ids < 0]).tolist() + list(range(len(position), len(position) + missing))
    return {"topology": data.topology, "level": data.level, "domains": domains, "outside": outside}


def topologies_view(topologies: Mapping[str, Topology]) -> list[dict[str, Any]]:
    """The topologies the map can be grouped by, with their levels coarse to fine."""
    return [{"name": name, "levels": list(t.labels)} for name, t in sorted(topologies.items())]
