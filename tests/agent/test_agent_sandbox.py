"""The sandbox hides what it is told to, and still runs the privilege drop: an agent installed
where the sandbox puts a tmpfs (a checkout or a virtual environment under /tmp, as a CI clone may
be) starts sandboxed workloads all the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from finesched.agent.sandbox import RUNAS, Sandbox
from reachable import skip_without_bwrap


def test_the_helper_and_its_interpreter_are_bound_back_where_they_are_hidden(tmp_path: Path) -> None:
    skip_without_bwrap()
    # Hiding the agent's own package and the interpreter's prefix: resolve() runs the interpreter in
    # the sandbox and reads runas.py there (SandboxError otherwise).
    sandbox = Sandbox.resolve("bwrap", hide=[RUNAS.parent, Path(sys.prefix)])
    workdir = tmp_path / "work"
    workdir.mkdir()
    sibling = RUNAS.with_name("launch.py")  # hidden with its directory: only the helper comes back
    look = f"for f in {RUNAS} {sibling}; do test -r $f && echo seen || echo hidden; done"
    done = subprocess.run([*sandbox.wrap(workdir), "/bin/sh", "-c", look], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["seen", "hidden"]
    readonly = subprocess.run([*sandbox.wrap(workdir), "/bin/sh", "-c", f"echo x >> {RUNAS}"], capture_output=True)
    assert readonly.returncode != 0  # bound back read-only
