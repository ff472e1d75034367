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

The groups and their files are agent/cgroup_groups.py. Every file is written separately;
`Group.applied` records what took effect and why not, and ``finesched describe`` shows it. Where
no controller is usable the agent falls back to CPU affinity (launch.py) and
`CgroupSupport.describe` says why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

WANTED = ("cpuset", "memory", "cpu")


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
            notes.append(f"v1 {'+'.join(sorted(controllers))}: cannot create {own_dir / 'finesched'}: {os_reason(exc)}")
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


def os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _make_base(own_dir: Path, version: int, controllers: Iterable[str]) -> Path:
    base = own_dir / "finesched"
    make_dir(base, version, frozenset(controllers))
    return base


def make_dir(path: Path, version: int, controllers: frozenset[str], delegate: bool = False) -> None:
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
        return None, f"v2: cannot create {own / 'finesched'}: {os_reason(exc)}"
    line = " ".join(f"+{c}" for c in sorted(wanted))
    errors = []
    for where in (own, base):
        try:  # may fail, e.g. EBUSY when the agent's own cgroup holds processes ("no internal processes")
            (where / "cgroup.subtree_control").write_text(line)
        except OSError as exc:
            errors.append(f"enabling {line} in {where / 'cgroup.subtree_control'}: {os_reason(exc)}")
    enabled = _tokens(own / "cgroup.subtree_control") & _tokens(base / "cgroup.subtree_control") & wanted
    missing = sorted(wanted - enabled)
    note = ""
    if missing:
        why = "; ".join(errors) or "not passed down"
        note = f"v2 {' and '.join(missing)} not enabled ({why}); run the agent in a delegated cgroup"
    return (Hierarchy(2, base, frozenset(enabled)) if enabled else None), note
