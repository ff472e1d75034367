"""cgroup v2 confinement for workload processes: detected, never required.

When ``<mount>/cgroup.controllers`` exists (cgroup v2) and the agent may create a group below its
own cgroup, each workload gets ``<own cgroup>/finesched/<ns>.<name>`` with ``cpuset.cpus`` (the
binding's cpuset), ``cpuset.mems`` (its NUMA nodes) and ``memory.max`` (its memory limit). Every
file is written separately and `Group.applied` records what took effect and why not, so
``finesched describe`` shows it; CPU affinity (launch.py) pins the process either way.

The process joins its group right after it starts (its pid is written to ``cgroup.procs``): Python
cannot start a child inside a cgroup, so for that instant only its affinity confines it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from finesched.cpuset import CPUSet

WANTED = ("cpuset", "memory")


@dataclass(frozen=True)
class CgroupSupport:
    """Where workload groups go (`base`), which controllers they get, or why there are none."""

    base: Path | None
    controllers: frozenset[str] = frozenset()
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.base is not None

    def describe(self) -> str:
        if self.base is None:
            return f"unavailable: {self.reason}"
        text = f"{self.base} (controllers: {' '.join(sorted(self.controllers)) or 'none'})"
        return f"{text}; {self.reason}" if self.reason else text


def _tokens(path: Path) -> frozenset[str]:
    try:
        return frozenset(t.lstrip("+") for t in path.read_text().split())
    except OSError:
        return frozenset()


def _own_cgroup(proc_cgroup: Path) -> str | None:
    """The v2 path in /proc/self/cgroup (the ``0::/path`` line)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


def detect(
    mount: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup"), base: Path | None = None
) -> CgroupSupport:
    """Find out whether workload groups can be made; never raises."""
    if not (mount / "cgroup.controllers").is_file():
        return CgroupSupport(None, reason=f"no cgroup v2 hierarchy at {mount} (cgroup v1 or not mounted)")
    if base is None:
        own = _own_cgroup(proc_cgroup)
        if own is None:
            return CgroupSupport(None, reason=f"no cgroup v2 entry in {proc_cgroup}")
        base = mount / own.lstrip("/") / "finesched"
    try:
        base.mkdir(exist_ok=True)
    except OSError as exc:
        return CgroupSupport(None, reason=f"cannot create {base}: {exc.strerror or exc}")
    offered = _tokens(base.parent / "cgroup.controllers")
    wanted = " ".join(f"+{c}" for c in WANTED if c in offered)
    errors: list[str] = []
    for where in (base.parent, base):
        # may fail, e.g. EBUSY when the agent's own cgroup holds processes ("no internal processes")
        try:
            (where / "cgroup.subtree_control").write_text(wanted)
        except OSError as exc:
            errors.append(
                f"enabling {wanted or 'nothing'} in {where / 'cgroup.subtree_control'}: {exc.strerror or exc}"
            )
    # a workload group gets what both levels pass down
    enabled = _tokens(base / "cgroup.subtree_control") & _tokens(base.parent / "cgroup.subtree_control")
    enabled &= frozenset(WANTED)
    missing = [c for c in WANTED if c not in enabled]
    reason = ""
    if missing:
        why = "; ".join(errors) or f"{base.parent} offers only: {' '.join(sorted(offered)) or 'none'}"
        reason = f"{' and '.join(missing)} not enabled ({why}); run the agent in a delegated cgroup"
    return CgroupSupport(base, enabled, reason)


@dataclass
class Group:
    """One workload's cgroup; `applied` maps each file to its value or to why it was not set."""

    path: Path
    applied: dict[str, str] = field(default_factory=dict)

    def add(self, pid: int) -> bool:
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            self.applied["cgroup.procs"] = f"not joined: {exc.strerror or exc}"
            return False
        self.applied["cgroup.procs"] = str(pid)
        return True

    def remove(self) -> None:
        """Drop the (empty) group; a group that still holds processes stays and is reported later."""
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def make_group(
    support: CgroupSupport, name: str, cpus: CPUSet, mems: tuple[int, ...], memory_max: int | None
) -> Group | None:
    """Create `name` under the support's base and write what the controllers allow."""
    if support.base is None:
        return None
    path = support.base / name
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        return Group(path, {"cgroup": f"not created: {exc.strerror or exc}"})
    group = Group(path)
    wants = {
        "cpuset.cpus": (cpus.format() if cpus else None, "cpuset"),
        "cpuset.mems": (",".join(map(str, mems)) if mems else None, "cpuset"),
        "memory.max": (str(memory_max) if memory_max else None, "memory"),
    }
    for file, (value, controller) in wants.items():
        if value is None:
            continue
        if controller not in support.controllers:
            group.applied[file] = f"not set: {controller} controller not enabled"
            continue
        try:
            (path / file).write_text(value)
            group.applied[file] = value
        except OSError as exc:
            group.applied[file] = f"not set: {exc.strerror or exc}"
    return group
