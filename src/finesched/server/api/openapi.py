"""The OpenAPI document, made to say what the API really does.

FastAPI describes each route from its signature; what it cannot see is added here, once, when
the document is first asked for:

* every status an operation can answer, with its body: ``{"detail": "..."}`` for 401, 403, 404,
  409, 410, 429 (with `Retry-After`) and 503, FastAPI's `HTTPValidationError` (``{"detail": [{loc,
  msg, type}]}``) for 413 and 422 (every route may refuse a path or query value, every route with
  a body a bad body);
* the bearer-token security every ``/v1`` operation requires;
* the manifest bodies (Node, Workload, Tenant, Job, PriorityClass, Topology) as the JSON schemas of
  their models, instead of free-form objects (the routes read them with `parse_manifest`, whose
  error paths are the manifest's own);
* the content types of ``/metrics`` (Prometheus text) and ``/v1/events/watch`` (Server-Sent Events).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from finesched.model.manifest import API_VERSION, KINDS, METADATA_FIELDS
from finesched.model.node import KUBELET_CPU_OPTIONS
from finesched.model.resources import NAME_PATTERN
from finesched.server.api.context import MAX_ITEMS_PER_REQUEST

REF = "#/components/schemas/"
MESSAGE = {"$ref": f"{REF}ErrorMessage"}
PROBLEMS = {"$ref": f"{REF}HTTPValidationError"}
DESCRIPTIONS = {
    401: "No token, or an unknown, expired or revoked one",
    403: "The token's role, tenant or node may not do this",
    404: "No such object",
    409: "The object changed meanwhile, its name is taken, or it is still referenced",
    410: "The offer expired",
    502: "The node agent that holds the output could not be reached, or not safely (plain HTTP to another "
    "machine, a certificate the server does not trust)",
    413: "The body is larger than the server accepts",
    422: "Bad input: every problem with its field path (`loc`), message and type",
    429: "Too many failed authentications from this address: retry after `Retry-After` seconds",
    503: "The store is unavailable, or this replica is not the scheduling leader",
}
#: Statuses beyond the common ones (401, 403, 422, 429, 503; 404 with a path parameter; 413 with a body).
EXTRA: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/nodes"): (409,),
    ("put", "/v1/nodes/{name}"): (409,),  # metadata.uid names another node of that name
    ("post", "/v1/bindings/{namespace}/{name}/ack"): (409,),  # ?uid= names another workload of that name
    ("post", "/v1/bindings/{namespace}/{name}/reject"): (409,),
    ("post", "/v1/nodes/{name}/report"): (409,),
    ("post", "/v1/workloads"): (409,),
    ("post", "/v1/workloads/{namespace}/{name}/status"): (409,),
    ("post", "/v1/tenants"): (409,),
    ("put", "/v1/tenants/{name}"): (409,),
    ("patch", "/v1/tenants/{name}"): (409,),
    ("delete", "/v1/tenants/{name}"): (409,),
    ("get", "/v1/tenants/{name}/usage"): (409,),
    ("post", "/v1/offers"): (409,),
    ("post", "/v1/offers/{offer_id}/accept"): (409, 410),
    ("post", "/v1/offers/{offer_id}/decline"): (409, 410),
    ("post", "/v1/jobs"): (409,),
    ("get", "/v1/workloads/{namespace}/{name}/logs"): (502,),
    ("post", "/v1/plan"): (409,),
    ("post", "/v1/priorityclasses"): (409,),
    ("put", "/v1/priorityclasses/{name}"): (409,),
    ("post", "/v1/topologies"): (409,),
    ("put", "/v1/topologies/{name}"): (409,),
}
#: Request bodies that are manifests: (method, path) -> the kind, and whether a list is accepted.
MANIFEST_BODIES: dict[tuple[str, str], tuple[str, bool]] = {
    ("post", "/v1/nodes"): ("Node", False),
    ("put", "/v1/nodes/{name}"): ("Node", False),
    ("post", "/v1/workloads"): ("Workload", True),
    ("post", "/v1/tenants"): ("Tenant", False),
    ("put", "/v1/tenants/{name}"): ("Tenant", False),
    ("post", "/v1/jobs"): ("Job", False),
    ("post", "/v1/plan"): ("Workload", True),
    ("post", "/v1/priorityclasses"): ("PriorityClass", False),
    ("put", "/v1/priorityclasses/{name}"): ("PriorityClass", False),
    ("post", "/v1/topologies"): ("Topology", False),
    ("put", "/v1/topologies/{name}"): ("Topology", False),
}
#: `metadata.uid`: set by the server; a manifest may carry it back (ignored on create, 409 on a replace
#: when it names another object than the stored one of that name).
UID = {"type": "string", "format": "uuid",
       "description": "The object's uid, given by the server at creation; read-only"}  # fmt: skip
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
QUANTITY = {
    "anyOf": [{"type": "string", "pattern": QUANTITY_PATTERN}, {"type": "number", "minimum": 0}],
    "description": 'A Kubernetes quantity ("500m", "16Gi", 4), not negative',
}


def install(app: FastAPI) -> None:
    """Make `app.openapi()` return the completed document (built once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            complete(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def methods_of(app: FastAPI, path: str) -> list[str]:
    """The methods the document lists for `path` (a concrete path), with HEAD beside GET and OPTIONS."""
    methods = {"OPTIONS"}
    for template, item in app.openapi()["paths"].items():
        pattern = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            methods |= {m.upper() for m in item}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def complete(schema: dict[str, Any]) -> None:
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["ErrorMessage"] = {
        "type": "object",
        "required": ["detail"],
        "properties": {"detail": {"type": "string"}},
        "title": "ErrorMessage",
    }
    schemas.update(_manifest_schemas())
    accept = schemas["AcceptRequest"]["properties"]["workloads"]
    accept["items"] = {"$ref": f"{REF}WorkloadManifest"}
    demand = schemas["OfferRequest"]["properties"]["demand"]
    demand.update(additionalProperties=QUANTITY, propertyNames={"pattern": NAME_PATTERN})
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in schema["paths"].items():
        for method, op in item.items():
            _complete_operation(method, path, op)
    _content(schema, "get", "/metrics", "text/plain; version=0.0.4", "Prometheus text exposition format")
    _content(schema, "get", "/v1/events/watch", "text/event-stream", "Server-Sent Events: `id`, `event`, `data`")
    _content(schema, "get", "/v1/workloads/{namespace}/{name}/logs", "text/plain", "The output its agent recorded")
    ready = schema["paths"]["/readyz"]["get"]["responses"]
    ready["503"] = {"description": "The store is unavailable", "content": {"application/json": {"schema": {}}}}


def _complete_operation(method: str, path: str, op: dict[str, Any]) -> None:
    responses = op["responses"]
    if not path.startswith("/v1/"):
        return
    op["security"] = [{"bearer": []}]
    codes = {401, 403, 422, 429, 503, *EXTRA.get((method, path), ())}
    if "{" in path:
        codes.add(404)
    if "requestBody" in op:
        codes.add(413)
    for code in sorted(codes):
        body = PROBLEMS if code in (413, 422) else MESSAGE
        responses.setdefault(str(code), {"description": DESCRIPTIONS[code]})
        responses[str(code)]["content"] = {"application/json": {"schema": body}}
    manifest = MANIFEST_BODIES.get((method, path))
    if manifest is not None:
        kind, many = manifest
        one = {"$ref": f"{REF}{kind}Manifest"}
        body = {"oneOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": MAX_ITEMS_PER_REQUEST}]}
        if (method, path) == ("post", "/v1/plan"):  # or with options: {"workloads": ..., "defragment": true}
            options = {"workloads": copy.deepcopy(body), "defragment": {"type": "boolean"}}
            body = {"oneOf": [*body["oneOf"], _object(options, ["workloads"])]}
        op["requestBody"]["content"]["application/json"]["schema"] = body if many else one
    if (method, path) == ("patch", "/v1/tenants/{name}"):
        op["requestBody"]["content"]["application/json"]["schema"] = {"$ref": f"{REF}TenantSpecPatch"}


def _content(schema: dict[str, Any], method: str, path: str, media_type: str, description: str) -> None:
    ok = schema["paths"][path][method]["responses"]["200"]
    ok["content"] = {media_type: {"schema": {"type": "string"}}}
    ok["description"] = description


def _manifest_schemas() -> dict[str, Any]:
    """`<Kind>Manifest` for every kind (``{apiVersion, kind, metadata, spec}``, the model's fields split
    as `METADATA_FIELDS` says), the models they refer to, and a Tenant spec for PATCH."""
    out: dict[str, Any] = {}
    for kind, model in KINDS.items():
        model_schema = model.model_json_schema(by_alias=True, ref_template=REF + "{model}")
        for name, definition in model_schema.pop("$defs", {}).items():
            out[name] = definition
        properties = model_schema["properties"]
        required = set(model_schema.get("required", ()))
        meta = [n for n in properties if n in METADATA_FIELDS[kind]]
        spec = [n for n in properties if n not in METADATA_FIELDS[kind]]
        spec_schema = _object({n: properties[n] for n in spec}, [n for n in spec if n in required])
        out[f"{kind}Spec"] = spec_schema
        out[f"{kind}Manifest"] = {
            "title": f"{kind}Manifest",
            "description": model.__doc__ or "",
            **_object(
                {
                    "apiVersion": {"type": "string", "enum": [API_VERSION]},
                    "kind": {"type": "string", "enum": [kind]},
                    "metadata": _object(
                        {**{n: properties[n] for n in meta}, "uid": UID}, [n for n in meta if n in required]
                    ),
                    # null reads as {} (no fields): allowed only where the spec requires none
                    "spec": {"$ref": f"{REF}{kind}Spec"}
                    if spec_schema.get("required")
                    else {"anyOf": [{"$ref": f"{REF}{kind}Spec"}, {"type": "null"}]},
                },
                ["apiVersion", "kind", "metadata"] + (["spec"] if spec_schema.get("required") else []),
            ),
        }
    patch = copy.deepcopy(out["TenantSpec"])
    patch.pop("required", None)
    out["TenantSpecPatch"] = {**patch, "title": "TenantSpecPatch"}
    _fix(out)
    return out


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        body["required"] = required
    return body


def _fix(schemas: dict[str, Any]) -> None:
    """What the models accept beyond what pydantic's schema says: quantities also as numbers (YAML's
    ``cpu: 0.5``), and a CPU topology either listed or built from its shape."""
    _walk(schemas, _quantities)
    options = schemas["KubeletPolicy"]["properties"]["options"]
    options["propertyNames"] = {"enum": sorted(KUBELET_CPU_OPTIONS)}
    options["additionalProperties"] = {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["true", "false"]}]}
    topology = schemas.get("CPUTopology")
    if topology is not None:
        builder = _object(
            {
                "sockets": {"type": "integer", "minimum": 1},
                "numaPerSocket": {"type": "integer", "minimum": 1},
                "coresPerNuma": {"type": "integer", "minimum": 1},
                "threadsPerCore": {"type": "integer", "minimum": 1},
            },
            ["sockets", "coresPerNuma"],
        )
        listed = {k: v for k, v in topology.items() if k != "description"}
        schemas["CPUTopology"] = {
            "title": "CPUTopology",
            "description": topology.get("description", ""),
            "anyOf": [listed, builder],
        }


def _quantities(node: dict[str, Any]) -> None:
    """A mapping of names to ``string | integer`` (a ResourceVector) takes resource names to
    quantities, or is null (no amounts)."""
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("anyOf") == [{"type": "string"}, {"type": "integer"}]:
        node["additionalProperties"] = QUANTITY
        node["propertyNames"] = {"pattern": NAME_PATTERN}
        node["type"] = ["object", "null"]
    options = node.get("anyOf")
    if isinstance(options, list) and options[:2] == [{"type": "string"}, {"type": "integer"}]:
        node["anyOf"] = QUANTITY["anyOf"] + options[2:]  # a quantity field (or null when optional)
        node["description"] = QUANTITY["description"]


def _walk(node: Any, visit: Callable[[dict[str, Any]], None]) -> None:
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            _walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            _walk(value, visit)
