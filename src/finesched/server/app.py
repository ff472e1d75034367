"""The control plane's HTTP API (FastAPI): routes under /v1, health, readiness and Prometheus metrics.

`create_app` wires a store and a scheduling loop into one app; the loop starts and stops with the
app's lifespan. Errors are JSON: ``{"detail": [{"loc": [...], "msg": ...}]}`` for bad input
(422, or 413 when the body is too large) and ``{"detail": "..."}`` otherwise; a store conflict is
409. Nothing is changed by a request that is refused.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError

from finesched import __version__
from finesched.server import console, jobs, logs, offers, routes_nodes, routes_plan, routes_tenants, routes_workloads
from finesched.server.auth import TokenCache
from finesched.server.context import MAX_BODY_BYTES, Ctx, ServerContext
from finesched.server.lease import LostLease
from finesched.server.loop import LoopConfig, SchedulerLoop
from finesched.server.metrics import Metrics
from finesched.server.store import Conflict, NotFound, Store
from finesched.server.views import InputError

log = logging.getLogger("finesched.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, whether announced by Content-Length or streamed.

    The body is read here first (bounded by `limit`) and handed to the app in one piece, so the
    app never sees a body that is cut short."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await _too_large(self.limit)(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _too_large(self.limit)(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], then=receive), send)


def _replay(messages: list[Message], then: Callable[[], Awaitable[Message]] | None = None) -> Any:
    """A `receive` that hands out `messages`, then defers to `then` (e.g. to notice a disconnect)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


class CountRequests:
    """Count requests by method and status (a plain ASGI middleware: no per-request task or copy)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(scope["method"], str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": ["body"], "msg": f"request body larger than {limit} bytes"}]}, 413)


def create_app(store: Store, config: LoopConfig | None = None, *, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    metrics = Metrics()
    loop = SchedulerLoop(store, config, metrics)
    loop.restorers.append(lambda scheduler: offers.restore_holds(store, scheduler))
    loop.maintenance.append(lambda: offers.expire_offers(store, loop))
    metrics.observe_cluster(loop.figures)
    ctx = ServerContext(store, loop, metrics, TokenCache(store), max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(
        title="finesched",
        version=__version__,
        description="Fine-grained resource scheduler: control plane API.",
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    app.add_middleware(CountRequests, metrics=metrics)

    @app.exception_handler(InputError)
    async def input_error(request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"detail": exc.details}, exc.status)

    @app.exception_handler(Conflict)
    async def conflict(request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 409)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 404)

    @app.exception_handler(LostLease)
    async def not_leader(request: Request, exc: LostLease) -> JSONResponse:
        return JSONResponse({"detail": "this replica does not hold the scheduling lease; retry"}, 503)

    @app.exception_handler(OperationalError)
    async def store_down(request: Request, exc: OperationalError) -> JSONResponse:
        log.error("store unavailable: %s", exc)
        return JSONResponse({"detail": "the store is unavailable; retry"}, 503)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz(ctx: Ctx) -> JSONResponse:
        """Ready when the store answers; says whether this replica is the scheduling leader."""
        try:
            ctx.store.last_event_id()
        except OperationalError as exc:
            return JSONResponse({"status": "store unavailable", "detail": str(exc)}, 503)
        return JSONResponse({"status": "ready", "leader": ctx.loop.is_leader, "lease": ctx.loop.lease.holder_info()})

    @app.get("/metrics", tags=["health"])
    def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    for module in (routes_nodes, routes_workloads, routes_tenants, offers, jobs, logs, routes_plan, console):
        app.include_router(module.router)
    return app
