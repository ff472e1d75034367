"""Poison isolation: an object the scheduling loop cannot use is set aside, alone, with the reason.

One stored object must never stop scheduling for everybody: a node whose manifest no longer
parses, a tenant whose parent is gone, a workload the scheduler raises on. The loop catches the
failure at that one object and hands it here, and carries on with the others:

* a workload goes to phase Rejected with reason ``set aside: <why>`` (terminal: it is not retried
  blindly; `finesched get` shows the reason, `describe` the events), and can be deleted; one an
  older version bound under a name refused today is released first (no agent can run it safely);
* a node or a tenant is left out of the scheduler's state; the API shows a ``SetAside``
  condition on it (`finesched get nodes`, `describe node`) until a change to it loads again;
* each gets a ``SetAside`` event saying why, written once per reason (the loop's own event, so
  the change feed does not bring the object back to the loop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from finesched.server.store.store import REJECTED, Event, NotFound, Store

log = logging.getLogger("finesched.loop")

SET_ASIDE = "SetAside"


class Unusable(Exception):
    """Raised by the loop for an object it cannot use; the message says why (the reason recorded)."""


class SetAside:
    def __init__(self, store: Store, own: Callable[[Iterable[int]], None]):
        self.store = store
        self.own = own  # the loop's: events it wrote itself, which its change feed skips
        self.reasons: dict[tuple[str, str], str] = {}

    def get(self, key: tuple[str, str]) -> str | None:
        return self.reasons.get(key)

    def node(self, name: str, why: str) -> None:
        self._note("Node", name, why)

    def tenant(self, name: str, why: str) -> None:
        self._note("Tenant", name, why)

    def note(self, kind: str, name: str, why: str) -> None:
        """Any other object the loop leaves out (a Topology whose stored manifest is invalid today)."""
        self._note(kind, name, why)

    def workload(self, key: str, why: str) -> None:
        """Reject a queued workload with the reason (it no longer waits in any queue)."""
        self._reject(key, why, lambda reason: self.store.set_phase(key, REJECTED, reason))

    def bound(self, key: str, why: str) -> None:
        """Release a bound workload and reject it with the reason (its agent stops it)."""
        self._reject(key, why, lambda reason: self.store.release(key, REJECTED, reason))

    def _reject(self, key: str, why: str, write: Callable[[str], object]) -> None:
        log.error("workload %s set aside: %s", key, why)
        try:
            write(f"set aside: {why}")
        except NotFound:
            return
        self.own(self.store.note([Event("Workload", key, SET_ASIDE, why[:4000])]))

    def clear(self, kind: str, name: str) -> None:
        """The object loads again: it is no longer set aside."""
        self.reasons.pop((kind, name), None)

    def _note(self, kind: str, name: str, why: str) -> None:
        if self.reasons.get((kind, name)) == why:
            return
        log.error("%s %s set aside: %s", kind.lower(), name, why)
        self.reasons[(kind, name)] = why
        self.own(self.store.note([Event(kind, name, SET_ASIDE, why[:4000])]))
