"""What a workload running as its tenant's user can reach, for the agent tests.

Under a root agent a workload runs as an unprivileged uid (agent/identity.py): it cannot enter
pytest's ``tmp_path`` (under /tmp/pytest-of-root, mode 0700), nor run the interpreter running the
tests when that lives under /root (pyenv, a checkout there). So workloads run system programs
(`SYSTEM_PYTHON`, ``/bin/sh``) and write their results to an `exchange` directory anyone may
write to, which the test reads; their working directories go under a `work_root` every parent
of which others may pass through.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The system's interpreter: any user can run it (the tests' own may sit under /root).
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0
needs_system_python = pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"no {SYSTEM_PYTHON}")
#: A tenant's runAs for tests about something else that must run the tests' own interpreter
#: (a script of the repository, finesched itself): root, explicitly allowed.
ROOT_RUN_AS = {"uid": 0, "gid": 0, "allowRoot": True}


def skip_without_bwrap() -> None:
    """Skip a sandbox test where bubblewrap (or root) is missing; fail instead under
    FINESCHED_REQUIRE_BWRAP=1 (`.ci/run` installs bubblewrap: CI never skips these tests)."""
    why = "bubblewrap is not installed (Debian: apt-get install bubblewrap)" if shutil.which("bwrap") is None else ""
    why = why or ("the sandbox needs a root agent" if not ROOT else "")
    if not why:
        return
    if os.environ.get("FINESCHED_REQUIRE_BWRAP") == "1":
        pytest.fail(f"FINESCHED_REQUIRE_BWRAP=1 but {why}")
    pytest.skip(why)


def reachable_dir(mode: int, prefix: str = "finesched-test-") -> Path:
    """A new directory under /tmp with `mode` (the caller removes it: `remove`)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, mode)
    return path


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work_root() -> Iterator[Path]:
    """A work root (--work-root) that workloads of any uid can reach."""
    path = reachable_dir(0o711, "finesched-work-")
    yield path
    remove(path)


@pytest.fixture
def exchange() -> Iterator[Path]:
    """A directory any workload may write its results to (sticky, like /tmp)."""
    path = reachable_dir(0o1777, "finesched-exchange-")
    yield path
    remove(path)
