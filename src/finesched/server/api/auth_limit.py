"""Failed authentications slow their source down: after a burst, 429 with `Retry-After`.

A source (the peer address of the connection) that fails to authenticate BURST times within
WINDOW_S seconds (no token, an unknown, expired or revoked one) is answered 429 with
`Retry-After` on its further requests that carry no valid token, until WINDOW_S seconds have
passed since the last BURST of its failures: every refused request counts, so a source that keeps
trying stays refused, and one that waits as told is let try again. A valid token is still taken
from that source (the token is checked first), so a client that shares an address with a
misbehaving one (a NAT, a proxy) keeps working.

Behind a reverse proxy every client has the proxy's address: they are one source here. The server
does not trust `X-Forwarded-For` (`finesched serve` runs uvicorn without proxy headers), which
any client could set to a new value on every request.

Memory is bounded: at most MAX_SOURCES sources are tracked, each with at most BURST timestamps; a
source silent for WINDOW_S is forgotten, and the least recently failing one goes first when the
table is full.

What is logged (by the caller, `auth.authenticate`): each failure at WARNING until the source is
limited, then one line when the limit starts and at most one line per WINDOW_S while it lasts
(with the number of refusals since), so a flood of bad requests cannot flood the log.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: Failed authentications from one source within WINDOW_S after which it is answered 429.
BURST = 10
#: The window of BURST failures, in seconds; also how long a limited source must stay quiet.
WINDOW_S = 10.0
#: The most sources tracked at once (the least recently failing are forgotten first).
MAX_SOURCES = 10_000


@dataclass
class _Source:
    times: deque[float]
    refused: int = 0  # 429s since the last log line about this source
    logged: float = -math.inf  # when the last line about its limit was logged


@dataclass(frozen=True)
class Verdict:
    """What to answer a failed authentication: `retry_after` seconds (429) or None (401); `log`
    says which line to write: "failure" (each one), "limited" (the limit starts or goes on, with
    `refused` requests since the last such line) or None (nothing: a line was written lately)."""

    retry_after: int | None
    log: str | None
    refused: int = 0


@dataclass
class FailedAuthLimiter:
    burst: int = BURST
    window_s: float = WINDOW_S
    max_sources: int = MAX_SOURCES
    clock: Callable[[], float] = time.monotonic
    _sources: OrderedDict[str, _Source] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def failed(self, source: str) -> Verdict:
        """Count one failed authentication from `source`; whether to refuse it with 429 (the source
        was already limited before this failure) and what to log."""
        now = self.clock()
        with self._lock:
            entry = self._sources.get(source)
            if entry is None:
                entry = self._sources[source] = _Source(deque(maxlen=self.burst))
            self._sources.move_to_end(source)
            wait = self._wait(entry, now)
            entry.times.append(now)
            self._forget(now)
            if wait is None:
                return Verdict(None, "failure")
            entry.refused += 1
            if now - entry.logged < self.window_s:
                return Verdict(wait, None)
            refused, entry.refused, entry.logged = entry.refused, 0, now
            return Verdict(wait, "limited", refused)

    def retry_after(self, source: str) -> int | None:
        """Seconds until `source` may try again, or None when it is not limited."""
        with self._lock:
            entry = self._sources.get(source)
            return None if entry is None else self._wait(entry, self.clock())

    def __len__(self) -> int:
        return len(self._sources)

    def _wait(self, entry: _Source, now: float) -> int | None:
        if len(entry.times) < self.burst:
            return None
        left = entry.times[0] + self.window_s - now
        return max(1, math.ceil(left)) if left > 0 else None

    def _forget(self, now: float) -> None:
        """Drop sources silent for a window (the oldest first: the table is in order of last failure)
        and, past `max_sources`, the least recently failing ones."""
        while self._sources:
            oldest = next(iter(self._sources.values()))
            if len(self._sources) <= self.max_sources and now - oldest.times[-1] < self.window_s:
                break
            self._sources.popitem(last=False)
