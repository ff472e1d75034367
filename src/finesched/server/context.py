"""What every request handler needs: the store, the scheduling loop, metrics, tokens, limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from finesched.sched.scheduler import Scheduler
from finesched.server.auth import Identity, TokenCache, authenticate
from finesched.server.loop import SchedulerLoop
from finesched.server.metrics import Metrics
from finesched.server.store import Store

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_ITEMS_PER_REQUEST = 1000


@dataclass
class ServerContext:
    store: Store
    loop: SchedulerLoop
    metrics: Metrics
    tokens: TokenCache
    max_body_bytes: int = MAX_BODY_BYTES

    def scheduler(self) -> Scheduler:
        """The leader's scheduler, or 503 on a replica that does not hold the lease."""
        scheduler = self.loop.scheduler
        if scheduler is None:
            raise HTTPException(503, "this replica is not the scheduling leader; ask the leader or retry")
        return scheduler


def get_context(request: Request) -> ServerContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


Ctx = Annotated[ServerContext, Depends(get_context)]
Caller = Annotated[Identity, Depends(authenticate)]
