"""Files only their owner reads: data directories 0700, databases, logs, state and tokens 0600.

A data directory holds what must stay private on a shared machine: the database (workload specs,
token digests), the admin and agent tokens, the server's and the workloads' logs. Modes are set
explicitly, whatever the umask, and a directory or file found with wider modes (made by an older
version, or by hand) is tightened with one log line saying what changed, as sshd refuses a
world-readable key.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o700
FILE_MODE = 0o600

log = logging.getLogger("finesched.files")


def private_dir(path: Path) -> Path:
    """Create `path` (and its missing parents) 0700, or tighten an existing directory to 0700.

    A shared directory (the sticky bit: /tmp, where an SQLite file may be put) is never tightened:
    that would lock every other user out of it. Its finesched files are private all the same."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    if path.lstat().st_mode & stat.S_ISVTX:
        log.info("%s is a shared directory (sticky bit): left as it is; finesched's files in it are 0600", path)
        return path
    _tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty 0600 if missing, or tighten an existing file to 0600 (its contents stay)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        _tighten(path, FILE_MODE)
    else:
        os.close(fd)
        os.chmod(path, FILE_MODE)  # O_CREAT's mode passes through the umask; this does not
    return path


def open_private(path: Path) -> BinaryIO:
    """`path` opened for appending, made (or tightened to) 0600 first: a log nobody else reads."""
    private_file(path)
    return path.open("ab")


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by the owner only (written 0600 then renamed into place,
    so no reader ever sees it half written or with wider modes)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), FILE_MODE)
        f.write(text)
    os.replace(tmp, path)


def _tighten(path: Path, mode: int) -> None:
    """Take group and other access away from `path` (never a symlink's target) and say so."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return  # a link the user made on purpose; what it points to is theirs to guard
    current = stat.S_IMODE(info.st_mode)
    if current & 0o077:
        os.chmod(path, current & ~0o077 | (mode & 0o700))
        log.warning("%s was mode %o, readable by others; tightened to %o", path, current, mode)
