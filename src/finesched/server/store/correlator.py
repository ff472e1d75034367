"""Repeated events are counted, not repeated (Kubernetes' event correlator, client-go `events_cache.go`).

An event identical to a recent one (same kind, object, uid, reason and message) does not add a row:
the earlier row is replaced by one that carries `count` + 1 and the first occurrence's time. The
replacement is a new row rather than an update because the event table is also the change feed: a
new id is what tells a following replica that the object changed again.

Which events are recent is kept in memory, per database, in an LRU of `MAX_ENTRIES` keys (client-go
keeps 4096 too); after a restart, or on another replica, the next repeat starts a new row, so the
number of rows stays bounded by (replicas x restarts) per repeated event rather than by repeats.

A `Deleted` event ends its object's history: what was remembered of the object is forgotten, and
the Deleted itself is not remembered (Kubernetes keys events by the object's UID, so a new object of
the same name starts its own count there too). Nothing of a deleted object can repeat, and a bulk
delete of a flood would otherwise leave the LRU full of the flood's keys, which hold the memory
the flood took (their small objects are spread over all of it: BENCHMARKS.md).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, insert
from sqlalchemy.engine import Engine

from finesched.server.store import schema as t

MAX_ENTRIES = 4096
#: The reason of the event that ends an object's history (every kind's delete writes it).
DELETED = "Deleted"
Key = tuple[str, str, str | None, str, str]  # kind, object, uid, reason, message


@dataclass(frozen=True, slots=True)
class Seen:
    """The row that holds an event's latest occurrence."""

    id: int
    count: int
    first_time: datetime


class EventCorrelator:
    """Event key -> the row counting it, for one database (an LRU; see the module docstring)."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._seen: OrderedDict[Key, Seen] = OrderedDict()
        self._lock = threading.Lock()

    def write(self, conn: Connection, events: Sequence[Any], stamp: datetime) -> list[int]:
        """Insert `events` (objects with kind, object, uid, reason, message) in the caller's transaction,
        folding each into its earlier occurrence; the ids of the rows written, in order."""
        merged: dict[Key, int] = {}  # the same event twice in one call is one row
        for e in events:
            key = (e.kind, e.object, e.uid, e.reason, e.message)
            merged[key] = merged.get(key, 0) + 1
        with self._lock:
            earlier = {key: self._seen[key] for key in merged if key in self._seen}
        replaced: set[int] = set()
        if earlier:
            ids = [seen.id for seen in earlier.values()]
            gone = delete(t.events).where(t.events.c.id.in_(ids)).returning(t.events.c.id)
            replaced = {r[0] for r in conn.execute(gone)}
        rows = []
        for key, times in merged.items():
            seen = earlier.get(key)
            still_there = seen is not None and seen.id in replaced  # gone: rolled back or pruned
            count = seen.count + times if still_there and seen is not None else times
            first = seen.first_time if still_there and seen is not None else stamp
            kind, obj, uid, reason, message = key
            rows.append({"time": stamp, "kind": kind, "object": obj, "uid": uid, "reason": reason,
                         "message": message, "count": count, "first_time": first})  # fmt: skip
        ids = [r[0] for r in conn.execute(insert(t.events).returning(t.events.c.id), rows)]
        ended = {(kind, obj) for kind, obj, _, reason, _ in merged if reason == DELETED}
        with self._lock:
            for row, new_id in zip(rows, ids, strict=True):
                key = (row["kind"], row["object"], row["uid"], row["reason"], row["message"])
                if (key[0], key[1]) in ended:
                    continue
                self._seen[key] = Seen(new_id, row["count"], row["first_time"])
                self._seen.move_to_end(key)
            if ended:  # one pass for a whole bulk delete's chunk
                for key in [k for k in self._seen if (k[0], k[1]) in ended]:
                    del self._seen[key]
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
        return ids

    def __len__(self) -> int:
        return len(self._seen)

    def objects(self) -> set[tuple[str, str]]:
        """The (kind, object) pairs it remembers events of."""
        with self._lock:
            return {(kind, obj) for kind, obj, _, _, _ in self._seen}


_by_engine: weakref.WeakKeyDictionary[Engine, EventCorrelator] = weakref.WeakKeyDictionary()
_by_engine_lock = threading.Lock()


def correlator_for(engine: Engine) -> EventCorrelator:
    """The correlator of one database (every Store over it in this process shares it)."""
    with _by_engine_lock:
        found = _by_engine.get(engine)
        if found is None:
            found = _by_engine[engine] = EventCorrelator()
        return found
