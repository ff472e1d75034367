"""The documentation site's Reference pages, generated from the code when the site is built.

mkdocs loads this file as a hook (`hooks:` in mkdocs.yml): `on_files` adds the pages below to the
site, so the manifest fields, HTTP API, CLI and metrics described there are read from the pydantic
models, the OpenAPI document, the typer app and the Prometheus registry of the version being built,
and cannot drift from them. It also publishes BENCHMARKS.md (kept at the repository's root) as
`benchmarks.md`. The generators import public things only; `openapi_document` is the one place that
knows where the server's app factory lives.
"""

from __future__ import annotations

import html
import inspect
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GENERATED = "*Generated from the code when the site is built; do not edit.*\n"


def openapi_document() -> dict[str, Any]:
    """The control plane's OpenAPI document, as `GET /openapi.json` serves it. The app is built on a
    throwaway SQLite store and never started (no loop, no server)."""
    from finesched.server.app import create_app  # the one import that follows the server's layout
    from finesched.server.store.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(f"sqlite:///{tmp}/docs.db")
        try:
            return create_app(store).openapi()
        finally:
            store.close()


# Markdown helpers ---------------------------------------------------------------------------------
def cell(text: object) -> str:
    """Prose for a table cell (markdown kept): pipes and newlines made harmless."""
    return str(text).replace("|", "\\|").replace("\n", " ")


#: Characters markdown would read inside raw HTML: a pattern's `[a-z]` is not a link, `*` no emphasis.
LITERAL = str.maketrans({c: f"&#{ord(c)};" for c in "[]*_`|\\"})


def code(text: object) -> str:
    """A literal value in a table cell."""
    return f"<code>{html.escape(str(text)).translate(LITERAL)}</code>"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def anchor(name: str) -> str:
    return name.lower()


# Manifests ----------------------------------------------------------------------------------------
RULES = {
    "minimum": "≥ {}",
    "exclusiveMinimum": "> {}",
    "maximum": "≤ {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "pattern": "matches {}",
    "minItems": "at least {} items",
    "maxItems": "at most {} items",
    "uniqueItems": "items unique",
}


#: How pydantic writes a quantity field (a string like `16Gi` or an integer).
QUANTITY = [{"type": "string"}, {"type": "integer"}]


def type_of(schema: dict[str, Any]) -> str:
    """A schema's type as a reader writes it: `integer`, `list of Device`, `map of quantity`..."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f'<a href="#{anchor(name)}">{cell(name)}</a>'
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    if "enum" in schema:
        return "one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"])
    if schema.get("anyOf", [])[:2] == QUANTITY:
        rest = schema["anyOf"][2:]
        return "quantity" + (" or " + " or ".join(type_of(o) for o in rest) if rest else "")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"]
            text = " or ".join(type_of(o) for o in options) or "null"
            return text + (" or null" if len(options) < len(schema[key]) else "")
    kind = schema.get("type")
    if kind == "array":
        return "list of " + type_of(schema.get("items", {}))
    if kind == "object" or "additionalProperties" in schema:
        extra = schema.get("additionalProperties")
        return "map of " + type_of(extra) if isinstance(extra, dict) else "object"
    if isinstance(kind, list):
        return " or ".join(kind)
    return kind or "any"


def rules_of(schema: dict[str, Any]) -> list[str]:
    """The constraints of a schema and of its non-null options."""
    found = [RULES[k].format(code(v) if k == "pattern" else v) for k, v in schema.items() if k in RULES]
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        found += rules_of(option)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += [f"each: {rule}" for rule in rules_of(schema[key])]
    return found


def fields_table(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", ()))
    rows = []
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else code(json.dumps(prop["default"])) if "default" in prop else ""
        rule = "; ".join([*rules_of(prop), *([cell(prop["description"])] if prop.get("description") else [])])
        rows.append([code(name), type_of(prop), default, rule])
    return table(["field", "type", "default", "rule"], rows) if rows else "No fields.\n"


def manifests_page() -> str:
    """Every manifest kind and every field of it and of the models it uses, from the models' JSON
    schemas (field names as written in manifests)."""
    from finesched.model.manifest import API_VERSION, KINDS, METADATA_FIELDS

    out = [
        "# Manifests\n",
        GENERATED,
        f"Every document is `{{apiVersion: {API_VERSION}, kind, metadata, spec}}`. Quantities are strings or "
        "numbers as Kubernetes writes them (`500m`, `16Gi`); see [Manifests and validation](../concepts/index.md).\n",
    ]
    shared: dict[str, dict[str, Any]] = {}
    for kind, model in KINDS.items():
        schema = model.model_json_schema(by_alias=True)
        shared.update(schema.pop("$defs", {}))
        meta = [n for n in schema["properties"] if n in METADATA_FIELDS[kind]]
        spec = {n: p for n, p in schema["properties"].items() if n not in METADATA_FIELDS[kind]}
        required = set(schema.get("required", ()))
        out.append(f"## {kind}\n")
        out.append(inspect.cleandoc(model.__doc__ or "") + "\n")
        out.append(f"`metadata`: {', '.join(f'`{n}`' for n in meta)} (and `uid`, which the server sets).\n")
        out.append("### spec\n")
        out.append(fields_table({"properties": spec, "required": [n for n in spec if n in required]}))
    out.append("## Types used by the kinds\n")
    for name in sorted(shared):
        definition = shared[name]
        out.append(f"### {name} {{ #{anchor(name)} }}\n")
        if definition.get("description"):
            out.append(inspect.cleandoc(definition["description"]) + "\n")
        if "properties" in definition:
            out.append(fields_table(definition))
        else:
            out.append(f"A value of type {type_of(definition)}.\n")
    return "\n".join(out)


# HTTP API -----------------------------------------------------------------------------------------
def http_api_page() -> str:
    """Every operation of the OpenAPI document: parameters, request body, answers."""
    document = openapi_document()
    out = [
        "# HTTP API\n",
        GENERATED,
        f"`{document['info']['title']}` {document['info']['version']}. The server serves this document at "
        "`/openapi.json`; every `/v1` call needs `Authorization: Bearer TOKEN` (see "
        "[Control plane](../concepts/control-plane.md)). Bodies' schemas are the "
        "[manifests](manifests.md) and the schemas of the document itself.\n",
    ]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            if method not in {"get", "put", "post", "delete", "patch"}:
                continue
            out.append(f"## {method.upper()} {path}\n")
            text = op.get("description") or op.get("summary") or ""
            if text:
                out.append(text.strip() + "\n")
            params = [
                [code(p["name"]), p["in"], "yes" if p.get("required") else "no", type_of(p.get("schema", {}))]
                for p in op.get("parameters", [])
            ]
            if params:
                out.append(table(["parameter", "in", "required", "type"], params))
            body = op.get("requestBody", {}).get("content", {})
            if body:
                out.append(
                    "Body: " + ", ".join(f"{code(t)} {schema_name(c.get('schema', {}))}" for t, c in body.items())
                )
                out.append("")
            answers = [
                [code(status), cell(a.get("description", "")), ", ".join(code(t) for t in a.get("content", {}))]
                for status, a in op.get("responses", {}).items()
            ]
            out.append(table(["status", "meaning", "content"], answers))
    return "\n".join(out)


def schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return code(schema["$ref"].rsplit("/", 1)[-1])
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return " or ".join(schema_name(o) for o in options)
    if schema.get("type") == "array":
        return "list of " + schema_name(schema.get("items", {}))
    return code(schema.get("type", "any"))


# CLI ----------------------------------------------------------------------------------------------
def walk_commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of a click group, depth first, in the order `--help` lists them."""
    yield path, command
    for name in sorted(getattr(command, "commands", {})):
        sub = command.commands[name]
        if not sub.hidden:
            yield from walk_commands(sub, (*path, name))


def cli_page() -> str:
    """Every command of `finesched`, with its usage, help and parameters, from the typer app."""
    import typer

    from finesched.cli import app

    root = typer.main.get_command(app)
    out = ["# Command line\n", GENERATED]
    for path, command in walk_commands(root, ("finesched",)):
        ctx = typer.Context(command, info_name=" ".join(path))
        out.append(f"## {' '.join(path)}\n")
        out.append(f"```text\n{usage(path, command)}\n```\n")
        if command.help:
            out.append(command.help.strip() + "\n")
        rows = []
        for param in command.params:
            if param.hidden or param.name == "help":
                continue
            if param.param_type_name == "argument":
                names = code(argument_name(param))
            else:
                names = ", ".join(code(o) for o in [*param.opts, *param.secondary_opts])
            default = (
                "required" if param.required else "" if param.default in (None, "", (), False) else code(param.default)
            )
            env = code(param.envvar) if isinstance(param.envvar, str) else ""
            kind = param.display_type(ctx).strip("<>")
            rows.append([names, cell(kind), default, env, cell(getattr(param, "help", None) or "")])
        if rows:
            out.append(table(["parameter", "type", "default", "environment", "help"], rows))
    return "\n".join(out)


def argument_name(param: Any) -> str:
    return param.name.upper() + ("..." if param.nargs == -1 else "")


def usage(path: tuple[str, ...], command: Any) -> str:
    """`finesched plan [OPTIONS] FILES...`: the options, then the arguments (optional ones in brackets)."""
    words = [*path, "[OPTIONS]"] if any(p.param_type_name == "option" for p in command.params) else [*path]
    for param in command.params:
        if param.param_type_name == "argument":
            words.append(argument_name(param) if param.required else f"[{argument_name(param)}]")
    if getattr(command, "commands", None):
        words.append("COMMAND")
    return " ".join(words)


# Metrics ------------------------------------------------------------------------------------------
#: Figures of one node with one GPU, only so the scrape-time collector yields each of its families.
SAMPLE_FIGURES = {"queue_depth": 0, "resources": {"cpu": (0, 1)}, "devices": {("n", "gpu", 0, "gpu-core"): 0.0}}
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}


def metrics_page() -> str:
    """Every metric `/metrics` exposes, from the control plane's own Prometheus registry."""
    from finesched.server.metrics import Metrics

    metrics = Metrics()
    metrics.observe_cluster(lambda: SAMPLE_FIGURES)
    declared = {m._name: m._labelnames for m in vars(metrics).values() if hasattr(m, "_labelnames")}
    rows = []
    for family in metrics.registry.collect():
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"} | set(declared.get(family.name, ())))
        names = [family.name + s for s in SUFFIXES.get(family.type, [""])]
        rows.append([", ".join(code(n) for n in names), family.type, ", ".join(code(x) for x in labels),
                     cell(family.documentation)])  # fmt: skip
    intro = (
        "What `GET /metrics` exposes (Prometheus text format). The cluster's gauges are read when "
        "`/metrics` is scraped, from the leader's state; a replica that is not the leader exposes only "
        "the others.\n"
    )
    return "\n".join(["# Metrics\n", GENERATED, intro, table(["name", "type", "labels", "help"], rows)])


PAGES: dict[str, Callable[[], str]] = {
    "reference/manifests.md": manifests_page,
    "reference/http-api.md": http_api_page,
    "reference/cli.md": cli_page,
    "reference/metrics.md": metrics_page,
    "benchmarks.md": lambda: (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"),
}


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files
