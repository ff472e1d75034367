"""CPUAccounts: per-node logical-CPU ownership, per-NUMA free amounts and the S3.2 pools.

Attached to a ClusterState as the extra named ``"cpus"`` (by the CPUOrchestration and NUMAAlign
plugins); the state keeps it in step with every node and binding change. What it holds:

* **Ownership.** A binding with a cpuset holds those CPUs exclusively; ``ref[i][p]`` counts the
  holders of the CPU at position p of node i, at most `max_ref_count` (Koordinator's maxRefCount,
  default 1). Each holder's exclusive policy and QoS is kept (``held[i]``) for the allocators
  (`allocated`) and the pools. Reserved CPUs (kubelet reservedCPUs, or its automatic
  reservation) are never held.
* **Pools (S3.2)**, recomputed after every assume/forget (lazily, on first read): the shared
  pool = CPUs not held by LSE/LSR (nor by any other cpuset, e.g. a kubelet-static Guaranteed
  workload), reserved CPUs included; the BE pool = CPUs not held by LSE-like holders (LSR CPUs
  are shareable with BE only); per-NUMA shared pools (ConstrainedBurst).
* **Vectorized arrays** for the filters, [nodes, NUMA slots] (slot k = the node's k-th NUMA id
  ascending): CPUs available for exclusive use, CPUs in wholly available cores, cores with an
  available CPU, shared-pool CPUs, cpu capacity/used in millicores and memory capacity/used in
  bytes (from the bindings' per-NUMA grants); per socket: available and whole-core CPUs.

Speed and memory: the per-CPU and per-core counts of a node are small ``array('h')`` rows read
and written from Python (a numpy call costs more than the whole update of one binding); only
the per-NUMA / per-socket aggregates, which the vectorized filters read over all nodes, are
numpy blocks, updated with one call per binding. Topology-derived data is shared through
`state/cpu_topology.topo_info` and node configs are interned: 10,000 nodes of 128 CPUs take
about 11 MB (measured with tracemalloc; about 1 KB a node).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from operator import sub
from typing import Any

import numpy as np

from finesched.cpuset import CPUSet
from finesched.hashed import HashedOnce
from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.resources import CPU, MEMORY
from finesched.state.cluster import StateError
from finesched.state.cpu_config import NUMA_POLICY_CODE, NodeCPUConfig, node_cpu_config, reserved_cpus
from finesched.state.cpu_topology import AllocatedCPU, TopoInfo, topo_info, trusted_cpuset
from finesched.state.pools import BE_SHAREABLE_QOS, split_cpus

#: One value per node: name -> (dtype, fill).
_NODE_ARRAYS: dict[str, tuple[Any, Any]] = {
    "has_topo": (np.bool_, False),
    "mem_tracked": (np.bool_, False),
    "cpus_per_core": (np.int64, 1),
    "required_bind": (np.int8, 0),  # 0 none, 1 FullPCPUs, 2 SpreadByPCPUs
    "kubelet_static": (np.bool_, False),
    "kubelet_mode": (np.bool_, False),
    "numa_policy": (np.int8, 0),  # index into config.NUMA_POLICIES
    "bad_config": (np.bool_, False),
}
#: Per-NUMA int64 rows, one [nodes, fields, NUMA slots] block (one slice reads a node's every
#: per-NUMA number); each also reads as an [nodes, K] view under its name. name -> fill.
_BLOCK: dict[str, int] = {
    "numa_id": -1,  # the NUMA id of each slot (-1: no such slot)
    "numa_cpus": 0,
    "numa_avail": 0,
    "numa_whole": 0,
    "numa_cores_free": 0,
    "numa_shared": 0,
    "numa_cpu_cap": 0,
    "numa_cpu_used": 0,
    "numa_mem_cap": 0,
    "numa_mem_used": 0,
}
_FIELD = {name: f for f, name in enumerate(_BLOCK)}
_AGGREGATES = [_FIELD[n] for n in ("numa_avail", "numa_whole", "numa_cores_free", "numa_shared")]
_F_CPU_USED, _F_MEM_USED = _FIELD["numa_cpu_used"], _FIELD["numa_mem_used"]
_F_CPU_CAP, _F_MEM_CAP = _FIELD["numa_cpu_cap"], _FIELD["numa_mem_cap"]
_SOCKETS = ("sock_avail", "sock_whole")  # [nodes, 2, socket slots] block
_BIND_CODE = {"": 0, "FullPCPUs": 1, "SpreadByPCPUs": 2}


@dataclass(frozen=True, slots=True)
class Hold:
    """What one binding holds on its node: CPUs (exclusive), and per-NUMA cpu/memory grants."""

    cpus: tuple[int, ...]
    exclusive_policy: str
    qos: str
    numa: tuple[tuple[int, int, int], ...]  # (NUMA id, cpu millicores, memory bytes)

    @property
    def be_shareable(self) -> bool:
        """LSR CPUs may be shared with BE; LSE and kubelet-static Guaranteed CPUs may not (S3.2)."""
        return self.qos in BE_SHAREABLE_QOS


@dataclass(frozen=True, slots=True)
class NodeView(HashedOnce):
    """One node's per-NUMA numbers as Python ints, per NUMA slot (ids ascending).

    The exact step and small filter batches read one or a few nodes, where numpy's per-call
    cost dominates; `CPUAccounts.view` builds this once per node change and caches it.
    """

    numa_ids: tuple[int, ...]
    avail: tuple[int, ...]  # CPUs an exclusive cpuset may take
    whole: tuple[int, ...]  # CPUs in wholly available cores
    cores_free: tuple[int, ...]  # cores with an available CPU
    shared: tuple[int, ...]  # CPUs in the shared pool
    cpu_cap: tuple[int, ...]  # millicores
    cpu_free: tuple[int, ...]  # millicores not granted to NUMA-bound workloads
    mem_cap: tuple[int, ...] | None  # bytes; None when the node has no per-NUMA memory
    mem_free: tuple[int, ...] | None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    __hash__ = HashedOnce.__hash__  # not the dataclass's: hashed once (finesched/hashed.py)


@dataclass(frozen=True, slots=True)
class NodePools:
    """A node's CPU pools (S3.2) and its exclusively held CPUs."""

    shared: CPUSet
    be: CPUSet
    numa_shared: dict[int, CPUSet]  # NUMA id -> shared-pool CPUs on it
    exclusive: CPUSet
    reserved: CPUSet


class CPUAccounts:
    """NodeExtra ``"cpus"`` (see the module docstring)."""

    name = "cpus"
    #: A binding without cpuset and NUMA grants holds nothing here (`_hold`): ClusterState skips
    #: this extra for plain scalar bindings (state/cluster.py, QUIET_FOR_PLAIN_SCALAR).
    quiet_for_plain_scalar = True

    def __init__(self, max_ref_count: int = 1):
        if max_ref_count < 1:
            raise ValueError(f"max_ref_count must be >= 1, got {max_ref_count}")
        self.max_ref_count = max_ref_count
        self._cap = 0
        self._k, self._s = 1, 1  # NUMA and socket slots per node
        #: Numpy rows by name (node arrays, and views into the NUMA and socket blocks); each also
        #: reads as an attribute (``accounts.numa_avail``).
        self.arrays: dict[str, np.ndarray] = {}
        self.block = np.zeros((0, len(_BLOCK), 1), dtype=np.int64)
        self.sock_block = np.zeros((0, len(_SOCKETS), 1), dtype=np.int64)
        self.topo: list[TopoInfo | None] = []
        self.config: list[NodeCPUConfig] = []
        self.reserved: list[frozenset[int]] = []
        self.numa_ids: list[tuple[int, ...]] = []
        self.held: list[dict[str, Hold]] = []
        self.ref: list[array | None] = []  # per CPU position: holders
        self.core_avail: list[array | None] = []  # per dense core: available CPUs
        self._caches: dict[str, list[Any]] = {k: [] for k in ("pools", "allocated", "marks", "view", "available")}
        self.resize(1)

    # NodeExtra: shape ------------------------------------------------------------------------------------
    def resize(self, capacity: int) -> None:
        if capacity <= self._cap:
            return
        self._reshape(capacity, self._k, self._s)
        grow = capacity - self._cap
        self.topo += [None] * grow
        self.config += [NodeCPUConfig()] * grow
        self.reserved += [frozenset()] * grow
        self.numa_ids += [()] * grow
        self.held += [{} for _ in range(grow)]
        self.ref += [None] * grow
        self.core_avail += [None] * grow
        for cache in self._caches.values():
            cache += [None] * grow
        self._cap = capacity

    def _reshape(self, rows: int, k: int, s: int) -> None:
        for name, (dtype, fill) in _NODE_ARRAYS.items():
            new = np.full(rows, fill, dtype=dtype)
            old = self.arrays.get(name)
            if old is not None:
                new[: len(old)] = old
            self.arrays[name] = new
        valid = np.zeros((rows, k), dtype=bool)
        block = np.zeros((rows, len(_BLOCK), k), dtype=np.int64)
        block[:, _FIELD["numa_id"], :] = -1
        sock = np.zeros((rows, len(_SOCKETS), s), dtype=np.int64)
        old_rows = self.block.shape[0]
        block[:old_rows, :, : self.block.shape[2]] = self.block
        sock[:old_rows, :, : self.sock_block.shape[2]] = self.sock_block
        if "numa_valid" in self.arrays:
            old_valid = self.arrays["numa_valid"]
            valid[: old_valid.shape[0], : old_valid.shape[1]] = old_valid
        self.arrays["numa_valid"] = valid
        self._set_blocks(block, sock)
        self._k, self._s = k, s

    def _set_blocks(self, block: np.ndarray, sock: np.ndarray) -> None:
        self.block, self.sock_block = block, sock
        for name, f in _FIELD.items():
            self.arrays[name] = block[:, f, :]
        for f, name in enumerate(_SOCKETS):
            self.arrays[name] = sock[:, f, :]

    def set_node(self, index: int, node: Node) -> None:
        topo = topo_info(node.cpu_topology) if node.cpu_topology is not None else None
        numa_ids = topo.numa_ids if topo is not None else tuple(sorted(z.id for z in node.numa_zones))
        k = len(numa_ids)
        if k > self._k or (topo is not None and topo.num_sockets > self._s):
            self._reshape(self._cap, max(self._k, k), max(self._s, topo.num_sockets if topo else 1))
        self.clear(index)
        cfg = node_cpu_config(node)
        reserved = reserved_cpus(node) if topo is not None else frozenset()
        self.topo[index], self.config[index], self.reserved[index], self.numa_ids[index] = topo, cfg, reserved, numa_ids
        a, block = self.arrays, self.block
        a["numa_valid"][index, :k] = True
        block[index, _FIELD["numa_id"], :k] = numa_ids
        zones = {z.id: z for z in node.numa_zones}
        if topo is not None:
            self.ref[index] = array("h", bytes(2 * topo.num_cpus))
            self.core_avail[index] = array("h", bytes(2 * topo.num_cores))
            block[index, _FIELD["numa_cpus"], :k] = [len(cpus) for cpus in topo.numa_cpus]
            cap = [1000 * sum(1 for c in cpus if c not in reserved) for cpus in topo.numa_cpus]
            block[index, _FIELD["numa_cpu_cap"], :k] = cap
            a["cpus_per_core"][index] = topo.cpus_per_core
            a["has_topo"][index] = True
        for slot, nid in enumerate(numa_ids):
            zone = zones.get(nid)
            if zone is not None and zone.cpu is not None:
                block[index, _FIELD["numa_cpu_cap"], slot] = zone.cpu
        memory = [zones[n].memory if n in zones else None for n in numa_ids]
        if numa_ids and None not in memory:
            block[index, _FIELD["numa_mem_cap"], :k] = memory
            a["mem_tracked"][index] = True
        a["required_bind"][index] = _BIND_CODE[cfg.required_bind]
        a["kubelet_static"][index] = cfg.kubelet_static
        a["kubelet_mode"][index] = cfg.kubelet_mode
        a["numa_policy"][index] = NUMA_POLICY_CODE[cfg.numa_policy]
        a["bad_config"][index] = bool(cfg.problems)
        self._recompute(index)

    def move(self, src: int, dst: int) -> None:
        for name in (*_NODE_ARRAYS, "numa_valid"):
            self.arrays[name][dst] = self.arrays[name][src]
        self.block[dst] = self.block[src]
        self.sock_block[dst] = self.sock_block[src]
        for seq in (self.topo, self.config, self.reserved, self.numa_ids, self.held, self.ref, self.core_avail):
            seq[dst] = seq[src]
        self._dirty(dst)

    def clear(self, index: int) -> None:
        for name, (_, fill) in _NODE_ARRAYS.items():
            self.arrays[name][index] = fill
        self.arrays["numa_valid"][index] = False
        self.block[index] = 0
        self.block[index, _FIELD["numa_id"]] = -1
        self.sock_block[index] = 0
        self.topo[index], self.config[index], self.reserved[index] = None, NodeCPUConfig(), frozenset()
        self.numa_ids[index], self.held[index], self.ref[index], self.core_avail[index] = (), {}, None, None
        self._dirty(index)

    def _dirty(self, index: int) -> None:
        for cache in self._caches.values():
            cache[index] = None

    def set_max_ref_count(self, max_ref_count: int) -> None:
        """Change how many holders a CPU may have; every node's availability is re-counted."""
        if max_ref_count < 1:
            raise ValueError(f"max_ref_count must be >= 1, got {max_ref_count}")
        if max_ref_count != self.max_ref_count:
            self.max_ref_count = max_ref_count
            for i in range(self._cap):
                if self.topo[i] is not None:
                    self._recompute(i)

    # NodeExtra: bindings --------------------------------------------------------------------------------
    def assume(self, index: int, binding: Binding) -> None:
        hold = self._hold(index, binding)
        if hold is not None:
            self._apply(index, hold, 1)
            self.held[index][binding.workload] = hold

    def forget(self, index: int, binding: Binding) -> None:
        hold = self.held[index].pop(binding.workload, None)
        if hold is not None:
            self._apply(index, hold, -1)

    def _hold(self, index: int, binding: Binding) -> Hold | None:
        """The binding's hold on node `index`, checked to fit (StateError, nothing changed, if not)."""
        if not binding.numa and not binding.cpuset:  # a plain scalar binding holds no CPU or NUMA slot
            return None
        grants = tuple((g.numa, g.resources.get(CPU, 0), g.resources.get(MEMORY, 0)) for g in binding.numa)
        if not binding.cpuset and not grants:
            return None
        topo, ref = self.topo[index], self.ref[index]
        cpus = tuple(binding.cpuset)
        if cpus:
            if topo is None or ref is None:
                raise StateError(f"{_where(binding)} pins CPUs {binding.cpuset} but the node has no CPU topology")
            if not topo.all.issuperset(cpus):
                stray = [c for c in cpus if c not in topo.all]
                raise StateError(f"{_where(binding)}: CPUs {CPUSet(stray)} are not in the node's topology")
            if not self.reserved[index].isdisjoint(cpus):
                reserved = [c for c in cpus if c in self.reserved[index]]
                raise StateError(f"{_where(binding)}: CPUs {CPUSet(reserved)} are reserved by the kubelet")
            limit, pos_of = self.max_ref_count, topo.pos_of
            full = [c for c in cpus if ref[pos_of[c]] >= limit]
            if full:
                raise StateError(
                    f"{_where(binding)}: CPUs {CPUSet(full)} are already held exclusively (max_ref_count {limit})"
                )
        if grants:
            numa_ids = self.numa_ids[index]
            view = self.view(index)  # free per NUMA slot as Python ints (usually cached by reserve)
            for nid, cpu_milli, mem in grants:
                if nid not in numa_ids:
                    raise StateError(f"{_where(binding)}: NUMA node {nid} is not on the node {list(numa_ids)}")
                slot = numa_ids.index(nid)
                # With max_ref_count > 1 CPUs are shared, so cpuset grants may add up past the capacity.
                if self.max_ref_count == 1 and cpu_milli > view.cpu_free[slot]:
                    raise StateError(f"{_where(binding)}: NUMA node {nid} has not {cpu_milli}m cpu left")
                if view.mem_free is not None and mem > view.mem_free[slot]:
                    raise StateError(f"{_where(binding)}: NUMA node {nid} has not {mem} bytes of memory left")
        return Hold(cpus, binding.cpu_exclusive_policy, binding.qos, grants)

    def _apply(self, i: int, hold: Hold, sign: int) -> None:
        """Add (sign 1) or remove (-1) a hold, updating the aggregates incrementally.

        A CPU whose ref-count crosses max_ref_count changes its NUMA node's and socket's available
        count and its core's; a core that becomes (or stops being) wholly available or empty
        changes the whole-core and cores-with-a-free-CPU counts; a CPU whose ref-count leaves (or
        returns to) 0 changes the shared pool. `violations` recomputes all from scratch and compares.
        """
        self._dirty(i)
        # Deltas per NUMA slot in plain lists, written back one element at a time: a hold
        # touches a handful of the [fields, K] numbers, and turning lists into arrays would cost
        # more than the few element updates.
        numa_ids = self.numa_ids[i]
        k = len(numa_ids)
        cpu_used, mem_used = [0] * k, [0] * k
        for nid, cpu_milli, mem in hold.numa:
            slot = numa_ids.index(nid)
            cpu_used[slot] += sign * cpu_milli
            mem_used[slot] += sign * mem
        deltas = [(_F_CPU_USED, cpu_used), (_F_MEM_USED, mem_used)]
        topo, ref, core_avail = self.topo[i], self.ref[i], self.core_avail[i]
        if hold.cpus and topo is not None and ref is not None and core_avail is not None:
            avail, whole, cores, shared = [0] * k, [0] * k, [0] * k, [0] * k
            sock_avail, sock_whole = [0] * topo.num_sockets, [0] * topo.num_sockets
            limit, reserved = self.max_ref_count, self.reserved[i]
            pos_of, numa_of, socket_of, core_of = topo.pos_of, topo.numa_of, topo.socket_of, topo.core_of
            for cpu in hold.cpus:
                p, n = pos_of[cpu], numa_of[cpu]
                old = ref[p]
                new = ref[p] = old + sign
                if (old == 0) != (new == 0):
                    shared[n] += 1 if new == 0 else -1
                if cpu in reserved or (old < limit) == (new < limit):
                    continue
                step = 1 if new < limit else -1
                avail[n] += step
                sock_avail[socket_of[cpu]] += step
                core = core_of[cpu]
                size, was = topo.core_len[core], core_avail[core]
                now = core_avail[core] = was + step
                if (was == size) != (now == size):
                    change = size if now == size else -size
                    whole[n] += change
                    sock_whole[topo.core_socket[core]] += change
                if (was > 0) != (now > 0):
                    cores[n] += 1 if now > 0 else -1
            f_avail, f_whole, f_cores, f_shared = _AGGREGATES
            deltas += [(f_avail, avail), (f_whole, whole), (f_cores, cores), (f_shared, shared)]
            sock_block = self.sock_block
            for f, values in ((0, sock_avail), (1, sock_whole)):
                for s, d in enumerate(values):
                    if d:
                        sock_block[i, f, s] += d
        block = self.block
        for f, values in deltas:
            for slot, d in enumerate(values):
                if d:
                    block[i, f, slot] += d

    def _recompute(self, i: int) -> None:
        """Node i's per-core counts and per-NUMA / per-socket aggregates, from its ref-counts."""
        self._dirty(i)
        topo, ref = self.topo[i], self.ref[i]
        if topo is None or ref is None:
            self.block[i, _AGGREGATES] = 0
            self.sock_block[i] = 0
            return
        limit, reserved = self.max_ref_count, self.reserved[i]
        core_avail = array("h", bytes(2 * topo.num_cores))
        k, s = topo.num_numa, topo.num_sockets
        avail, whole, cores, shared = [0] * k, [0] * k, [0] * k, [0] * k
        sock_avail, sock_whole = [0] * s, [0] * s
        for p, cpu in enumerate(topo.ids):
            if ref[p] == 0:
                shared[topo.numa_of[cpu]] += 1
            if ref[p] < limit and cpu not in reserved:
                avail[topo.numa_of[cpu]] += 1
                sock_avail[topo.socket_of[cpu]] += 1
                core_avail[topo.core_of[cpu]] += 1
        for core, size in enumerate(topo.core_len):
            n = topo.core_numa[core]
            if core_avail[core] == size:
                whole[n] += size
                sock_whole[topo.core_socket[core]] += size
            if core_avail[core] > 0:
                cores[n] += 1
        self.core_avail[i] = core_avail
        self.block[i, _AGGREGATES, :k] = [avail, whole, cores, shared]
        self.sock_block[i, :, :s] = [sock_avail, sock_whole]

    # Reads ---------------------------------------------------------------------------------------------
    def available(self, index: int) -> frozenset[int]:
        """CPUs of node `index` an exclusive cpuset may take (not reserved, held < max_ref_count times)."""
        cache = self._caches["available"]
        if cache[index] is None:
            topo, ref = self.topo[index], self.ref[index]
            limit, reserved = self.max_ref_count, self.reserved[index]
            if topo is None or ref is None:
                cache[index] = frozenset()
            elif limit == 1:
                # Held at least once = held by some hold: set algebra in C instead of a scan of
                # every CPU's count (the per-CPU counts are the holds', see `violations`).
                taken = [hold.cpus for hold in self.held[index].values() if hold.cpus]
                cache[index] = topo.all.difference(reserved, *taken)
            else:
                cache[index] = frozenset(
                    [c for c, r in zip(topo.ids, ref, strict=False) if r < limit and c not in reserved]
                )
        return cache[index]  # type: ignore[no-any-return]

    def view(self, index: int) -> NodeView:
        """Node `index`'s per-NUMA numbers as Python ints (cached until the node changes)."""
        cache = self._caches["view"]
        if cache[index] is None:
            numa_ids = self.numa_ids[index]
            # One numpy call for the node's whole block, then plain tuples (rebuilt for every
            # node a decision changes, so kept lean: positional fields, C-level subtraction).
            rows = self.block[index, :, : len(numa_ids)].tolist()
            cpu_cap, mem_cap = tuple(rows[_F_CPU_CAP]), tuple(rows[_F_MEM_CAP])
            cpu_free = tuple(map(sub, cpu_cap, rows[_F_CPU_USED]))
            tracked = bool(self.arrays["mem_tracked"][index])
            mem_free = tuple(map(sub, mem_cap, rows[_F_MEM_USED])) if tracked else None
            f_avail, f_whole, f_cores, f_shared = _AGGREGATES
            cache[index] = NodeView(
                numa_ids, tuple(rows[f_avail]), tuple(rows[f_whole]), tuple(rows[f_cores]), tuple(rows[f_shared]),
                cpu_cap, cpu_free, mem_cap if tracked else None, mem_free,
            )  # fmt: skip
        return cache[index]  # type: ignore[no-any-return]

    def numa_free(self, index: int) -> tuple[dict[int, int], dict[int, int]]:
        """(cpu millicores, memory bytes) left per NUMA id from the per-NUMA grants (memory empty if untracked)."""
        view = self.view(index)
        cpu = dict(zip(view.numa_ids, view.cpu_free, strict=True))
        return cpu, (dict(zip(view.numa_ids, view.mem_free, strict=True)) if view.mem_free is not None else {})

    def allocated(self, index: int, relevant_only: bool = False) -> tuple[AllocatedCPU, ...]:
        """CPUs held on node `index`: one entry per (CPU, exclusive policy), ref-count = its holders.

        `relevant_only` leaves out what cannot change `take_cpus`' answer: with max_ref_count 1 a
        held CPU is never available, so only holders with an exclusive policy (their marks) matter.
        """
        marks = relevant_only and self.max_ref_count == 1
        cache = self._caches["marks" if marks else "allocated"]
        if cache[index] is None:
            topo, ref = self.topo[index], self.ref[index]
            policies: dict[int, set[str]] = {}
            for hold in self.held[index].values():
                if not marks or hold.exclusive_policy != "None":
                    for cpu in hold.cpus:
                        policies.setdefault(cpu, set()).add(hold.exclusive_policy)
            cache[index] = tuple(
                AllocatedCPU(cpu, policy, ref[topo.pos_of[cpu]])
                for cpu in sorted(policies)
                for policy in sorted(policies[cpu])
                if topo is not None and ref is not None
            )
        return cache[index]  # type: ignore[no-any-return]

    def pools(self, index: int) -> NodePools:
        """Node `index`'s pools (S3.2), recomputed after any change to its holders."""
        cache = self._caches["pools"]
        if cache[index] is not None:
            return cache[index]  # type: ignore[no-any-return]
        topo = self.topo[index]
        if topo is None:
            empty = CPUSet()
            return NodePools(empty, empty, {}, empty, empty)
        holds = self.held[index].values()
        shared, be, exclusive = split_cpus(topo.all, ((h.cpus, h.be_shareable) for h in holds))
        # Every id here comes from the topology (holds are checked against it): no per-id checks.
        numa_shared = {
            nid: trusted_cpuset(shared.intersection(topo.numa_cpus[k])) for k, nid in enumerate(topo.numa_ids)
        }
        pools = NodePools(
            trusted_cpuset(shared),
            trusted_cpuset(be),
            numa_shared,
            trusted_cpuset(exclusive),
            trusted_cpuset(self.reserved[index]),
        )
        cache[index] = pools
        return pools

    # Snapshots and checks ------------------------------------------------------------------------------
    def snapshot(self) -> object:
        lists = (self.topo, self.config, self.reserved, self.numa_ids)
        return (
            self.max_ref_count,
            (self._cap, self._k, self._s),
            {name: self.arrays[name].copy() for name in (*_NODE_ARRAYS, "numa_valid")},
            (self.block.copy(), self.sock_block.copy()),
            tuple(list(seq) for seq in lists),
            [dict(h) for h in self.held],
            [None if r is None else array("h", r) for r in self.ref],
            [None if c is None else array("h", c) for c in self.core_avail],
        )

    def restore(self, snapshot: object) -> None:
        want = self._cap
        self.max_ref_count, shape, arrays, blocks, lists, held, ref, core_avail = snapshot  # type: ignore[misc]
        self._cap, self._k, self._s = shape
        self.arrays = {k: v.copy() for k, v in arrays.items()}
        self._set_blocks(blocks[0].copy(), blocks[1].copy())
        self.topo, self.config, self.reserved, self.numa_ids = (list(seq) for seq in lists)
        self.held = [dict(h) for h in held]
        self.ref = [None if r is None else array("h", r) for r in ref]
        self.core_avail = [None if c is None else array("h", c) for c in core_avail]
        self._caches = {k: [None] * self._cap for k in self._caches}
        self.resize(want)

    def violations(self) -> list[str]:
        out: list[str] = []
        for i, topo in enumerate(self.topo):
            if topo is None and not self.numa_ids[i]:
                continue
            out += [f"node slot {i}: {v}" for v in self._node_violations(i, topo)]
        return out

    def _node_violations(self, i: int, topo: TopoInfo | None) -> list[str]:
        out: list[str] = []
        block = self.block
        refs: dict[int, int] = {}
        cpu_used = dict.fromkeys(self.numa_ids[i], 0)
        mem_used = dict.fromkeys(self.numa_ids[i], 0)
        for hold in self.held[i].values():
            for cpu in hold.cpus:
                refs[cpu] = refs.get(cpu, 0) + 1
            for nid, c, m in hold.numa:
                cpu_used[nid] += c
                mem_used[nid] += m
        over = sorted(c for c, n in refs.items() if n > self.max_ref_count)
        if over:
            out.append(f"CPUs {CPUSet(over)} held exclusively more than max_ref_count={self.max_ref_count} times")
        ref = self.ref[i]
        if topo is not None and ref is not None:
            if any(ref[topo.pos_of[c]] != refs.get(c, 0) for c in topo.ids):
                out.append("per-CPU holder counts disagree with the holders")
            if any(refs.get(c) for c in self.reserved[i]):
                out.append("a reserved CPU is held exclusively")
            pools = self.pools(i)
            if pools.shared & pools.exclusive or (pools.shared | pools.exclusive) != CPUSet(topo.all):
                out.append("shared pool and exclusive CPUs do not partition the node's CPUs")
            lse_like = {c for h in self.held[i].values() if not h.be_shareable for c in h.cpus}
            if pools.be != CPUSet(topo.all - lse_like) or not pools.be.is_superset(pools.shared):
                out.append("BE pool is not every CPU outside LSE-like holders (LSR CPUs shareable with BE only)")
            numa_union = CPUSet().union(*pools.numa_shared.values()) if pools.numa_shared else CPUSet()
            if numa_union != pools.shared or sum(map(len, pools.numa_shared.values())) != len(pools.shared):
                out.append("per-NUMA shared pools do not partition the shared pool")
            saved = (block[i].copy(), self.sock_block[i].copy(), array("h", self.core_avail[i] or ()))
            self._recompute(i)
            if not (np.array_equal(saved[0], block[i]) and np.array_equal(saved[1], self.sock_block[i])):
                out.append("per-NUMA / per-socket CPU aggregates were stale")
            if saved[2] != self.core_avail[i]:
                out.append("per-core available counts were stale")
        for slot, nid in enumerate(self.numa_ids[i]):
            used_cpu, cap_cpu = block[i, _FIELD["numa_cpu_used"], slot], block[i, _FIELD["numa_cpu_cap"], slot]
            used_mem, cap_mem = block[i, _FIELD["numa_mem_used"], slot], block[i, _FIELD["numa_mem_cap"], slot]
            if used_cpu != cpu_used[nid] or used_mem != mem_used[nid]:
                out.append(f"NUMA {nid}: used amounts disagree with the holders' grants")
            if self.max_ref_count == 1 and cpu_used[nid] > cap_cpu:
                out.append(f"NUMA {nid}: cpu over-allocated ({cpu_used[nid]}m > {cap_cpu}m)")
            if self.arrays["mem_tracked"][i] and mem_used[nid] > cap_mem:
                out.append(f"NUMA {nid}: memory over-allocated ({mem_used[nid]} > {cap_mem})")
        return out


def _where(binding: Binding) -> str:
    return f"binding {binding.workload} on {binding.node}"


def _array_property(name: str) -> property:
    return property(lambda self: self.arrays[name], doc=f"The {name!r} row array (see the module docstring).")


# Each numpy row also reads as an attribute (``accounts.numa_avail``); a typo is still an AttributeError.
for _name in (*_NODE_ARRAYS, "numa_valid", *_BLOCK, *_SOCKETS):
    setattr(CPUAccounts, _name, _array_property(_name))
