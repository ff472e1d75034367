"""POST /v1/plan: where would these workloads go now? A dry run on a copy of the live state; nothing stored.

The body is what POST /v1/workloads takes (a Workload manifest or a list, JSON), or the same as
YAML text (`Content-Type: application/yaml`, multi-document), so a manifest file can be sent as it
is. It is checked exactly as a submission is (`routes_workloads.parse_workloads`: the same field
paths in the errors, the same tenant rule) and names that already exist are refused as a
submission would be. The answer has, per workload in decision order, its node, score, devices,
cpuset and NUMA grants, or why it fits nowhere (with the per-reason node counts) and why
preemption could not help; a workload that fits only by preempting lists its victims
(another tenant's victims without their names). See `server/what_if.py` for how the copy is made.

Dry-run defragmentation: a JSON body `{"workloads": <manifest or list>, "defragment": true}` (or
`?defragment=true`, the only way for a YAML body) also plans moves of running workloads that allow
them (`spec.migration`) for a workload that fits nowhere; each such workload's record lists its
`moves` (another tenant's movers without their names) and `movesReason`, and the answer's
`defragmentation` says which settings applied (the profile's, or the defaults when it has none).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from finesched.errors import ValidationError
from finesched.model.manifest import field_line, parse_document_nodes
from finesched.server.api.auth import ADMIN, TENANT, Identity
from finesched.server.api.authz import check_namespaces, deferred_problem, raise_deferred, sent_json
from finesched.server.api.context import Caller, Ctx, ServerContext
from finesched.server.api.routes_workloads import parse_workloads
from finesched.server.api.visibility import can_see_workload
from finesched.server.store.views import InputError
from finesched.server.what_if import Busy, NotLeader, WhatIf

router = APIRouter(prefix="/v1", tags=["plan"])

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
_ERROR = {"content": {"application/json": {"schema": {"type": "object", "properties": {"detail": {}}}}}}
_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}},
        **{t: {"schema": {"type": "string", "description": "Workload manifests (multi-document)"}} for t in YAML_TYPES},
    },
}
_QUERY = [
    {
        "name": "defragment",
        "in": "query",
        "required": False,
        "description": "Also plan moves of movable running workloads (as the body's `defragment`)",
        "schema": {"type": "boolean"},
    }
]
#: The fields of the JSON body's options form, `{"workloads": ..., "defragment": true}`.
OPTIONS = ("workloads", "defragment")
_what_if_lock = threading.Lock()
#: How long a dry run waits for the one before it before the caller is told to retry (429).
WAIT_S = 20.0


@router.post(
    "/plan",
    openapi_extra={"requestBody": _BODY, "parameters": _QUERY},
    responses={
        code: {"description": why, **_ERROR}
        for code, why in (
            (401, "no token, or an unknown, expired or revoked one"),
            (403, "the token may not plan these workloads (another tenant's)"),
            (409, "a workload of that name exists already"),
            (413, "too many workloads or too large a body"),
            (415, "a body that is neither JSON nor YAML"),
            (422, "invalid manifests: every problem with its field path (a YAML body's also with its `line`)"),
            (429, "another dry run is still running, or too many failed authentications from this address; retry"),
            (503, "this replica is not the scheduling leader"),
        )
    },
)
async def plan(request: Request, ctx: Ctx, caller: Caller) -> dict[str, Any]:
    """Dry run: each workload's node, devices, cpuset and score, or why it fits nowhere and what
    preemption would evict, on a copy of the live state. Nothing is stored or changed."""
    caller.require(ADMIN, TENANT)
    if deferred_problem(request) is not None:  # a JSON body that cannot be read: whose it is comes first
        sent = await sent_json(request)
        if _is_options(sent):
            sent = sent.get("workloads")
        await run_in_threadpool(check_namespaces, ctx, caller, sent)
        raise_deferred(request)
    docs = _documents(await request.body(), request.headers.get("content-type", "application/json"))
    try:
        docs, defragment = _options(docs, request.query_params.get("defragment"))
    except InputError:  # whose the workloads are comes first, as for a manifest's problems
        await run_in_threadpool(check_namespaces, ctx, caller, docs.get("workloads") if _is_options(docs) else docs)
        raise
    # Dry runs go one at a time. Callers wait here, in the event loop, not in the thread pool that
    # every other request needs: many plans at once slow down only the plans.
    gate = _gate(request)
    try:
        await asyncio.wait_for(gate.acquire(), WAIT_S)
    except TimeoutError:
        raise HTTPException(
            429, f"dry runs are busy (waited {WAIT_S:g}s); retry", headers={"Retry-After": "5"}
        ) from None
    try:
        return await run_in_threadpool(_plan, request, ctx, caller, docs, defragment)
    finally:
        gate.release()


def _documents(body: bytes, content_type: str) -> Any:
    """The manifests of the body: JSON as POST /v1/workloads takes it, or a list of YAML documents."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in YAML_TYPES:
        kind = "YAML"
    elif media in ("application/json", "") or media.endswith("+json"):
        kind = "JSON"
    else:
        raise HTTPException(415, f"send Workload manifests as application/json or application/yaml, not {media}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError([{"loc": ["body"], "msg": f"is not UTF-8 text (byte {exc.start})"}]) from None
    if kind == "JSON":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise InputError([{"loc": ["body"], "msg": f"is not valid JSON: {exc}"}]) from None
    try:
        return YamlDocuments(parse_document_nodes(text, "YAML"))
    except ValidationError as exc:
        raise InputError([{"loc": ["body"], "msg": e.message} for e in exc.errors]) from None


def _is_options(body: Any) -> bool:
    """Whether a JSON body is the options form (an object with `workloads`, not a manifest)."""
    return isinstance(body, dict) and "workloads" in body and "kind" not in body


def _options(docs: Any, query: str | None) -> tuple[Any, bool]:
    """The manifests and whether to defragment: from the options form of a JSON body or from the
    query; 422 naming the field for a value that is not a boolean, an unknown option, or both given."""
    problems: list[dict[str, Any]] = []
    defragment: Any = None
    if query is not None:
        if query not in ("true", "false"):
            problems.append({"loc": ["query", "defragment"], "msg": f"must be true or false, not {query!r}"})
        defragment = query == "true"
    if _is_options(docs):
        for key in docs:
            if key not in OPTIONS:
                problems.append({"loc": ["body", key], "msg": f"unknown field; allowed: {', '.join(OPTIONS)}"})
        if "defragment" in docs:
            value = docs["defragment"]
            if not isinstance(value, bool):
                problems.append({"loc": ["body", "defragment"], "msg": f"must be true or false, not {value!r}"})
            elif query is not None:
                problems.append({"loc": ["body", "defragment"], "msg": "given in the body and in the query: once"})
            defragment = value
        docs = OptionsWorkloads.of(docs["workloads"])
    if problems:
        raise InputError(problems)
    return docs, bool(defragment)


class OptionsWorkloads(list):  # type: ignore[type-arg]
    """The manifests of an options body: a problem's `loc` is under `["body", "workloads"]`."""

    single: bool = False

    @classmethod
    def of(cls, workloads: Any) -> Any:
        if isinstance(workloads, list):
            return cls(workloads)
        out = cls([workloads])
        out.single = True
        return out

    @staticmethod
    def place(exc: InputError) -> InputError:
        for detail in exc.details:
            loc = detail.get("loc") or []
            if loc and loc[0] == "body":
                detail["loc"] = ["body", "workloads", *loc[1:]]
        return exc


class YamlDocuments(list):  # type: ignore[type-arg]
    """The documents of a YAML body, with the YAML node of each: the line of a refused field."""

    def __init__(self, found: list[tuple[object, Any]]):
        super().__init__(doc for doc, _ in found)
        self.nodes = [node for _, node in found]

    def place(self, exc: InputError) -> InputError:
        """`exc` with a `line` (1-based, in the body) on each problem of a document: the line of its
        field, or of the nearest field above it (`"loc": ["body", 1, "spec", ...]`)."""
        for detail in exc.details:
            loc = detail.get("loc") or []
            if len(loc) >= 2 and loc[0] == "body" and isinstance(loc[1], int) and 0 <= loc[1] < len(self.nodes):
                path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[2:]).removeprefix(".")
                line = field_line(self.nodes[loc[1]], path)
                if line is not None:
                    detail["line"] = line
        return exc


def _plan(request: Request, ctx: ServerContext, caller: Identity, docs: Any, defragment: bool) -> dict[str, Any]:
    try:
        body = docs[0] if isinstance(docs, OptionsWorkloads) and docs.single else docs
        workloads = parse_workloads(body, caller, ctx, ctx.world())
    except InputError as exc:
        raise (docs.place(exc) if isinstance(docs, (YamlDocuments, OptionsWorkloads)) else exc) from None
    taken = ctx.store.existing_workloads([w.key for w in workloads])
    if taken:
        raise HTTPException(409, f"workload {taken[0]} already exists: a dry run plans new workloads")
    try:
        answer = _what_if(request, ctx).plan(
            workloads, lambda key, _tenant: can_see_workload(ctx, caller, key), defragment=defragment
        )
    except NotLeader as exc:
        raise HTTPException(503, str(exc)) from None
    except Busy as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": "5"}) from None
    except ValidationError as exc:  # e.g. a workload given twice in one gang-less list
        raise InputError([{"loc": ["body"], "msg": str(exc)}]) from None
    return {**answer.doc, "dryRun": True, "cluster": {"nodes": answer.nodes, "pending": answer.pending}}


def _gate(request: Request) -> asyncio.Semaphore:
    """The app's one-at-a-time gate for dry runs (made on first use, in the event loop's thread)."""
    gate = getattr(request.app.state, "plan_gate", None)
    if gate is None:
        gate = request.app.state.plan_gate = asyncio.Semaphore(1)
    return gate  # type: ignore[no-any-return]


def _what_if(request: Request, ctx: ServerContext) -> WhatIf:
    """The app's one WhatIf (made on first use): one fork and one dry run at a time per server."""
    with _what_if_lock:
        what_if = getattr(request.app.state, "what_if", None)
        if what_if is None:
            what_if = request.app.state.what_if = WhatIf(ctx.loop)
        return what_if  # type: ignore[no-any-return]
