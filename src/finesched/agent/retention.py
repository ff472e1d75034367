"""How long what a finished workload leaves on its node is kept: its working directory, its log.

A workload whose process has ended and whose binding is gone (Succeeded, Failed) leaves two
directories, one per object (agent/names.py: the workload's name and uid):

* its working directory, ``<work root>/<agent>/<name>-<uid>/``: kept ``--keep-finished``
  (default 1h) after the process ended, so what it wrote can still be looked at, then removed;
  ``0`` removes it at once. A workload stopped while it ran (deleted, replaced, preempted) loses
  it at once, as before: nothing finished there;
* its log directory, ``<agent data>/workloads/<name>-<uid>/`` (``output.log``, ``exit-code``):
  kept ``--keep-logs`` (default 7d) after the process ended, for `finesched logs`, then removed.

The clock is each directory's modification time, set when the process ended (`retire`), so the
retention survives an agent restart without a record of its own: a sweep (`sweep`, from the
executor's poll) removes every directory of the agent's that no current workload uses and that has
not changed for the retention time.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Collection
from pathlib import Path

DEFAULT_KEEP_FINISHED = "1h"
DEFAULT_KEEP_LOGS = "7d"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_KEEP_S = 3650 * 86400
FORMS = "a duration such as 0, 30s, 15m, 1h or 7d (a number and s, m, h or d; plain numbers are seconds)"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
#: How often a sweep runs at most, and at least (a short retention is swept more often).
SWEEP_MAX_S, SWEEP_MIN_S = 30.0, 0.5


def parse_duration(text: str, option: str) -> float:
    """Seconds of a retention option's value; ValueError naming `option`, the value and the forms."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{option} {text!r} is not a duration: use {FORMS}")
    seconds = float(found.group(1)) * UNITS[found.group(2) or "s"]
    if seconds > MAX_KEEP_S:
        raise ValueError(f"{option} {text!r} is out of range: at most 3650d")
    return seconds


def retire(path: str | Path) -> None:
    """Start `path`'s retention clock: the workload that used it has ended (its time is now)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def sweep(parent: Path, keep_s: float, in_use: Collection[Path], now: float | None = None) -> list[Path]:
    """Remove the directories in `parent` not in `in_use` whose time is more than `keep_s` ago; the
    ones removed. Links and files are left alone (the agent makes neither there)."""
    now = time.time() if now is None else now
    keep = {Path(p) for p in in_use}
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        try:
            if not entry.is_dir(follow_symlinks=False) or path in keep:
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < keep_s:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)  # by file descriptor, never following a link
        removed.append(path)
    return removed


def sweep_every(keep_s: float) -> float:
    """Seconds between sweeps for a retention of `keep_s`: a quarter of it, within the bounds."""
    return min(SWEEP_MAX_S, max(SWEEP_MIN_S, keep_s / 4))
