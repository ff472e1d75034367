"""Keeping every running workload in its CPU pool, as koordlet does on a Kubernetes node.

The pools themselves are a pure computation (state/pools.py, the scheduler's rule); this module
applies them. After every change of holders (an LSE/LSR/pinned binding starts or ends) each
running workload's place is recomputed, and a workload whose CPUs changed is moved: its cgroup's
``cpuset.cpus`` first (the kernel moves every task in the group), then the affinity of every thread
of every one of its processes (agent/procs.py), which is all there is where no cpuset controller
is usable, and which also resets masks the kernel would otherwise keep narrow when a pool grows.

Three more passes keep the node right over time:

* a workload adopted after an agent restart is moved again in full on the first pass (the agent
  may have been killed in the middle of a move);
* every `recheck_s` seconds each workload's threads are checked, and any thread found outside its
  workload's CPUs (a child forked during a move) is put back; a thread the workload itself pinned
  to a subset of its CPUs is left alone;
* a workload with a cpuset of its own never moves: it is only checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from finesched.agent.cgroup_groups import Group
from finesched.agent.procs import ProcessTable, cpus_allowed, move_threads
from finesched.agent.state import Record
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from finesched.state.pools import CPUPools, Holder, Placement, node_pools, placement, pools_report

log = logging.getLogger("finesched.agent")


def numa_layout(node: Node, usable: CPUSet) -> tuple[dict[int, CPUSet], dict[int, int]]:
    """NUMA id -> its usable CPUs, and NUMA id -> socket, from the node's topology (one NUMA node
    on socket 0 when the node has none)."""
    if node.cpu_topology is None:
        return {0: usable}, {0: 0}
    cpus: dict[int, set[int]] = {}
    sockets: dict[int, int] = {}
    for info in node.cpu_topology.cpus:
        sockets.setdefault(info.numa, info.socket)
        if info.id in usable:
            cpus.setdefault(info.numa, set()).add(info.id)
    return {n: CPUSet(c) for n, c in cpus.items()}, sockets


class Tables:
    """One walk over /proc, made when a workload without cgroups first needs it, for one pass."""

    def __init__(self) -> None:
        self.table: ProcessTable | None = None

    def get(self) -> ProcessTable:
        if self.table is None:
            self.table = ProcessTable.scan()
        return self.table


class PoolKeeper:
    def __init__(self, recheck_s: float = 10.0):
        self.recheck_s = recheck_s
        self.pools: CPUPools | None = None
        self.sockets: dict[int, int] = {}
        #: Workloads to move again in full on the next pass (adopted after a restart).
        self.adopted: set[str] = set()
        self._checked = time.monotonic()

    def compute(self, node: Node, usable: CPUSet, holders: Iterable[Holder]) -> CPUPools:
        numa, self.sockets = numa_layout(node, usable)
        self.pools = node_pools(usable, numa, holders)
        return self.pools

    def placement(self, qos: str, cpuset: CPUSet, shared_numa: Iterable[int]) -> Placement:
        """Where a workload goes in the pools of the last `apply`."""
        assert self.pools is not None, "apply() first"
        return placement(qos, cpuset, shared_numa, self.pools)

    def due(self) -> bool:
        """Whether the periodic check of every thread is due."""
        return time.monotonic() - self._checked >= self.recheck_s

    def apply(self, node: Node, usable: CPUSet, holders: Iterable[Holder], running: list[Record]) -> list[Record]:
        """Recompute the pools and move each running workload whose CPUs changed; the moved ones."""
        pools = self.compute(node, usable, holders)
        check = self.due()
        if check:
            self._checked = time.monotonic()
        moved: list[Record] = []
        walked: dict[str, tuple[Placement, set[int]]] = {}  # moved without cgroups: looked at again
        table = Tables()
        for rec in running:
            target = placement(rec.qos_class, rec.own_cpuset, rec.shared_numa, pools)
            pinned = bool(rec.own_cpuset)
            if target.cpus != CPUSet(rec.cpuset) or (rec.workload in self.adopted and not pinned):
                seen = self.move(rec, target, False, table)
                moved.append(rec)
            elif check or rec.workload in self.adopted:
                seen = self.move(rec, target, True, table)
            else:
                continue
            if seen is not None:
                walked[rec.workload] = (target, seen)
        if walked:  # children born during the moves: one more walk for all of them
            again = ProcessTable.scan()
            for rec in running:
                if rec.workload in walked:
                    target, seen = walked[rec.workload]
                    move_threads(rec.pid, target.cpus, table=again, skip=seen)
        self.adopted.clear()
        return moved

    def move(self, rec: Record, target: Placement, only_outside: bool, tables: Tables) -> set[int] | None:
        """Put every thread of `rec`'s workload on `target` (only those outside it, if `only_outside`);
        the processes it found by walking /proc (None: its cgroups listed them)."""
        group = Group.from_record(rec.cgroup)
        notes: list[str] = []
        if group is not None and "cpuset" in group.controllers:
            problem = group.set_cpus(target.cpus)
            if problem:
                notes.append(problem)
        members = group.pids() if group is not None else set()
        if group is not None and members:
            result = move_threads(rec.pid, target.cpus, group.pids, only_outside)
        else:
            result = move_threads(rec.pid, target.cpus, None, only_outside, tables.get())
        notes += result.errors
        walked = None if members else result.pids
        if only_outside and not result.threads and not notes:
            return walked
        old = rec.cpuset
        rec.cpuset, rec.pool = target.cpus.format(), target.pool
        rec.reason = f"on CPUs {rec.cpuset} ({target.pool})"
        now = cpus_allowed(rec.pid)
        rec.info.update(cpuset=rec.cpuset, pool=target.pool, affinity=now.format() if now is not None else "unknown")
        if isinstance(rec.info.get("cgroup"), dict) and group is not None and "cpuset" in group.controllers:
            rec.info["cgroup"]["cpuset.cpus"] = group.applied.get("cpuset.cpus", rec.info["cgroup"].get("cpuset.cpus"))
        if notes:
            rec.info["moveErrors"] = "; ".join(notes[:5])
            log.warning("moving %s to CPUs %s: %s", rec.workload, rec.cpuset, "; ".join(notes[:5]))
        else:
            rec.info.pop("moveErrors", None)
        verb = "fixed" if only_outside else "re-pinned" if old == rec.cpuset else "moved"
        log.info(
            "%s %s: %d thread(s) of %d process(es) %s -> %s (%s)",
            verb, rec.workload, result.threads, result.processes, old, rec.cpuset, target.pool,
        )  # fmt: skip
        return walked

    def report(self, node: Node, usable: CPUSet, running: list[Record]) -> dict[str, Any]:
        """The S3.9 pools report (state/pools.py) and where each running workload runs now."""
        holders = [Holder(r.workload, r.own_cpuset, r.qos_class) for r in running if r.own_cpuset]
        out = pools_report(self.compute(node, usable, holders), self.sockets)
        out["workloadCPUs"] = [
            {"namespace": r.workload.partition("/")[0], "name": r.workload.partition("/")[2], "qos": r.qos_class,
             "pool": r.pool or "cpuset", "cpuset": r.cpuset}
            for r in sorted(running, key=lambda r: r.workload)
        ]  # fmt: skip
        return out
