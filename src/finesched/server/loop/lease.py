"""The scheduler lease: a row in the database that says which replica may schedule, until when.

Only the holder schedules. It renews the lease every `ttl / 3`; a replica takes the lease over
once it has expired (its holder died or lost the database). Every takeover bumps `version`,
which doubles as a fencing token: each binding transaction re-checks, in the same transaction,
that this replica still holds the lease at the version it acquired (`fence`), so a replica
that paused past its lease can never write a binding after another one took over. On PostgreSQL
the fence reads the row `FOR SHARE`, so a takeover waits for the bindings being written under the
old version and every later binding transaction sees the new one; on SQLite the single writer
orders them the same way.

A replica has a stable *identity* (`--replica-id`, or a name kept in its data directory) and a
*life* (this process). The row's holder is ``identity/life``. A restarted replica that finds the
lease held by an earlier life of its own identity takes it over at once instead of waiting for it
to expire: that life is over (a live process keeps its data directory locked, see
`replica_identity`, so a second process on the same data directory gets a one-off identity). The
shortcut is taken only by a process that has never held the lease: an old life that is in fact
still running (a paused process, a replica started twice with one `--replica-id` on two machines)
loses at its next fenced write and then waits like any other follower, so the two never
alternate and never both write.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from finesched.errors import ValidationError
from finesched.private import private_dir, private_file, write_private
from finesched.server.store import schema as t
from finesched.server.store.store import Store, aware, now

log = logging.getLogger("finesched.lease")

SCHEDULER_LEASE = "scheduler"
IDENTITY_FILE = "replica-id"
LOCK_FILE = "replica.lock"
IDENTITY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class LostLease(Exception):
    """This replica no longer holds the scheduler lease."""


def split_holder(holder: str) -> tuple[str, str]:
    """(identity, life) of a stored holder (a holder written without a life has an empty one)."""
    identity, sep, life = holder.rpartition("/")
    return (identity, life) if sep else (holder, "")


class Lease:
    def __init__(self, store: Store, ttl_s: float = 10.0, holder: str | None = None, name: str = SCHEDULER_LEASE):
        """`holder` is this replica's stable identity (a random one when None: every life is a stranger)."""
        self.store = store
        self.ttl = timedelta(seconds=ttl_s)
        self.identity = holder or f"replica-{uuid.uuid4().hex[:12]}"
        self.holder = f"{self.identity}/{os.getpid()}.{uuid.uuid4().hex[:8]}"  # identity/life
        self.name = name
        self.version: int | None = None  # set while held
        self.ever_held = False  # this life held the lease at some point

    @property
    def held(self) -> bool:
        return self.version is not None

    def _earlier_life(self, holder: str) -> bool:
        """True when `holder` is another life of this identity and this life may take its lease at once."""
        return not self.ever_held and holder != self.holder and split_holder(holder)[0] == self.identity

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
                    return self._took(1)
                if row.holder == self.holder and row.version == self.version:
                    conn.execute(update(t.leases).where(t.leases.c.name == self.name).values(expires=expires))
                    return True
                earlier_life = self._earlier_life(row.holder)
                if aware(row.expires) > stamp and not earlier_life:  # held by another replica
                    self.version = None
                    return False
                version = row.version + 1
                result = conn.execute(
                    update(t.leases)
                    .where(t.leases.c.name == self.name, t.leases.c.version == row.version)
                    .values(holder=self.holder, expires=expires, version=version)
                )
                if result.rowcount != 1:
                    self.version = None
                    return False
                if earlier_life and aware(row.expires) > stamp:
                    log.info("took over the lease of this replica's previous life (%s, version %d)", row.holder,
                             row.version)  # fmt: skip
                return self._took(version)
        except IntegrityError:  # another replica inserted the first row at the same moment
            self.version = None
            return False

    def _took(self, version: int) -> bool:
        self.version = version
        self.ever_held = True
        return True

    def fence(self, conn: Connection) -> None:
        """Raise LostLease unless this replica still holds an unexpired lease (inside a write transaction)."""
        if self.version is None:
            raise LostLease("this replica does not hold the scheduler lease")
        query = select(t.leases).where(t.leases.c.name == self.name).with_for_update(read=True)
        row = conn.execute(query).first()
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
        return {"holder": row.holder, "expires": aware(row.expires).isoformat(), "version": row.version,
                "replica": self.holder}  # fmt: skip


@dataclass
class ReplicaIdentity:
    """This replica's stable name and where it came from; keeps the data directory locked while alive."""

    name: str
    source: str
    lock: IO[str] | None = None


def replica_identity(data: Path, given: str | None = None) -> ReplicaIdentity:
    """The identity under which this process holds the scheduler lease.

    `given` (``--replica-id``) wins; otherwise the name stored in ``<data>/replica-id`` (made at the
    first start). The data directory is locked (``flock`` on ``<data>/replica.lock``) for as long as
    this process lives, and the kernel drops the lock when it dies, even by SIGKILL. If another live
    process holds it, this one is not that process's next life: it runs under a one-off identity
    (it waits for leases like any other replica) and says so in the log."""
    if given is not None and not IDENTITY_PATTERN.fullmatch(given):
        raise ValidationError(
            "a replica id is 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
            path="--replica-id", value=given,
        )  # fmt: skip
    private_dir(data)
    lock = private_file(data / LOCK_FILE).open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        name = f"replica-{uuid.uuid4().hex[:12]}"
        log.warning("data directory %s is in use by another running replica; this one runs as %s (one-off)", data,
                    name)  # fmt: skip
        return ReplicaIdentity(name, "one-off: data directory in use")
    if given is not None:
        return ReplicaIdentity(given, "--replica-id", lock)
    path = data / IDENTITY_FILE
    stored = path.read_text().strip() if path.is_file() else ""
    if not IDENTITY_PATTERN.fullmatch(stored):
        stored = f"replica-{uuid.uuid4().hex[:12]}"
        write_private(path, stored + "\n")
    return ReplicaIdentity(stored, str(path), lock)
