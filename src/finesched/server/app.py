"""The control plane's HTTP API (FastAPI): routes under /v1, health, readiness and Prometheus metrics.

`create_app` wires a store and a scheduling loop into one app; the loop starts and stops with the
app's lifespan. Errors are JSON: ``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}`` for bad
input (422, or 413 when the body is too large) and ``{"detail": "..."}`` otherwise; a store conflict
is 409. Nothing is changed by a request that is refused. A body must be JSON without NaN, Infinity
or numbers that overflow (RFC 8259 has none of them; Python's reader would make them infinite). The
caller is authenticated and authorized before its body is validated (server/api/authz.py). A
method a path does not have is 405 with the path's real `Allow`; OPTIONS answers 204 with it. The
OpenAPI document says all of this (`server/api/openapi.py`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from finesched import __version__
from finesched.admission import NotAllowed
from finesched.server import console, jobs, logs, offers
from finesched.server.api import (
    authz,
    openapi,
    routes_nodes,
    routes_plan,
    routes_priority,
    routes_tenants,
    routes_tokens,
    routes_topologies,
    routes_whoami,
    routes_workloads,
)
from finesched.server.api.auth import TokenCache
from finesched.server.api.auth_limit import FailedAuthLimiter
from finesched.server.api.context import MAX_BODY_BYTES, Ctx, ServerContext
from finesched.server.api.watch_hub import WatchHub, WatchLimits
from finesched.server.loop.lease import LostLease
from finesched.server.loop.loop import LoopConfig, SchedulerLoop
from finesched.server.metrics import Metrics
from finesched.server.store.store import Conflict, NotFound, Store
from finesched.server.store.views import InputError

log = logging.getLogger("finesched.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, whether announced by Content-Length or streamed.

    The body is read here first (bounded by `limit`) and handed to the app in one piece, so the
    app never sees a body that is cut short. A JSON body that cannot be read is not answered here:
    its problem is kept for after the caller is authorized (server/api/authz.py)."""

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
        data = b"".join(chunks)
        problem = _json_problem(scope, data)
        if problem is not None:  # answered after authorization (server/api/authz.py); the app gets no body
            authz.defer(scope, problem, data)
            data = b""
        body = {"type": "http.request", "body": data, "more_body": False}
        await self.app(scope, _replay([body], then=receive), send)


class _NotFinite(str):
    """A JSON number no double holds (1e400) or a NaN/Infinity constant, kept as its text so that
    the problem can be reported at its field path."""


def _parse_json(data: bytes) -> tuple[Any, bool]:
    """The parsed body, non-finite numbers kept as `_NotFinite`, and whether there was any."""
    seen: list[_NotFinite] = []

    def keep(text: str) -> _NotFinite:
        seen.append(_NotFinite(text))
        return seen[-1]

    def finite(text: str) -> float | _NotFinite:
        value = float(text)
        return value if math.isfinite(value) else keep(text)

    return json.loads(data, parse_float=finite, parse_constant=keep), bool(seen)


def _not_finite_at(value: Any) -> tuple[list[str | int], _NotFinite] | None:
    """The path (from `body`) and text of the first non-finite number in a parsed body, depth first;
    iterative, so a deeply nested body cannot exhaust the stack."""
    stack: list[tuple[list[str | int], Any]] = [(["body"], value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _NotFinite):
            return path, item
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        stack.extend(reversed([([*path, key], child) for key, child in children]))
    return None


def _json_problem(scope: Scope, data: bytes) -> dict[str, Any] | None:
    """Why a JSON body (or one without a content type) cannot be read, as a 422 detail; None when it can."""
    if not data:
        return None
    ctype = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    if ctype and not (ctype == b"application/json" or ctype.endswith(b"+json")):
        return None
    try:
        parsed, not_finite = _parse_json(data)
    except RecursionError:
        return {"loc": ["body"], "msg": "JSON nested too deeply", "type": "json_invalid"}
    except json.JSONDecodeError as exc:
        return {"loc": ["body", exc.pos], "msg": f"JSON decode error: {exc.msg}", "type": "json_invalid"}
    except UnicodeDecodeError as exc:
        return {"loc": ["body", exc.start], "msg": f"the body is not UTF-8 ({exc.reason})", "type": "json_invalid"}
    found = _not_finite_at(parsed) if not_finite else None  # walked only when there is something to find
    if found is None:
        return None
    loc, text = found
    why = "JSON has no NaN or Infinity" if text in ("NaN", "Infinity", "-Infinity") else "it overflows a double"
    return {"loc": loc, "msg": f"numbers must be finite: {text} is not ({why})", "type": "value_error", "input": text}


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

        started = False

        async def counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.requests.labels(scope["method"], str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:  # answered 500 by Starlette's outermost handler, which this counter never sees
            if not started:
                self.metrics.requests.labels(scope["method"], "500").inc()
            raise


def _too_large(limit: int) -> JSONResponse:
    problem = {"loc": ["body"], "msg": f"request body larger than {limit} bytes", "type": "value_error"}
    return JSONResponse({"detail": [problem]}, 413)


def create_app(
    store: Store, config: LoopConfig | None = None, *, max_body_bytes: int = MAX_BODY_BYTES,
    watch: WatchLimits | None = None, auth_limiter: FailedAuthLimiter | None = None,
) -> FastAPI:  # fmt: skip
    """The app; `watch` caps SSE watches (server/api/watch_hub.py), `auth_limiter` slows sources of failed
    authentications (default: auth_limit.py's limits)."""
    metrics = Metrics()
    loop = SchedulerLoop(store, config, metrics)
    hub = WatchHub(store, watch)  # the SSE watches' shared feed (server/api/watch_hub.py)
    loop.pruner.readers.append(lambda: hub.position)
    loop.restorers.append(lambda scheduler: offers.restore_holds(store, scheduler))
    loop.maintenance.append(lambda: offers.expire_offers(store, loop))
    metrics.observe_cluster(loop.figures)
    ctx = ServerContext(store, loop, metrics, TokenCache(store, limiter=auth_limiter), max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            await hub.stop()
            loop.stop()

    app = FastAPI(
        title="finesched",
        version=__version__,
        description="Fine-grained resource scheduler: control plane API.",
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    app.state.watch_hub = hub
    openapi.install(app)
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    app.add_middleware(CountRequests, metrics=metrics)

    _error_handlers(app)
    _health_routes(app, metrics)
    _routers(app)
    return app


def _method_not_allowed(app: FastAPI, request: Request) -> Response:
    """405 with every method the path has in `Allow`, as the OpenAPI document lists them (Starlette
    names only the first matching route's); an OPTIONS request is answered 204 with the same header."""
    allow = ", ".join(openapi.methods_of(app, request.url.path))
    if request.method == "OPTIONS":
        return Response(status_code=204, headers={"Allow": allow})
    return JSONResponse({"detail": "Method Not Allowed"}, 405, headers={"Allow": allow})


def _error_handlers(app: FastAPI) -> None:
    """Every error the routes raise, answered as the API documents it (a 422 names the field; 403,
    404, 409, 503 a sentence), whichever layer raised it."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return _method_not_allowed(app, request)
        if exc.status_code == 400:  # FastAPI could not read the body: bad input, like every other
            return JSONResponse({"detail": [{"loc": ["body"], "msg": str(exc.detail), "type": "value_error"}]}, 422)
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        problem = authz.deferred_problem(request)
        if problem is None:
            return await request_validation_exception_handler(request, exc)
        others = [e for e in exc.errors() if not e.get("loc") or e["loc"][0] != "body"]  # the body was not read
        return JSONResponse({"detail": [*jsonable_encoder(others), problem]}, 422)

    @app.exception_handler(InputError)
    async def input_error(request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"detail": exc.details}, exc.status)

    @app.exception_handler(NotAllowed)
    async def not_allowed(request: Request, exc: NotAllowed) -> JSONResponse:
        """Admission found a valid request the caller may not make (a tenant's PriorityClass rule)."""
        return JSONResponse({"detail": str(exc)}, 403)

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


def _health_routes(app: FastAPI, metrics: Metrics) -> None:
    """/healthz (the process), /readyz (the store, and whether this replica leads), /metrics."""

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


def _routers(app: FastAPI) -> None:
    """The resources' routes, the features' and the console's, then the legacy names last."""
    for module in (routes_nodes, routes_workloads, routes_tenants, routes_priority, routes_topologies, offers, jobs,
                   logs, routes_plan, routes_tokens, routes_whoami, console):  # fmt: skip
        app.include_router(module.router)
    for module in (routes_nodes, routes_workloads, routes_tenants):  # last: old names with "/" (views.LegacyName)
        app.include_router(module.legacy)
