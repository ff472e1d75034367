"""``--sandbox bwrap``: each workload in a private mount namespace and PID namespace (bubblewrap).

Where Debian's ``bubblewrap`` package is installed, the root wrapper (agent/launch.py) starts the
privilege drop (agent/runas.py) inside ``bwrap`` with:

* the whole file system bound read-only (``--ro-bind / /``), a private ``/tmp`` and ``/var/tmp``
  (tmpfs), a minimal ``/dev`` and a ``/proc`` of its own PID namespace (``--unshare-pid``): the
  workload sees its own processes only, not other tenants' command lines;
* the agent's data directory, the work root and whatever else the agent is told to hide
  (``finesched up``'s whole data directory: database, tokens, server log) covered by an empty
  tmpfs, and only the workload's own working directory bound back read-write;
* its own IPC namespace (``--unshare-ipc``); the network is shared (not isolated);
* what the privilege drop needs bound back read-only where a hidden place covers it: agent/runas.py
  and the interpreter that runs it (its prefix and base prefix), so an agent installed under
  ``/tmp`` (a checkout there, a virtual environment) starts sandboxed workloads all the same;
* ``--die-with-parent``: the sandbox ends with the root wrapper that started it. The wrapper is
  not the agent (it runs in a session of its own and outlives an agent restart), so a restarted
  agent still adopts the workload and reads its exit code.

`Sandbox.check` runs the interpreter in ``bwrap`` once at agent start with these options, reading
runas.py, so a missing or unusable bwrap (no user namespaces for a non-root agent, say) or a helper
the sandbox hides is a clear error then, not a failed workload.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SANDBOXES = ("none", "bwrap")
PACKAGE = "bubblewrap"
#: The privilege drop the wrapper runs (in the sandbox, before the command), by this interpreter.
RUNAS = Path(__file__).with_name("runas.py")
#: What running RUNAS needs: the script, and the interpreter's own files (a virtual environment's
#: prefix, and the installation it was made from).
HELPER_PATHS = (RUNAS, Path(sys.prefix), Path(sys.base_prefix))
#: Directories the sandbox covers with a tmpfs whatever it is told to hide.
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))


class SandboxError(ValueError):
    """The sandbox asked for cannot be used here; the message says why and what to install."""


@dataclass(frozen=True)
class Sandbox:
    """The sandbox workloads run in: ``none``, or ``bwrap`` at `program`, hiding `hide`."""

    kind: str = "none"
    program: str = ""
    hide: tuple[Path, ...] = ()

    @classmethod
    def resolve(cls, kind: str, hide: Iterable[Path] = ()) -> Sandbox:
        """The sandbox `kind` (SandboxError when unknown, not installed, or not usable here)."""
        if kind not in SANDBOXES:
            raise SandboxError(f"--sandbox {kind!r}: must be one of {', '.join(SANDBOXES)}")
        if kind == "none":
            return cls()
        program = shutil.which("bwrap")
        if program is None:
            raise SandboxError(
                f"--sandbox bwrap: bwrap is not on PATH; install Debian's {PACKAGE} package "
                f"(apt-get install {PACKAGE}) or run with --sandbox none"
            )
        sandbox = cls(kind, program, tuple(sorted({Path(p).resolve() for p in hide}, key=lambda p: len(p.parts))))
        sandbox.check()
        return sandbox

    @property
    def active(self) -> bool:
        return self.kind == "bwrap"

    def wrap(self, workdir: Path) -> list[str]:
        """The argv prefix that runs a command in the sandbox with `workdir` writable ([] for none)."""
        if not self.active:
            return []
        argv = [self.program, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--ro-bind", "/", "/",
                "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]  # fmt: skip
        if Path("/var/tmp").is_dir():
            argv += ["--tmpfs", "/var/tmp"]
        # a hidden directory inside another is hidden with it (its own tmpfs would show its name)
        hidden = [p for p in self.hide if p.is_dir() and not any(p != h and p.is_relative_to(h) for h in self.hide)]
        for path in hidden:
            argv += ["--tmpfs", str(path)]
        # the directories between a hidden one and the working directory exist only on the tmpfs:
        # made passable (0711, as on the host), or the workload's user could not reach its own
        for parent in reversed(workdir.parents):
            if any(parent != h and parent.is_relative_to(h) for h in hidden):
                argv += ["--perms", "0711", "--dir", str(parent)]
        covered = (*PRIVATE_TMP, *hidden)
        for path in sorted({p.resolve() for p in HELPER_PATHS}):
            if any(path.is_relative_to(c) for c in covered):
                argv += ["--ro-bind", str(path), str(path)]
        return [*argv, "--bind", str(workdir), str(workdir), "--"]

    def check(self) -> None:
        """Run the interpreter in the sandbox once, reading runas.py (SandboxError with bwrap's words if it fails)."""
        probe = [*self.wrap(Path("/tmp")), sys.executable, "-I", "-S", "-c", f"open({str(RUNAS)!r}).close()"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"--sandbox bwrap: {self.program} cannot be run: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
            raise SandboxError(f"--sandbox bwrap: {self.program} does not work here: {said}")
