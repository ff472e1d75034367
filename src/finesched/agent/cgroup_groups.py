"""Workload cgroups: one directory per hierarchy the agent uses, the files that enforce a binding.

Which files, in which hierarchy and why, is told in agent/cgroup.py (detection and the overview).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finesched.agent.cgroup import WANTED, CgroupSupport, Hierarchy, make_dir, os_reason
from finesched.cpuset import CPUSet

CFS_PERIOD_US = 100_000
MIN_SHARES, MAX_SHARES = 2, 262_144


@dataclass(frozen=True)
class Limits:
    """What a group enforces: CPUs, memory nodes (empty: the parent's), memory bytes, CPU millicores."""

    cpus: CPUSet
    mems: tuple[int, ...] = ()
    memory: int | None = None
    cpu_quota: int | None = None  # the CPU limit in millicores (None: no quota)
    cpu_request: int = 0


def shares(cpu_request: int) -> int:
    """kubelet's MilliCPUToShares: 1024 per CPU requested, at least 2."""
    return max(MIN_SHARES, min(MAX_SHARES, cpu_request * 1024 // 1000))


@dataclass
class Group:
    """One workload's directory in each hierarchy; `applied` maps each file to its value or why not."""

    dirs: dict[str, int]  # path -> hierarchy version
    controllers: dict[str, str] = field(default_factory=dict)  # controller -> path
    applied: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {"dirs": dict(self.dirs), "controllers": dict(self.controllers)}

    @classmethod
    def from_record(cls, data: Mapping[str, Any] | str | None) -> Group | None:
        """A group saved by `to_record`; a plain path (older agents: one v2 group) reads as one."""
        if not data:
            return None
        if isinstance(data, str):
            return cls({data: 2}, {"cpuset": data, "memory": data})
        return cls({str(k): int(v) for k, v in data["dirs"].items()}, dict(data.get("controllers") or {}))

    def procs_files(self) -> list[str]:
        return [str(Path(d) / "cgroup.procs") for d in self.dirs]

    def add(self, pid: int) -> bool:
        """Move `pid` into every directory (a no-op for one that is already there)."""
        joined = True
        for d in self.dirs:
            try:
                (Path(d) / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                self.applied[f"{d}: cgroup.procs"] = f"not joined: {os_reason(exc)}"
                joined = False
        if joined:
            self.applied["cgroup.procs"] = str(pid)
        return joined

    def set_cpus(self, cpus: CPUSet) -> str | None:
        """Write the group's ``cpuset.cpus`` (every task in it moves); the error, or None."""
        path = self.controllers.get("cpuset")
        if path is None:
            return "no cpuset controller"
        try:
            (Path(path) / "cpuset.cpus").write_text(cpus.format())
        except OSError as exc:
            return f"cpuset.cpus not set: {os_reason(exc)}"
        self.applied["cpuset.cpus"] = cpus.format()
        return None

    def pids(self) -> set[int]:
        """Every live process in the group (any directory; a zombie waiting to be reaped is not one)."""
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in (Path(d) / "cgroup.procs").read_text().split())
        return {pid for pid in out if _alive(pid)}

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer ended in this group (None: not known)."""
        path = self.controllers.get("memory")
        if path is None:
            return None
        version = self.dirs.get(path, 1)
        file = Path(path) / ("memory.oom_control" if version == 1 else "memory.events")
        try:
            for line in file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return None
        return 0

    def remove(self, wait: float = 0.2) -> bool:
        """Drop the directories, then the agent's scope and the base above them once they are empty
        too (nothing is left behind in the agent's own cgroup). A group whose last process is a
        zombie not reaped yet (by init, for an orphan) cannot go: it is waited for up to `wait`
        seconds, then left for `sweep`. True when every directory is gone."""
        gone = True
        for d in self.dirs:
            if not _rmdir(Path(d), wait):
                gone = False
                continue
            for parent in (Path(d).parent, Path(d).parent.parent):
                if not _rmdir(parent, 0.0):
                    break
        return gone


def _rmdir(path: Path, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(0.01)


def sweep(support: CgroupSupport, scope: str, keep: set[str]) -> int:
    """Remove the agent's group directories in `scope` that no running workload uses (`keep`):
    those a workload's end could not remove at once. How many are still there."""
    left = 0
    for h in support.usable:
        where = h.base / scope
        try:
            entries = [e for e in os.scandir(where) if e.is_dir()]
        except OSError:
            continue
        for entry in entries:
            if entry.path not in keep and not _rmdir(Path(entry.path), 0.0):
                left += 1
        if _rmdir(where, 0.0):
            _rmdir(h.base, 0.0)
    return left


def _make_chain(h: Hierarchy, path: Path) -> None:
    """mkdir base, scope and group; once more if another agent removed the empty base meanwhile."""
    for attempt in (1, 2):
        try:
            for level, delegate in ((h.base, True), (path.parent, True), (path, False)):
                make_dir(level, h.version, h.controllers, delegate)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def make_group(support: CgroupSupport, scope: str, name: str, limits: Limits) -> Group | None:
    """Create ``<base>/<scope>/<name>`` in every hierarchy and write what `limits` asks."""
    if not support.available:
        return None
    group = Group({})
    for h in support.usable:
        path = h.base / scope / name
        try:
            _make_chain(h, path)
        except OSError as exc:
            group.applied[str(path)] = f"not created: {os_reason(exc)}"
            continue
        group.dirs[str(path)] = h.version
        for controller in h.controllers:
            group.controllers[controller] = str(path)
        for file, value in _files(h, path, limits):
            try:
                (path / file).write_text(value)
                group.applied[file] = value
            except OSError as exc:
                group.applied[file] = f"not set: {os_reason(exc)}"
    for controller in WANTED:
        if controller not in group.controllers:
            group.applied[controller] = "no usable controller: " + (support.reason or "not mounted")
    return group if group.dirs else None


def _files(h: Hierarchy, path: Path, limits: Limits) -> list[tuple[str, str]]:
    """(file, value) to write in `path`, in order (v1 takes memsw only at or above the memory limit)."""
    out: list[tuple[str, str]] = []
    if "cpuset" in h.controllers:
        out.append(("cpuset.cpus", limits.cpus.format()))
        if limits.mems:
            out.append(("cpuset.mems", ",".join(map(str, limits.mems))))
    if "memory" in h.controllers and limits.memory:
        if h.version == 1:
            out.append(("memory.limit_in_bytes", str(limits.memory)))
            if (path / "memory.memsw.limit_in_bytes").exists():
                out.append(("memory.memsw.limit_in_bytes", str(limits.memory)))
        else:
            out.append(("memory.max", str(limits.memory)))
            if (path / "memory.swap.max").exists():
                out.append(("memory.swap.max", "0"))
    if "cpu" in h.controllers:
        weight = shares(limits.cpu_request)
        quota = limits.cpu_quota * CFS_PERIOD_US // 1000 if limits.cpu_quota else None
        if h.version == 1:
            out.append(("cpu.shares", str(weight)))
            if quota:
                out += [("cpu.cfs_period_us", str(CFS_PERIOD_US)), ("cpu.cfs_quota_us", str(max(1000, quota)))]
        else:
            out.append(("cpu.weight", str(1 + (weight - MIN_SHARES) * 9999 // (MAX_SHARES - MIN_SHARES))))
            if quota:
                out.append(("cpu.max", f"{max(1000, quota)} {CFS_PERIOD_US}"))
    return out
