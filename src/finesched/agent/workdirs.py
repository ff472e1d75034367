"""Workloads' working directories: one per workload, owned by its user, out of the agent's data.

The agent's data directory is private (0700, root's when the agent is root): a workload running
as its tenant's uid could not even enter it. So working directories live under a work root
(``--work-root``; default ``/var/lib/finesched/work`` for a root agent, ``<data>/work`` otherwise):

    <work root>/               0711, the agent's
      <scope>/                 0711, the agent's: a tenant cannot list the workloads
        <safe name>/           0700, the workload's uid and gid (agent/names.py names it)

A directory is made afresh when its workload starts (whatever an earlier one of that name left
is removed first) and removed when the agent forgets the workload (its binding is gone), the
scope with the last one (as the agent's cgroups go). A root
agent checks at start that every directory above the work root lets others through (o+x), or
its workloads could not reach their directories, and that the work root and the scope are its
own and writable by no one else (or a tenant could swap a directory for a link).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path

from finesched.agent.names import safe_name

log = logging.getLogger("finesched.agent")

ROOT_WORK = Path("/var/lib/finesched/work")
SHARED_MODE = 0o711  # others may pass through, not list
PARENT_MODE = 0o755  # parents the agent creates above the work root


def default_work_root(data: Path) -> Path:
    """``/var/lib/finesched/work`` for a root agent, else ``<data>/work``."""
    return ROOT_WORK if os.geteuid() == 0 else data / "work"


class WorkDirs:
    """The working directories of one agent (`scope`) under `root`; `switch`: workloads run as
    other users (a root agent), so the directories must let them in and be theirs."""

    def __init__(self, root: Path, scope: str, switch: bool):
        self.root = Path(os.path.abspath(root))
        self.scope = self.root / scope
        self.switch = switch
        self.mode = SHARED_MODE if switch else 0o700

    def prepare(self) -> None:
        """Make the work root and the scope (ValueError naming --work-root when they cannot serve)."""
        missing = [p for p in reversed(self.root.parents) if not p.exists()]
        try:
            for parent in missing:
                parent.mkdir(mode=PARENT_MODE, exist_ok=True)
                os.chmod(parent, PARENT_MODE)
            self._own_dir(self.root)
            if self.scope.exists():
                self._own_dir(self.scope)
        except OSError as exc:
            raise ValueError(f"--work-root {self.root}: {exc.strerror or exc}") from None
        if self.switch:
            for parent in self.root.parents:
                mode = stat.S_IMODE(parent.stat().st_mode)
                if not mode & 0o001:
                    raise ValueError(
                        f"--work-root {self.root}: {parent} is mode {mode:o}, so workloads running as their "
                        "tenants' users could not reach their working directories; choose a directory every "
                        "parent of which others may pass through (o+x), such as /var/lib/finesched/work"
                    )

    def _own_dir(self, path: Path) -> None:
        path.mkdir(mode=self.mode, exist_ok=True)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"--work-root {self.root}: {path} is not a directory of uid {os.geteuid()}")
        mode = stat.S_IMODE(info.st_mode)
        if mode != self.mode:
            os.chmod(path, self.mode)
            if mode & 0o022 or (mode & 0o044 and self.switch):
                log.warning("%s was mode %o; set to %o (no one else may write or list it)", path, mode, self.mode)

    def path(self, workload: str, object_uid: str = "") -> Path:
        return self.scope / safe_name(workload, object_uid)

    def make(self, workload: str, uid: int, gid: int, object_uid: str = "") -> Path:
        """A fresh empty working directory for `workload` (the object `object_uid`), 0700 and owned by uid:gid."""
        self.root.mkdir(mode=self.mode, exist_ok=True)  # removed by hand meanwhile: made again
        if not self.scope.is_dir():
            self._own_dir(self.scope)
        path = self.path(workload, object_uid)
        self._remove(path)
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
        if self.switch:
            os.chown(path, uid, gid)
        return path

    def remove(self, path: str | Path) -> None:
        """Remove a working directory this agent made (anything else is left alone)."""
        path = Path(path)
        if path.parent == self.scope:
            self._remove(path)
            with contextlib.suppress(OSError):  # the last one: the scope goes too (not if others remain)
                self.scope.rmdir()

    @staticmethod
    def _remove(path: Path) -> None:
        # rmtree walks by file descriptor and never follows a link: what the workload left there
        # (links to elsewhere included) goes, and nothing outside
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path, ignore_errors=True)
