"""Every thread of every process of a workload, read from /proc, and moving them to a CPU set.

A workload is the processes of its cgroups when it has any (``cgroup.procs``: exact, children and
orphans included, one small read), else its root process (the agent's ``/bin/sh`` wrapper, leader
of its own session and process group), every descendant of it (by parent pid) and every process of
its session, from a `ProcessTable` (one walk over /proc, shared by every workload a pass moves:
reading /proc is the cost here). Moving the workload sets the affinity of each thread of each of
them (``sched_setaffinity`` takes a thread id). A thread born while the agent works may copy its
creator's old mask, so the threads are listed again until a pass meets none it has not set; a child
process born meanwhile is caught by the caller's second table (`Moved.pids` says which it has seen)
or, at the latest, by the periodic check.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from finesched.cpuset import CPUSet

PROC = Path("/proc")
MAX_PASSES = 5


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], session [3])."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # plain open: this runs for every process on the node
            return f.read().rpartition(b")")[2].decode().split()
    except OSError:
        return None


@dataclass
class ProcessTable:
    """Parent -> children and session -> members of every live process, from one walk over /proc."""

    children: dict[int, list[int]] = field(default_factory=dict)
    sessions: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def scan(cls) -> ProcessTable:
        table = cls()
        for entry in os.scandir(PROC):
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is None or len(fields) < 4 or fields[0] in ("Z", "X"):
                continue
            pid = int(entry.name)
            table.children.setdefault(int(fields[1]), []).append(pid)
            table.sessions.setdefault(int(fields[3]), []).append(pid)
        return table

    def workload(self, root: int) -> set[int]:
        """`root`, its descendants and the processes of its session."""
        found: set[int] = set()
        todo = [root, *self.sessions.get(root, ())]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(self.children.get(pid, ()))
        return found


def workload_pids(root: int) -> set[int]:
    """`root`, its descendants and the processes of its session (one walk over /proc)."""
    return ProcessTable.scan().workload(root)


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(PROC / str(pid) / "task")]
    except OSError:
        return []


def cpus_allowed(pid: int, tid: int | None = None) -> CPUSet | None:
    """``Cpus_allowed_list`` of thread `tid` of `pid` (the process's main thread by default)."""
    path = PROC / str(pid) / "task" / str(tid if tid is not None else pid) / "status"
    try:
        for line in path.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return CPUSet(line.partition(":")[2].strip())
    except (OSError, ValueError):
        return None
    return None


@dataclass
class Moved:
    """What one move did: threads set, the processes seen, and the errors met (a thread that exited
    meanwhile is not one)."""

    threads: int = 0
    pids: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    @property
    def processes(self) -> int:
        return len(self.pids)


def move_threads(
    root: int,
    cpus: CPUSet,
    members: Callable[[], set[int]] | None = None,
    only_outside: bool = False,
    table: ProcessTable | None = None,
    skip: set[int] | frozenset[int] = frozenset(),
) -> Moved:
    """Set the affinity of every thread of the workload rooted at `root` to `cpus` (see the module
    docstring). Its processes: `members()` (its cgroups') when that lists any, else those of `table`
    (scanned here when not given); `skip` are left out. With `only_outside`, only the threads not
    already within `cpus` are set."""
    done: set[int] = set()
    out = Moved()
    mask = set(cpus)
    for _ in range(MAX_PASSES):
        fresh = 0
        listed = members() if members is not None else set()
        if not listed:
            table = table or ProcessTable.scan()
            listed = table.workload(root)
        for pid in listed - set(skip):
            out.pids.add(pid)
            for tid in threads(pid):
                if tid in done:
                    continue
                fresh += 1
                done.add(tid)
                if only_outside:
                    now = cpus_allowed(pid, tid)
                    if now is None or now.is_subset(cpus):
                        continue
                try:
                    os.sched_setaffinity(tid, mask)
                    out.threads += 1
                except ProcessLookupError:
                    continue
                except OSError as exc:
                    out.errors.append(f"thread {tid} of pid {pid}: {exc.strerror or exc}")
        if not fresh:
            break
    return out
