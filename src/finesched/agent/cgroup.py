"""Kernel enforcement of a binding through cgroups: v2 where it has the controllers, v1 otherwise.

`detect` (never raises) reads ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` and, for each
controller the agent uses (``cpuset``, ``memory``, ``cpu``), takes the cgroup v1 hierarchy that
has it mounted, else the v2 hierarchy when it offers it. A controller bound to a v1 hierarchy is
not available in v2, so a hybrid machine (v1 controllers, an empty ``/sys/fs/cgroup/unified``)
uses v1 and a pure v2 machine uses v2. Workload groups go below the agent's *own* cgroup in each
hierarchy, ``<own>/finesched/<scope>/<name>``, so they stay inside whatever limits the agent
itself runs under; `scope` separates agents sharing a machine and `name` is the workload's safe
name (agent/names.py), never user text.

Each workload group gets:

==========  =================================  ============================================
controller  cgroup v1                          cgroup v2
==========  =================================  ============================================
cpuset      ``cpuset.cpus``, ``cpuset.mems``   ``cpuset.cpus``, ``cpuset.mems``
memory      ``memory.limit_in_bytes`` and      ``memory.max`` and ``memory.swap.max`` = 0
            ``memory.memsw.limit_in_bytes``
cpu         ``cpu.cfs_quota_us`` /             ``cpu.max`` (quota period), ``cpu.weight``
            ``cpu.cfs_period_us``, ``cpu.shares``
==========  =================================  ============================================

The memory limit covers swap too (the swap limit equals it; kubelet runs without swap), so a
workload over its limit is OOM-killed rather than swapped; the kill is counted in
``memory.oom_control`` (v1) or ``memory.events`` (v2), read by `Group.oom_kills`. The CPU quota
is the workload's CPU limit (LS and BE; LSE and LSR own whole CPUs and get none), the weight its
CPU request as kubelet computes shares (2 for a request of 0). In v1 a new cpuset group starts
with empty ``cpuset.cpus``/``mems`` and cannot take a process: every level the agent creates gets
its parent's. Children of a process are born in its cgroups, so they inherit all of this.

Every file is written separately; `Group.applied` records what took effect and why not, and
``finesched describe`` shows it. Where no controller is usable the agent falls back to CPU
affinity (launch.py) and `CgroupSupport.describe` says why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finesched.cpuset import CPUSet

WANTED = ("cpuset", "memory", "cpu")
CFS_PERIOD_US = 100_000
MIN_SHARES, MAX_SHARES = 2, 262_144


@dataclass(frozen=True)
class Hierarchy:
    """One mounted hierarchy the agent uses: version 1 or 2, where its groups go, what it controls."""

    version: int
    base: Path
    controllers: frozenset[str]

    def describe(self) -> str:
        return f"v{self.version} {self.base} ({' '.join(sorted(self.controllers))})"


@dataclass(frozen=True)
class CgroupSupport:
    """The hierarchies workload groups go into, or (none) why not."""

    hierarchies: tuple[Hierarchy, ...] | None = ()
    reason: str = ""

    @property
    def usable(self) -> tuple[Hierarchy, ...]:
        return self.hierarchies or ()

    @property
    def available(self) -> bool:
        return bool(self.usable)

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset().union(*(h.controllers for h in self.usable))

    def describe(self) -> str:
        if not self.available:
            return f"unavailable: {self.reason}; CPU affinity only"
        text = "; ".join(h.describe() for h in self.usable)
        return f"{text}; {self.reason}" if self.reason else text


# Detection -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """A cgroup mount from mountinfo: version, mount point, the cgroup path it shows, v1 controllers."""

    version: int
    point: Path
    root: str
    controllers: frozenset[str]


def read_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Mount]:
    """The cgroup and cgroup2 mounts listed in `mountinfo` (proc(5) format)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            mounts.append(Mount(2, point, fields[3], frozenset()))
        else:
            mounts.append(Mount(1, point, fields[3], frozenset(tail[2].split(",")) & frozenset(WANTED)))
    return mounts


def own_paths(proc_cgroup: Path = Path("/proc/self/cgroup")) -> dict[str, str]:
    """Controller -> this process's cgroup path in its v1 hierarchy; ``""`` -> its v2 path."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out[controller] = parts[2]
    return out


def _inside(mount: Mount, path: str | None) -> Path | None:
    """The directory of cgroup `path` under `mount` (None when the mount does not show it)."""
    if path is None:
        return None
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    return mount.point / path[len(root) :].lstrip("/")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _tokens(path: Path) -> frozenset[str]:
    try:
        return frozenset(t.lstrip("+") for t in path.read_text().split())
    except OSError:
        return frozenset()


def detect(
    mountinfo: Path = Path("/proc/self/mountinfo"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> CgroupSupport:
    """The hierarchies that give workload groups the wanted controllers, each with its base made."""
    mounts, own = read_mounts(mountinfo), own_paths(proc_cgroup)
    if not mounts:
        return CgroupSupport(None, reason=f"no cgroup hierarchy is mounted ({mountinfo} lists none)")
    hierarchies: list[Hierarchy] = []
    notes: list[str] = []
    taken: set[str] = set()
    for mount in (m for m in mounts if m.version == 1 and m.controllers):
        controllers = mount.controllers - taken
        own_dir = _inside(mount, own.get(sorted(mount.controllers)[0]))
        if not controllers or own_dir is None:
            continue
        taken |= controllers
        try:
            base = _make_base(own_dir, 1, controllers)
        except OSError as exc:
            notes.append(f"v1 {'+'.join(sorted(controllers))}: cannot create {own_dir / 'finesched'}: {_why(exc)}")
            continue
        hierarchies.append(Hierarchy(1, base, frozenset(controllers)))
    v2 = next((m for m in mounts if m.version == 2), None)
    own_v2 = _inside(v2, own.get("")) if v2 is not None else None
    if v2 is not None and own_v2 is not None:
        wanted = (_tokens(own_v2 / "cgroup.controllers") & frozenset(WANTED)) - taken
        if wanted:
            hierarchy, note = _v2_hierarchy(own_v2, wanted)
            if hierarchy is not None:
                hierarchies.append(hierarchy)
                taken |= hierarchy.controllers
            if note:
                notes.append(note)
    missing = [c for c in WANTED if not any(c in h.controllers for h in hierarchies)]
    if missing:
        notes.append(f"no usable {', '.join(missing)} controller")
    for h in hierarchies:  # made to prove it can be; made again with the first workload group
        with contextlib.suppress(OSError):
            os.rmdir(h.base)
    return CgroupSupport(tuple(hierarchies) or None, reason="; ".join(notes))


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _make_base(own_dir: Path, version: int, controllers: Iterable[str]) -> Path:
    base = own_dir / "finesched"
    _make_dir(base, version, frozenset(controllers))
    return base


def _make_dir(path: Path, version: int, controllers: frozenset[str], delegate: bool = False) -> None:
    """mkdir `path` (its parent exists); a v1 cpuset group gets its parent's CPUs and memory nodes,
    a v2 group that will have children (`delegate`) passes the controllers down to them."""
    path.mkdir(exist_ok=True)
    if version == 1 and "cpuset" in controllers:
        for file in ("cpuset.cpus", "cpuset.mems"):
            if not _read(path / file):
                (path / file).write_text(_read(path.parent / file))
    if version == 2 and delegate:
        with contextlib.suppress(OSError):  # what is missing shows as files not set in the group
            (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(controllers)))


def _v2_hierarchy(own: Path, wanted: frozenset[str]) -> tuple[Hierarchy | None, str]:
    """Enable `wanted` below the agent's own v2 cgroup; what both levels pass down is usable."""
    try:
        base = _make_base(own, 2, wanted)
    except OSError as exc:
        return None, f"v2: cannot create {own / 'finesched'}: {_why(exc)}"
    line = " ".join(f"+{c}" for c in sorted(wanted))
    errors = []
    for where in (own, base):
        try:  # may fail, e.g. EBUSY when the agent's own cgroup holds processes ("no internal processes")
            (where / "cgroup.subtree_control").write_text(line)
        except OSError as exc:
            errors.append(f"enabling {line} in {where / 'cgroup.subtree_control'}: {_why(exc)}")
    enabled = _tokens(own / "cgroup.subtree_control") & _tokens(base / "cgroup.subtree_control") & wanted
    missing = sorted(wanted - enabled)
    note = ""
    if missing:
        why = "; ".join(errors) or "not passed down"
        note = f"v2 {' and '.join(missing)} not enabled ({why}); run the agent in a delegated cgroup"
    return (Hierarchy(2, base, frozenset(enabled)) if enabled else None), note


# Workload groups -----------------------------------------------------------------------------------------


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

    @property
    def path(self) -> Path:
        """The first directory (for people; the record keeps them all)."""
        return Path(next(iter(self.dirs)))

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
                self.applied[f"{d}: cgroup.procs"] = f"not joined: {_why(exc)}"
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
            return f"cpuset.cpus not set: {_why(exc)}"
        self.applied["cpuset.cpus"] = cpus.format()
        return None

    def pids(self) -> set[int]:
        """Every process in the group (any directory)."""
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in (Path(d) / "cgroup.procs").read_text().split())
        return out

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

    def remove(self) -> None:
        """Drop the (empty) directories, then the agent's scope and the base above them once they
        are empty too (nothing is left behind in the agent's own cgroup); a directory that still
        holds processes or groups stays."""
        for d in self.dirs:
            for path in (Path(d), Path(d).parent, Path(d).parent.parent):
                try:
                    os.rmdir(path)
                except OSError:
                    break


def _make_chain(h: Hierarchy, path: Path) -> None:
    """mkdir base, scope and group; once more if another agent removed the empty base meanwhile."""
    for attempt in (1, 2):
        try:
            for level, delegate in ((h.base, True), (path.parent, True), (path, False)):
                _make_dir(level, h.version, h.controllers, delegate)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


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
            group.applied[str(path)] = f"not created: {_why(exc)}"
            continue
        group.dirs[str(path)] = h.version
        for controller in h.controllers:
            group.controllers[controller] = str(path)
        for file, value in _files(h, path, limits):
            try:
                (path / file).write_text(value)
                group.applied[file] = value
            except OSError as exc:
                group.applied[file] = f"not set: {_why(exc)}"
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
