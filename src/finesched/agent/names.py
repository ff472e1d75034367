"""Names the agent writes on disk (work directories, cgroups), derived safely from workload keys.

A workload key (``namespace/name``) is user text: an older server may hand out one of 300
characters, or with ``/``, ``..`` or bytes a file system refuses. Nothing on disk is ever named
with it as is: `safe_name` keeps a readable, sanitized prefix (letters, digits, ``.``, ``_``,
``-``; the namespace and name joined by ``.``), cut to 64 characters, and appends a hash of the
whole key, so two keys never share a name, the result is one path component of at most 81
characters, and it can never be ``.``, ``..`` or start with ``-`` or ``.``.

A binding from a server that gives objects uids names the object as well (`object_uid`): the name
is then the readable prefix and the uid (at most 101 characters), so a workload created with the
name of a deleted one gets a directory, and an output.log, of its own.
"""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
PREFIX_LEN = 64


def key_hash(text: str, length: int = 16) -> str:
    """A stable hex digest of `text` (sha256, first `length` hex digits)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def safe_name(workload: str, object_uid: str = "") -> str:
    """One file-system-safe path component for the workload key `workload`, and the object's uid
    when the server gave one (see the module docstring; the caller checked it is a UUID)."""
    namespace, _, name = workload.partition("/")
    readable = _UNSAFE.sub("_", f"{namespace}.{name}" if name else namespace)[:PREFIX_LEN].lstrip(".-") or "w"
    if object_uid:
        return f"{readable}-{_UNSAFE.sub('_', object_uid)}"
    return f"{readable}-{key_hash(workload)}"
