"""The scheduler lease: a row in the database that says which replica may schedule, until when.

Only the holder schedules. It renews the lease every `ttl / 3`; a replica takes the lease over
once it has expired (its holder died or lost the database). Every takeover bumps `version`,
which doubles as a fencing token: each binding transaction re-checks, in the same transaction,
that this replica still holds the lease at the version it acquired (`fence`), so a replica
that paused past its lease can never write a binding after another one took over.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from finesched.server import schema as t
from finesched.server.store import Store, aware, now

SCHEDULER_LEASE = "scheduler"


class LostLease(Exception):
    """This replica no longer holds the scheduler lease."""


class Lease:
    def __init__(self, store: Store, ttl_s: float = 10.0, holder: str | None = None, name: str = SCHEDULER_LEASE):
        self.store = store
        self.ttl = timedelta(seconds=ttl_s)
        self.holder = holder or f"replica-{uuid.uuid4().hex[:12]}"
        self.name = name
        self.version: int | None = None  # set while held

    @property
    def held(self) -> bool:
        return self.version is not None

    def try_acquire(self) -> bool:
        """Take or renew the lease; True when this replica holds it afterwards."""
        stamp = now()
        expires = stamp + self.ttl
        try:
            with self.store.write() as conn:
                row = conn.execute(select(t.leases).where(t.leases.c.name == self.name)).first()
                if row is None:
                    conn.execute(insert(t.leases), {"name": self.name, "holder": self.holder, "expires": expires,
                                                    "version": 1})  # fmt: skip
                    self.version = 1
                    return True
                if row.holder == self.holder and row.version == self.version:
                    conn.execute(update(t.leases).where(t.leases.c.name == self.name).values(expires=expires))
                    return True
                if aware(row.expires) > stamp:  # held by another replica (or by a previous life of ours)
                    self.version = None
                    return False
                version = row.version + 1
                result = conn.execute(
                    update(t.leases)
                    .where(t.leases.c.name == self.name, t.leases.c.version == row.version)
                    .values(holder=self.holder, expires=expires, version=version)
                )
                self.version = version if result.rowcount == 1 else None
                return self.version is not None
        except IntegrityError:  # another replica inserted the first row at the same moment
            self.version = None
            return False

    def fence(self, conn: Connection) -> None:
        """Raise LostLease unless this replica still holds an unexpired lease (inside a write transaction)."""
        if self.version is None:
            raise LostLease("this replica does not hold the scheduler lease")
        row = conn.execute(select(t.leases).where(t.leases.c.name == self.name)).first()
        if row is None or row.holder != self.holder or row.version != self.version or aware(row.expires) <= now():
            self.version = None
            raise LostLease("the scheduler lease was taken over or expired")

    def release(self) -> None:
        """Give the lease up (clean shutdown), so another replica need not wait for it to expire."""
        if self.version is None:
            return
        with self.store.write() as conn:
            conn.execute(
                update(t.leases)
                .where(
                    t.leases.c.name == self.name, t.leases.c.holder == self.holder, t.leases.c.version == self.version
                )
                .values(expires=now())
            )
        self.version = None

    def holder_info(self) -> dict[str, object] | None:
        with self.store.read() as conn:
            row = conn.execute(select(t.leases).where(t.leases.c.name == self.name)).first()
        if row is None:
            return None
        return {"holder": row.holder, "expires": aware(row.expires).isoformat(), "version": row.version}
