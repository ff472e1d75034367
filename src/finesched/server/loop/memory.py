"""Giving freed memory back to the system (glibc; elsewhere these do nothing).

glibc's malloc keeps the pages of freed memory for the process: only the top of its heap goes back
by itself. `malloc_trim(0)` returns every whole free page, wherever it is. What a flood of work
frees (the scheduler's queue, the connections of thousands of closed watches) is freed in the
middle of the heap, and the process would stay at its peak without a trim.

CPython's own allocator (pymalloc) holds objects of up to 512 bytes in 1 MiB arenas and returns an
arena only when every object in it is gone; a trim cannot reach those. Objects other tenants make
while a flood comes in (their bindings, their events) sit among the flood's and keep its arenas.
A server run with `PYTHONMALLOC=malloc` has every object in glibc's heap, where a trim returns
each free page: memory comes back after a flood, at a cost in speed (BENCHMARKS.md, "Fairness under
one tenant's flood", has both). `Trimmer` makes sure a trim follows whatever was freed, not only
a bulk delete.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("finesched.server")

MiB = 2**20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    except (OSError, AttributeError):  # not glibc, or one older than 2.33 (no mallinfo2)
        return None


_LIBC = _libc()


def trim() -> None:
    """Return every whole free page of the C heap to the system."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def collect_and_trim() -> None:
    """Free what only the cyclic collector frees (closed connections leave such cycles), then trim."""
    gc.collect()
    trim()


def free_held() -> int | None:
    """Bytes the C heap holds free (returned pages included: glibc counts them until reused); None
    where that cannot be asked."""
    return None if _LIBC is None else int(_LIBC.mallinfo2().fordblks)


@dataclass
class Trimmer:
    """Trims when the C heap holds `threshold` more free bytes than after the last trim, checked
    at most every `every_s` seconds: the memory a bulk delete frees is trimmed by the delete, but
    what goes when thousands of watches close, or a queue drains as its work is bound, is not."""

    every_s: float = 30.0
    threshold: int = 64 * MiB
    held: Callable[[], int | None] = free_held
    give_back: Callable[[], None] = collect_and_trim
    last: float = field(default_factory=time.monotonic)
    after_trim: int = 0  # free bytes right after the last trim
    trims: int = 0

    def check(self) -> bool:
        """Trim if due and worth it; whether it trimmed."""
        if time.monotonic() - self.last < self.every_s:
            return False
        self.last = time.monotonic()
        held = self.held()
        if held is None or held - self.after_trim < self.threshold:
            self.after_trim = min(self.after_trim, held or 0)  # reused since: count new frees from here
            return False
        started = time.perf_counter()
        self.give_back()
        self.trims += 1
        log.info("trimmed the C heap after %d MiB were freed (%.0f ms)", (held - self.after_trim) // MiB,
                 (time.perf_counter() - started) * 1000)  # fmt: skip
        self.after_trim = self.held() or 0
        return True
