"""The extender's HTTP face: ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` (FastAPI).

Each verb is also served under ``/scheduler/`` (a common ``urlPrefix``). Bodies are read and
written as raw JSON (k8s/wire.py). Whatever goes wrong, the answer is HTTP 200 with the failure in
``Error`` (kube-scheduler treats a non-200 as a transport failure and learns nothing from it);
prioritize, which has no Error field, answers every node with score 0. ``GET /healthz`` is for
probes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from finesched.k8s import wire
from finesched.k8s.extender import Extender

log = logging.getLogger("finesched.k8s")
JSON = "application/json"


def _log_unexpected(verb: str, exc: Exception) -> None:
    """Bad input (ValueError) is the caller's and goes back in the reply; anything else is ours."""
    if not isinstance(exc, ValueError):
        log.error("%s failed", verb, exc_info=exc)


def _reply(doc: Any) -> Response:
    return Response(content=wire.encode(doc), media_type=JSON)


class _Verbs:
    """The four verbs' handlers on one extender. Each answers 200 whatever goes wrong (the module
    docstring)."""

    def __init__(self, extender: Extender) -> None:
        self.extender = extender
        # kube-scheduler sends prioritize the very body it sent filter: decode it once.
        self.last: list[tuple[bytes, wire.ExtenderArgs]] = []

    def extender_args(self, body: bytes) -> wire.ExtenderArgs:
        if self.last and self.last[0][0] == body:
            return self.last[0][1]
        args = wire.extender_args(wire.decode(body))
        if self.last:
            args = wire.same_names(args, self.last[0][1])
        self.last[:] = [(body, args)]
        return args

    async def filter(self, request: Request) -> Response:
        args = None
        try:
            args = self.extender_args(await request.body())
            return Response(content=wire.encode_filter_result(args, self.extender.filter(args)), media_type=JSON)
        except Exception as exc:  # never a 500: the reply carries the error
            _log_unexpected("filter", exc)
            return _reply(wire.filter_error(args, f"filter: {exc}"))

    async def prioritize(self, request: Request) -> Response:
        try:
            args = self.extender_args(await request.body())
        except Exception:
            return _reply([])
        try:
            scores = self.extender.prioritize(args)
        except Exception:
            log.exception("prioritize failed")
            scores = [0] * len(args.names)
        return Response(content=wire.encode_priorities(args.names, scores), media_type=JSON)

    async def bind(self, request: Request) -> Response:
        try:
            args = wire.binding_args(wire.decode(await request.body()))
            error = await run_in_threadpool(self.extender.bind, args)  # API calls: off the event loop
        except Exception as exc:
            _log_unexpected("bind", exc)
            error = f"bind: {exc}"
        return _reply({"Error": error})

    async def preempt(self, request: Request) -> Response:
        try:
            pod, candidates = wire.preemption_args(wire.decode(await request.body()))
            return _reply(wire.preemption_result(self.extender.preempt(pod, candidates)))
        except Exception as exc:
            _log_unexpected("preempt", exc)
            return _reply({"NodeNameToMetaVictims": None, "Error": f"preempt: {exc}"})


def create_app(extender: Extender) -> FastAPI:
    app = FastAPI(title="finesched kube-scheduler extender", docs_url=None, redoc_url=None, openapi_url=None)
    handlers = _Verbs(extender)
    verbs: dict[str, Callable[[Request], Awaitable[Response]]] = {
        "filter": handlers.filter,
        "prioritize": handlers.prioritize,
        "bind": handlers.bind,
        "preempt": handlers.preempt,
    }
    # Plain Starlette routes: a verb takes the Request and answers a Response itself, so FastAPI's
    # per-request parameter and dependency handling would only add time (about 0.1 ms a call).
    for prefix in ("", "/scheduler"):
        for verb, handler in verbs.items():
            app.add_route(f"{prefix}/{verb}", handler, methods=["POST"], include_in_schema=False)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Response:
        return Response(content=b"ok", media_type="text/plain")

    return app
