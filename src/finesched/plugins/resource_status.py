"""Koordinator's ``resource-status`` annotation, per-NUMA grants on a binding, and the per-node report.

* `resource_status` / `with_resource_status`: the JSON a pod carries after scheduling
  (``scheduling.koordinator.sh/resource-status``: ``cpuset`` as a Linux cpulist,
  ``cpuSharedPools`` [{socket, node}] for LS workloads bound to NUMA shared pools, and
  ``numaNodeResources`` [{node, resources}] with Kubernetes quantity strings).
* `node_report`: a NodeResourceTopology-like view of one node as plain data (zones
  ``node-<id>`` with capacity / allocatable / available, the kubelet policy, cpu topology,
  pod CPU allocations, shared and BE pools; PROTOCOLS.md sections 2 and 3), for the API, and
  ``unboundUse``: the cpu and memory the node's workloads hold outside their per-NUMA grants. An LS
  workload runs in the shared pool across NUMA nodes, so its memory is granted to no zone yet
  taken from the node: the zones alone looked free on a full node.
  (``finesched plan --show-nodes`` renders it as a table: `finesched.commands.plan.node_reports_table`.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from finesched.cpuset import CPUSet
from finesched.model.base import fast_construct, fast_copy
from finesched.model.binding import Binding, NUMAGrant
from finesched.model.resources import CPU, MEMORY, ResourceVector, koordinator_name
from finesched.quantity import format_quantity
from finesched.state.cluster import ClusterState

ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"

SharedPool = tuple[int, int]  # (socket id, NUMA id)
#: What ``json.dumps(obj, separators=(",", ":"))`` builds on every call, built once (same output).
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def resource_status(
    cpuset: CPUSet | None = None, numa: Iterable[NUMAGrant] = (), shared_pools: Iterable[SharedPool] = ()
) -> dict[str, Any]:
    """The resource-status object: only the fields that have something in them."""
    out: dict[str, Any] = {}
    if cpuset:
        out["cpuset"] = cpuset.format()
    pools = [{"socket": s, "node": n} for s, n in shared_pools]
    if pools:
        out["cpuSharedPools"] = pools
    ordered = sorted(numa, key=lambda g: g.numa)
    grants = [{"node": g.numa, "resources": _quantities(tuple(g.resources.items()))} for g in ordered if g.resources]
    if grants:
        out["numaNodeResources"] = grants
    return out


@lru_cache(maxsize=4096)
def _quantities(items: tuple[tuple[str, int], ...]) -> dict[str, str]:
    """Koordinator names and quantity strings, memoized on the items (the same amounts recur; the
    dict is only ever serialized)."""
    return {koordinator_name(k): v for k, v in ResourceVector(dict(items)).to_quantities().items()}


def shared_pools_of(binding: Binding) -> tuple[SharedPool, ...]:
    """The cpuSharedPools already recorded in the binding's resource-status annotation."""
    text = binding.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not text:
        return ()
    return tuple((int(p["socket"]), int(p["node"])) for p in json.loads(text).get("cpuSharedPools", ()))


def with_resource_status(binding: Binding, shared_pools: Iterable[SharedPool] | None = None, **updates: Any) -> Binding:
    """`binding` with `updates` (field values) applied and its resource-status annotation rendered
    from the resulting cpuset and NUMA grants, in one copy.

    `shared_pools` replaces the recorded cpuSharedPools when given (else they are kept), so
    the CPU and NUMA plugins can each call this in pre_bind, in either order.
    """
    pools = shared_pools_of(binding) if shared_pools is None else tuple(shared_pools)
    status = resource_status(updates.get("cpuset", binding.cpuset), updates.get("numa", binding.numa), pools)
    annotations = {k: v for k, v in binding.annotations.items() if k != ANNOTATION_RESOURCE_STATUS}
    if status:
        annotations[ANNOTATION_RESOURCE_STATUS] = _COMPACT_JSON.encode(status)
    return fast_copy(binding, {**updates, "annotations": annotations})


def merge_numa_grants(grants: Iterable[NUMAGrant], add: Mapping[int, Mapping[str, int]]) -> tuple[NUMAGrant, ...]:
    """`grants` plus `add` ({NUMA id: {resource: amount}}), one grant per NUMA node, ascending."""
    merged: dict[int, dict[str, int]] = {}
    for g in grants:
        merged.setdefault(g.numa, {}).update(g.resources)
    for numa, amounts in add.items():
        slot = merged.setdefault(numa, {})
        for name, amount in amounts.items():
            if amount:
                slot[name] = slot.get(name, 0) + amount
    # fast_construct: every field given, as model_construct(numa=..., resources=...) would set them.
    return tuple(
        fast_construct(NUMAGrant, {"numa": n, "resources": ResourceVector(merged[n])})
        for n in sorted(merged)
        if merged[n]
    )


# The per-node report ---------------------------------------------------------------------------------------


def node_report(state: ClusterState, name: str) -> dict[str, Any]:
    """A NodeResourceTopology-like view of node `name` (plain JSON-able data; quantities as strings)."""
    from finesched.state.cpus import CPUAccounts

    node = state.node(name)
    i = state.index[name]
    accounts = state.extras.get("cpus")
    cpus = accounts if isinstance(accounts, CPUAccounts) else None
    bindings = state.bindings_on(name)
    report: dict[str, Any] = {
        "name": name,
        "topologyPolicies": [cpus.config[i].numa_policy if cpus else (node.policies.numa_topology_policy or "None")],
        "kubeletCPUManagerPolicy": {
            "policy": node.kubelet.cpu_manager_policy,
            "options": {k: str(v).lower() for k, v in node.kubelet.options.items()},
            "reservedCPUs": str(CPUSet(cpus.reserved[i])) if cpus else str(node.kubelet.reserved_cpus),
        },
        "cpuTopology": [
            {"id": c.id, "core": c.core, "socket": c.socket, "node": c.numa}
            for c in (node.cpu_topology.cpus if node.cpu_topology else ())
        ],
        "podCPUAllocs": [
            {"namespace": b.workload.split("/", 1)[0], "name": b.workload.split("/", 1)[-1], "cpuset": str(b.cpuset)}
            for b in bindings
            if b.cpuset
        ],
        "zones": _zones(node.numa_ids, cpus, i, node),
        "unboundUse": unbound_use(bindings),
    }
    if cpus is not None and cpus.topo[i] is not None:
        topo = cpus.topo[i]
        assert topo is not None
        pools = cpus.pools(i)
        sockets = {nid: topo.socket_ids[topo.numa_sockets[k][0]] for k, nid in enumerate(topo.numa_ids)}
        report["cpuSharedPools"] = [
            {"socket": sockets[nid], "node": nid, "cpuset": str(cs)} for nid, cs in pools.numa_shared.items()
        ]
        report["beCPUSharedPools"] = [
            {"socket": sockets[nid], "node": nid, "cpuset": str(pools.be & CPUSet(topo.numa_cpus[k]))}
            for k, nid in enumerate(topo.numa_ids)
        ]
        if cpus.config[i].problems:
            report["problems"] = list(cpus.config[i].problems)
    return report


def unbound_use(bindings: Iterable[Binding]) -> dict[str, str]:
    """cpu and memory the bindings hold beyond their per-NUMA grants (quantity strings): the LS
    shared pool's and BE's use, and memory an exclusive workload was not granted per zone."""
    out = {CPU: 0, MEMORY: 0}
    for binding in bindings:
        for name in out:
            granted = sum(g.resources.get(name, 0) for g in binding.numa)
            out[name] += max(binding.requests.get(name, 0) - granted, 0)
    return {CPU: format_quantity(out[CPU], "cpu"), MEMORY: format_quantity(out[MEMORY], "bytes")}


def _zones(numa_ids: tuple[int, ...], cpus: Any, i: int, node: Any) -> list[dict[str, Any]]:
    if cpus is None or not cpus.numa_ids[i]:
        return []
    a = cpus.arrays
    zones = []
    for k, nid in enumerate(cpus.numa_ids[i]):
        resources = []
        capacity = int(a["numa_cpus"][i, k]) * 1000 or int(a["numa_cpu_cap"][i, k])
        allocatable = int(a["numa_cpu_cap"][i, k])
        resources.append(_resource(CPU, capacity, allocatable, allocatable - int(a["numa_cpu_used"][i, k])))
        if a["mem_tracked"][i]:
            cap = int(a["numa_mem_cap"][i, k])
            resources.append(_resource(MEMORY, cap, cap, cap - int(a["numa_mem_used"][i, k])))
        zones.append({"name": f"node-{nid}", "type": "Node", "resources": resources})
    return zones


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, str]:
    kind = "cpu" if name == CPU else "bytes"
    return {
        "name": name,
        "capacity": format_quantity(capacity, kind),
        "allocatable": format_quantity(allocatable, kind),
        "available": format_quantity(available, kind),
    }
