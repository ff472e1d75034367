"""Poison isolation: a binding that makes the agent raise is set aside alone; the agent goes on.

`guard` runs one workload's step; if it raises, the error is logged once (not on every tick), the
binding is rejected with the error as the reason (the server releases and requeues it, with its
backoff) and set aside: the same binding version is not tried again, a new one is. A binding item
that does not even parse is handled the same way by `unreadable`; one whose workload key cannot be
named in a URL (a name with ``/`` from an older server) is only logged, once.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from finesched.agent.binding import AgentBinding

log = logging.getLogger("finesched.agent")

#: workload -> (binding version, reason, reject sent)
Entries = dict[str, tuple[int, str, bool]]


class SetAside:
    def __init__(self, send_reject: Callable[[str, str], bool]):
        self.send_reject = send_reject
        self.bindings: Entries = {}
        self.unreadables: Entries = {}
        self._logged: dict[str, str] = {}  # key -> last error logged

    def guard(self, key: str, step: Callable[[], object], binding: AgentBinding | None = None) -> bool:
        """Run `step` for one workload; if it raises, log it (once per distinct error), set its
        binding aside, and let the caller go on with the others. True when it ran cleanly."""
        try:
            step()
        except Exception as exc:  # one workload's failure must not stop the others
            text = f"{type(exc).__name__}: {exc}"
            if self._logged.get(key) != text:
                self._logged[key] = text
                log.error("the agent failed on %s: %s\n%s", key, text, traceback.format_exc())
            if binding is not None:
                reason = f"the agent failed on this binding ({text}); set aside"
                self.bindings[key] = (binding.version, reason, self.send_reject(key, reason))
            return False
        self._logged.pop(key, None)
        return True

    def prune(self, current: Mapping[str, AgentBinding]) -> None:
        """Forget what is gone or bound anew (tried again), and items that parse now."""
        for key, (version, _, _) in list(self.bindings.items()):
            if key not in current or current[key].version != version:
                del self.bindings[key]
        for key in [k for k in self.unreadables if k in current]:
            del self.unreadables[key]

    def holds(self, key: str) -> bool:
        """Whether `key` is set aside (its reject is sent again if it could not be sent yet)."""
        if key not in self.bindings:
            return False
        self._resend(key, self.bindings)
        return True

    def unreadable(self, item: Any, reason: str) -> None:
        """A binding item that does not parse: rejected when its workload can be named, logged once
        per version."""
        workload = item.get("workload") if isinstance(item, Mapping) else None
        key = workload if isinstance(workload, str) else repr(workload)
        version = item.get("version") if isinstance(item, Mapping) and isinstance(item.get("version"), int) else -1
        if self.unreadables.get(key, (None,))[0] == version:
            self._resend(key, self.unreadables)
            return
        log.warning("unreadable binding %s: %s", key[:300], reason)
        addressable = isinstance(workload, str) and workload.count("/") == 1
        reason = f"agent cannot read the binding: {reason}"
        self.unreadables[key] = (version, reason, not addressable or self.send_reject(key, reason))

    def _resend(self, key: str, where: Entries) -> None:
        version, reason, sent = where[key]
        if not sent:
            where[key] = (version, reason, self.send_reject(key, reason))
