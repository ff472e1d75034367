"""Reading the event table in order without losing late events (the change feed and the SSE watch).

Event ids come from a sequence. On PostgreSQL a transaction that took id 7 may commit after one
that took id 8, so a reader that saw 8 and moved on would never see 7. A `FeedCursor` remembers
the ids it skipped over and asks for them again, for `window_s` seconds (longer than any of our
transactions; an id still missing then belonged to a transaction that rolled back).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from finesched.server.store import Store

GAP_WINDOW_S = 30.0


class FeedCursor:
    def __init__(self, position: int, window_s: float = GAP_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.position = position  # every id up to here was seen or is remembered as missing
        self.missing: dict[int, float] = {}  # id -> when it was first found missing
        self.window_s = window_s
        self.clock = clock

    def read(self, store: Store, limit: int = 1000) -> list[dict[str, Any]]:
        """New events (and late ones that filled a gap), oldest first."""
        rows = store.events(self.position, also=self.missing, limit=limit)
        stamp = self.clock()
        expected = self.position + 1
        for row in rows:
            event_id = row["id"]
            self.missing.pop(event_id, None)
            if event_id >= expected:
                for skipped in range(expected, event_id):
                    self.missing[skipped] = stamp
                expected = event_id + 1
        self.position = max(self.position, expected - 1)
        self.missing = {i: t for i, t in self.missing.items() if stamp - t < self.window_s}
        return rows
