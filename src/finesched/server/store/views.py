"""What the API returns: store rows shaped as {metadata, spec, status}, and manifest input checks.

Manifests arrive as JSON and are validated by the same code as manifest files
(`parse_manifest`), so an API error names the same field paths a `finesched validate` would;
they are stored in their canonical form (`to_manifest`), which parses back to the same object.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import BeforeValidator
from starlette.convertors import Convertor, register_url_convertor

from finesched.errors import _MISSING, ErrorDetail, ValidationError
from finesched.model.binding import Binding
from finesched.model.manifest import parse_manifest, to_manifest
from finesched.server.store.cluster_view import binding_view, tenant_isolation


class LegacyName(Convertor[str]):
    """A path segment for reading and deleting by name (`{name:legacy}`): any text, "/" and line
    breaks included, so an object stored by an older version under a name today's rules refuse can
    still be read and deleted. Only routes tried after every other one use it (their `legacy`
    routers), so it never hides a route such as ``/v1/workloads/{ns}/{name}/logs``. Writes name
    their objects in the body, where the rules apply."""

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("legacy", LegacyName())


def _not_a_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


#: An integer field of an API body: JSON's true and false are not 1 and 0 (as pydantic would read them).
Integer = Annotated[int, BeforeValidator(_not_a_boolean)]


class InputError(Exception):
    """Bad input from a client: FastAPI-style details, each with `loc`, `msg` and `type` (HTTP 422).

    `type` is "value_error" unless given: FastAPI's own 422 body (`HTTPValidationError`, which the
    OpenAPI schema documents for every operation) requires it."""

    def __init__(self, details: list[dict[str, Any]], status: int = 422):
        self.details = [{**d, "type": d.get("type", "value_error")} for d in details]
        self.status = status
        super().__init__("; ".join(d["msg"] for d in details))


def detail_of(error: ErrorDetail, prefix: tuple[str | int, ...] = ("body",)) -> dict[str, Any]:
    loc: list[str | int] = list(prefix)
    for part in error.path.replace("[", ".").replace("]", "").split("."):
        if part:
            loc.append(int(part) if part.isascii() and part.isdigit() else part)
    out: dict[str, Any] = {"loc": loc, "msg": error.message}
    if error.value is not _MISSING:
        out["input"] = error.value if isinstance(error.value, str | int | float | bool | None) else repr(error.value)
    return out


def invalid(exc: ValidationError, prefix: tuple[str | int, ...] = ("body",)) -> InputError:
    return InputError([detail_of(e, prefix) for e in exc.errors])


def parse_kind(doc: Any, kind: str, prefix: tuple[str | int, ...] = ("body",)) -> Any:
    """Validate one manifest of `kind` (the shape and the models' own rules; `admission` checks the
    rest against the stored objects); InputError (422) naming every bad field otherwise."""
    if not isinstance(doc, Mapping):
        raise InputError([{"loc": list(prefix), "msg": f"a {kind} manifest is a JSON object"}])
    if doc.get("kind") != kind:
        value = doc.get("kind")
        raise InputError([{"loc": [*prefix, "kind"], "msg": f"must be {kind!r} here", "input": repr(value)}])
    try:
        return parse_manifest(doc)
    except ValidationError as exc:
        raise invalid(exc, prefix) from None


def namespace_of(doc: Any) -> str:
    """The namespace a manifest names, read before it is validated (so that who may write there is
    decided first, as Kubernetes authorizes before it admits); "default" when it names none."""
    metadata = doc.get("metadata") if isinstance(doc, Mapping) else None
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def canonical(obj: Any) -> dict[str, Any]:
    return to_manifest(obj)


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


#: The reason of a Pending workload the scheduler does not hold (yet): a follower replica's answer,
#: or one submitted an instant ago.
NOT_YET_QUEUED = "queued: not yet in the scheduler's queue"


def pending_reason(stored: str, live: str | None) -> str:
    """Why a Pending workload waits, never empty: the scheduler's reason now (`live`: its last
    decision, its quota, its gang) over the stored one, which may be older; while it is only in its
    tenant's line (`queued: N ahead ...`), the stored reason if there is one (why it was requeued)."""
    if live is not None and not (stored and live.startswith("queued: ")):
        return live
    return stored or live or NOT_YET_QUEUED


def workload_view(row: Mapping[str, Any], live_reason: str | None = None) -> dict[str, Any]:
    """{metadata, spec, status: {phase, reason, binding: {node, cpuset, devices, numa} | null, ...}};
    a Pending workload's reason is `pending_reason` of the stored one and `live_reason`."""
    doc = row["spec"]
    binding_data = row.get("binding_data")
    if binding_data is None and row.get("binding"):
        binding_data = row["binding"]["data"]
    binding = binding_view(Binding.model_validate(binding_data)) if binding_data else None
    if binding is not None and row.get("binding"):
        binding["acked"] = bool(row["binding"]["acked"])
    return {
        "metadata": {
            **doc.get("metadata", {}),
            "namespace": row["namespace"],
            "name": row["name"],
            "uid": row.get("uid"),
        },
        "spec": doc.get("spec", {}),
        "status": {
            "phase": row["phase"],
            "reason": pending_reason(row["reason"], live_reason) if row["phase"] == "Pending" else row["reason"],
            "tenant": row["tenant"],
            "node": row.get("node"),
            "binding": binding,
            "info": row.get("info") or {},
            "job": row.get("job"),
            "restarts": row.get("restarts") or 0,
            "version": row["version"],
            "created": _time(row.get("created")),
            "updated": _time(row.get("updated")),
        },
    }


def conditions(set_aside: str | None) -> list[dict[str, str]]:
    """Kubernetes-style conditions: `SetAside` when the scheduler left the object out, and why."""
    if not set_aside:
        return []
    return [{"type": "SetAside", "status": "True", "reason": "SchedulerCannotUse", "message": set_aside}]


def isolation_condition(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """``TenantIsolation``: True where the agent runs workloads as their tenants' users, False (and
    what the scheduler does about it) where it cannot; none before the agent reported."""
    isolation = tenant_isolation(row)
    if isolation is None:
        return []
    if isolation["isolated"]:
        return [{"type": "TenantIsolation", "status": "True", "reason": "WorkloadsRunAsTenantUsers",
                 "message": isolation["reason"]}]  # fmt: skip
    placed = (
        "the admin lets tenants share this node (--allow-tenant-sharing)"
        if isolation["allowTenantSharing"]
        else "the scheduler places one tenant's workloads at a time here"
    )
    return [{"type": "TenantIsolation", "status": "False", "reason": "AgentNotRoot",
             "message": f"{isolation['reason']}; {placed}"}]  # fmt: skip


def node_view(
    row: Mapping[str, Any], usage: Mapping[str, Any] | None = None, set_aside: str | None = None
) -> dict[str, Any]:
    doc = row["spec"]
    status: dict[str, Any] = {
        "ready": bool(row["ready"]),
        "cordoned": bool(row["cordoned"]),
        "heartbeat": _time(row.get("heartbeat")),
        "report": row.get("report"),
        "version": row["version"],
        "conditions": conditions(set_aside) + isolation_condition(row),
    }
    if usage is not None:
        status["allocation"] = usage
    return {"metadata": with_uid(doc, row), "spec": doc.get("spec", {}), "status": status}


def with_uid(doc: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored manifest's metadata with the object's uid (the server's, never stored in the manifest)."""
    return {**doc.get("metadata", {}), "uid": row.get("uid")}


def cluster_object_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored cluster-scoped object (PriorityClass, Topology) as {metadata, spec, status}: its
    manifest with its uid, and its version and creation time."""
    doc = row["spec"]
    created = row.get("created")
    status = {"version": row["version"], "created": created.isoformat() if created is not None else None}
    return {"metadata": with_uid(doc, row), "spec": doc.get("spec", {}), "status": status}


def binding_row_view(
    row: Mapping[str, Any], run_as: Mapping[str, Mapping[str, Any] | None] | None = None
) -> dict[str, Any]:
    """A binding as a node agent reads it: the placement, the workload's uid and the spec it runs,
    its tenant and the tenant's ``runAs`` (`run_as`: tenant -> stored runAs; null when it has none), which the
    agent runs it as (agent/identity.py)."""
    view = binding_view(Binding.model_validate(row["data"]))
    tenant = row.get("tenant") or ""
    return {
        "workload": row["workload"],
        "uid": row.get("uid"),
        **view,
        "version": row["version"],
        "acked": bool(row["acked"]),
        "phase": row.get("phase"),
        "workloadSpec": (row.get("spec") or {}).get("spec", {}),
        "tenant": tenant,
        "runAs": (run_as or {}).get(tenant),
    }


def tenant_view(row: Mapping[str, Any], set_aside: str | None = None) -> dict[str, Any]:
    doc = row["spec"]
    status = {"version": row["version"], "conditions": conditions(set_aside)}
    return {"metadata": with_uid(doc, row), "spec": doc.get("spec", {}), "status": status}


def event_view(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "time": _time(row["time"]),
        "kind": row["kind"],
        "object": row["object"],
        "uid": row.get("uid"),
        "reason": row["reason"],
        "message": row["message"],
        "count": row.get("count") or 1,
        "firstTime": _time(row.get("first_time") or row["time"]),
    }
