"""Manifests: Kubernetes-shaped YAML/JSON documents <-> finesched models.

Every document is ``{apiVersion: finesched.io/v1alpha1, kind, metadata, spec}`` with exactly the
field names of DESIGN.md "Manifest shapes". Loading is all-or-nothing: every document of every
file is checked, every problem is reported with its file, document number (1-based), field path,
bad value and rule, and nothing is returned unless all of them are valid. So a user fixes a file
in one pass, and a half-loaded cluster never reaches the scheduler.
"""

from __future__ import annotations

import json
import types
import typing
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import pydantic_core
import yaml

from finesched.errors import ErrorDetail, ValidationError
from finesched.model.job import Job
from finesched.model.node import Node
from finesched.model.priority_class import PriorityClass
from finesched.model.tenant import Tenant
from finesched.model.topology import Topology
from finesched.model.workload import Workload

API_VERSION = "finesched.io/v1alpha1"
Object = Node | Workload | Tenant | Job | PriorityClass | Topology
KINDS: dict[str, type[Object]] = {
    "Node": Node,
    "Workload": Workload,
    "Tenant": Tenant,
    "Job": Job,
    "PriorityClass": PriorityClass,
    "Topology": Topology,
}
#: Metadata the server sets on every kind and a manifest may carry back (as read with `get -o yaml`):
#: accepted, checked for its form, and not part of the object itself (`manifest_uid` reads it).
SERVER_METADATA = ("uid",)
#: Which model fields live under `metadata` for each kind; all others live under `spec`.
METADATA_FIELDS: dict[str, tuple[str, ...]] = {
    "Node": ("name", "labels"),
    "Workload": ("name", "namespace", "labels", "annotations"),
    "Tenant": ("name",),
    "Job": ("name", "namespace", "labels"),
    "PriorityClass": ("name",),
    "Topology": ("name",),
}


@dataclass
class Manifests:
    """Everything loaded from a set of manifest files, by kind, in file order."""

    nodes: list[Node] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    tenants: list[Tenant] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    priority_classes: list[PriorityClass] = field(default_factory=list)
    topologies: list[Topology] = field(default_factory=list)
    #: Where each object was read ("file doc N"), by (kind, key); filled by `load_manifests`.
    origins: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False)
    #: The YAML node of each document read, by where ("file doc N"): the line of a field (`with_lines`).
    yaml_nodes: dict[str, yaml.Node] = field(default_factory=dict, repr=False, compare=False)

    def add(self, obj: Object, where: str = "") -> None:
        by_kind = {Node: self.nodes, Workload: self.workloads, Tenant: self.tenants, Job: self.jobs,
                   PriorityClass: self.priority_classes, Topology: self.topologies}  # fmt: skip
        by_kind[type(obj)].append(obj)
        if where:
            self.origins[(type(obj).__name__, object_key(obj))] = where

    def where(self, obj: Object) -> str:
        """The file and document `obj` was read from ("" when it was not read from a file)."""
        return self.origins.get((type(obj).__name__, object_key(obj)), "")

    def with_lines(self, details: Iterable[ErrorDetail]) -> list[ErrorDetail]:
        """`details` each placed on the line of its field in its document ("file doc 2, line 14"),
        where the document was read here and the field (or the nearest field above it) is in it."""
        return [_with_line(d, self.yaml_nodes.get(d.where)) for d in details]

    def __iter__(self) -> typing.Iterator[Object]:
        yield from self.priority_classes
        yield from self.topologies
        yield from self.tenants
        yield from self.nodes
        yield from self.workloads
        yield from self.jobs

    def __len__(self) -> int:
        kinds = (self.nodes, self.workloads, self.tenants, self.jobs, self.priority_classes, self.topologies)
        return sum(len(objects) for objects in kinds)


def parse_manifest(doc: object, *, where: str = "") -> Object:
    """Validate one manifest document and return its model; raise ValidationError listing every problem."""
    return _parse(doc, where, _as_json)


def parse_decoded_manifest(doc: Mapping[str, Any], *, where: str = "") -> Object:
    """`parse_manifest` of a document decoded from JSON text (a stored row): the same model, or the
    same error.

    The fields are re-encoded for the strict JSON validation by pydantic-core's encoder, several
    times faster than `json.dumps` on a node's CPU list (a fifth of a state rebuild). On values
    decoded from JSON (strings, numbers, booleans, null, lists, mappings) both encoders give texts
    that decode to the same values (floats, NaN and infinities included); anything else (a string
    with a lone surrogate, which pydantic-core refuses, or a document that does not validate) goes
    through `parse_manifest` itself, so the error is exactly its error."""
    try:
        return _parse(doc, where, _as_json_fast)
    except Exception:
        return parse_manifest(doc, where=where)


def _as_json_fast(data: Mapping[str, Any]) -> bytes:
    return pydantic_core.to_json(data, inf_nan_mode="constants")


def _parse(doc: object, where: str, as_json: typing.Callable[[Mapping[str, Any]], str | bytes]) -> Object:
    if not isinstance(doc, Mapping):
        raise ValidationError([ErrorDetail("", f"a manifest is a mapping, got {type(doc).__name__}", where=where)])
    problems = _envelope_problems(doc)
    errors = [ErrorDetail(p, m, v, where) for p, m, v in problems]
    kind, metadata, spec = doc.get("kind"), doc.get("metadata"), doc.get("spec") or {}
    if not (isinstance(kind, str) and kind in KINDS and isinstance(metadata, Mapping) and isinstance(spec, Mapping)):
        raise ValidationError(errors)  # nothing more can be checked without a kind and two mappings
    clash = sorted(set(spec) & set(METADATA_FIELDS[kind]))
    errors += [ErrorDetail(f"spec.{k}", "belongs in metadata, not spec", where=where) for k in clash]
    # The spec is checked even when the envelope has problems, so one pass reports everything;
    # unknown metadata fields are already reported above and left out here.
    known_metadata = {k: v for k, v in metadata.items() if k in METADATA_FIELDS[kind]}
    model = KINDS[kind]
    try:
        obj = model.model_validate_json(as_json({**known_metadata, **spec}), strict=True)
    except _NotJSON as exc:
        rule = "is not JSON data (a string, number, boolean, list or mapping)"
        errors.append(ErrorDetail(exc.path, rule, where=where))
    except pydantic.ValidationError as exc:
        reported = {e.path for e in errors}
        errors += [d for d in (_detail(model, kind, e, where) for e in exc.errors()) if d.path not in reported]
    if errors:
        raise ValidationError(errors)
    return obj


class _NotJSON(ValueError):
    def __init__(self, path: str):
        self.path = path


def _as_json(data: Mapping[str, Any]) -> str:
    """The fields as JSON text: manifests are validated as JSON is, strictly (a boolean is true or
    false, not 0; a count is 4, not "4"), so YAML, JSON and the API's schema accept the same."""
    try:
        return json.dumps(data, allow_nan=True)
    except (TypeError, ValueError):
        for key, value in data.items():  # name the field that holds what JSON cannot (a YAML date)
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                raise _NotJSON(f"spec.{key}") from None
        raise _NotJSON("spec") from None


def _envelope_problems(doc: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    problems: list[tuple[str, str, Any]] = []
    allowed = {"apiVersion", "kind", "metadata", "spec"}
    problems += [(k, f"unknown field; allowed: {sorted(allowed)}", doc[k]) for k in doc if k not in allowed]
    if doc.get("apiVersion") != API_VERSION:
        problems.append(("apiVersion", f"must be {API_VERSION}", doc.get("apiVersion")))
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        problems.append(("kind", f"must be one of {sorted(KINDS)}", kind))
        return problems
    metadata = doc.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        problems.append(("metadata", "must be a mapping with at least a name", metadata))
    elif not isinstance(metadata, Mapping) or not metadata.get("name"):
        problems.append(("metadata.name", "is required", metadata.get("name") if metadata else None))
    else:
        allowed_meta = (*METADATA_FIELDS[kind], *SERVER_METADATA)
        problems += [
            (f"metadata.{k}", f"unknown field; allowed for {kind}: {list(allowed_meta)}", metadata[k])
            for k in metadata
            if k not in allowed_meta
        ]
        if "uid" in metadata and uid_problem(metadata["uid"]):
            problems.append(("metadata.uid", uid_problem(metadata["uid"]), metadata["uid"]))
    spec = doc.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        problems.append(("spec", "must be a mapping", spec))
    return problems


def uid_problem(value: object) -> str:
    """What is wrong with `value` as an object's uid ("" when nothing): a UUID in its text form."""
    if not isinstance(value, str):
        return "must be a string (the UUID the server gave the object)"
    try:
        uuid.UUID(value)
    except ValueError:
        return "must be a UUID such as 0f8fad5b-d9cb-469f-a165-70867728950e (the one the server gave the object)"
    return ""


def manifest_uid(doc: object) -> str | None:
    """The `metadata.uid` a (valid) manifest document carries, in canonical form; None when none."""
    metadata = doc.get("metadata") if isinstance(doc, Mapping) else None
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    return str(uuid.UUID(uid)) if isinstance(uid, str) and not uid_problem(uid) else None


def _detail(model: type[pydantic.BaseModel], kind: str, error: Mapping[str, Any], where: str) -> ErrorDetail:
    """Turn one pydantic error into an ErrorDetail with the manifest's own field path."""
    loc = tuple(error["loc"])
    section = "metadata" if loc and loc[0] in METADATA_FIELDS[kind] else "spec"
    path = _format_path((section, *loc))
    kind_of_error, message = error["type"], error["msg"]
    value = error.get("input")
    if kind_of_error == "extra_forbidden":
        allowed = _allowed_fields(model, loc[:-1], exclude=METADATA_FIELDS[kind] if len(loc) == 1 else ())
        return ErrorDetail(path, f"unknown field; allowed: {allowed}" if allowed else "unknown field", where=where)
    if kind_of_error == "missing":
        return ErrorDetail(path, "is required", where=where)
    if kind_of_error == "resource":
        return ErrorDetail(path, message, where=where)  # the message already quotes the value
    message = message.removeprefix("Value error, ")
    if kind_of_error != "invalid" and message[1:2].islower():  # pydantic's sentences start upper-case
        message = message[:1].lower() + message[1:]
    if isinstance(value, Mapping) and len(loc) == 0:
        return ErrorDetail(path, message, where=where)
    return ErrorDetail(path, message, value, where)


def _format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _allowed_fields(model: type[pydantic.BaseModel], loc: Sequence[str | int], exclude: Sequence[str]) -> list[str]:
    """The field names allowed at `loc` inside `model`, as the manifest spells them."""
    current: type[pydantic.BaseModel] | None = model
    for part in loc:
        if current is None:
            return []
        if isinstance(part, int):
            continue
        info = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        current = _model_in(info.annotation) if info is not None else None
    if current is None:
        return []
    spelled = getattr(current, "MANIFEST_FIELDS", None)  # a model with two manifest forms lists both
    if spelled is not None:
        return list(spelled)
    return [f.alias or n for n, f in current.model_fields.items() if n not in exclude]


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key repeated in one mapping (YAML 1.2 forbids it; PyYAML
    would keep the last value silently, so `cpu: 1` then `cpu: 64` would load 64 unannounced)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in one object")
        out[key] = value
    return out


def _syntax_problem(exc: Exception) -> str:
    """One line: where in the file (line, column; 1-based) and what is wrong."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1} column {mark.column + 1}: {exc.problem}"
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno} column {exc.colno}: {exc.msg}"
    return str(exc).replace("\n", " ")


def read_documents(path: str | Path) -> list[object]:
    """The documents of one YAML (multi-document) or JSON (object or array) file; repeated keys are errors."""
    return [doc for doc, _ in read_document_nodes(path)]


def read_document_nodes(path: str | Path) -> list[tuple[object, yaml.Node | None]]:
    """`read_documents`, each document with its YAML node (None where it cannot be had): the lines
    of its fields."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError([ErrorDetail("", f"cannot read: {exc.strerror}", where=str(path))]) from None
    except UnicodeDecodeError as exc:
        message = f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        raise ValidationError([ErrorDetail("", message, where=str(path))]) from None
    return parse_document_nodes(text, "JSON" if path.suffix.lower() == ".json" else "YAML", where=str(path))


def parse_documents(text: str, kind: str = "YAML", *, where: str = "") -> list[object]:
    """The documents of YAML (multi-document) or JSON (object or array) text; repeated keys are errors."""
    return [doc for doc, _ in parse_document_nodes(text, kind, where=where)]


def parse_document_nodes(text: str, kind: str = "YAML", *, where: str = "") -> list[tuple[object, yaml.Node | None]]:
    """`parse_documents`, each document with its YAML node (composed in the same pass; for JSON,
    composed again as YAML, which JSON nearly always is, else None)."""
    try:
        if kind == "JSON":
            data = json.loads(text, object_pairs_hook=_unique_json_object)
            docs = list(data) if isinstance(data, list) else [data]
            nodes = _json_nodes(text, isinstance(data, list))
            return list(zip(docs, nodes if len(nodes) == len(docs) else [None] * len(docs), strict=True))
        loader = _UniqueKeyLoader(text)
        found: list[tuple[object, yaml.Node | None]] = []
        try:
            while loader.check_node():
                node = loader.get_node()
                doc = loader.construct_document(node)
                if doc is not None:
                    found.append((doc, node))
        finally:
            loader.dispose()
        return found
    except (yaml.YAMLError, ValueError) as exc:  # JSONDecodeError is a ValueError
        message = f"is not valid {kind}: {_syntax_problem(exc)}"
        raise ValidationError([ErrorDetail("", message, where=where)]) from None


def _json_nodes(text: str, listed: bool) -> list[yaml.Node | None]:
    """The YAML nodes of a JSON file's documents (the array's items, or the one object); [] when
    YAML cannot read it (lines are then left out)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []
    if listed:
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []
    return [node]


def field_line(node: yaml.Node | None, path: str) -> int | None:
    """The 1-based line of the field at `path` ("spec.requests.cpu", "spec.tasks[2].id") in a
    document's node: the line of its key (a list item's own line), or of the nearest field above
    it that the document has (a missing field: where its parent is). Keys may hold dots
    ("koordinator.sh/gpu-core"): the longest key that matches the path's next part is taken."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    rest = path
    while rest and node is not None:
        if isinstance(node, yaml.MappingNode):
            match = _matching_key(node, rest)
            if match is None:
                break
            key, node = match
            line = key.start_mark.line + 1
            rest = rest[len(key.value) :].removeprefix(".")
        elif isinstance(node, yaml.SequenceNode) and rest.startswith("["):
            index, _, rest = rest[1:].partition("]")
            rest = rest.removeprefix(".")
            if not index.isdigit() or int(index) >= len(node.value):
                break
            node = node.value[int(index)]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _matching_key(node: yaml.MappingNode, rest: str) -> tuple[yaml.Node, yaml.Node] | None:
    """The (key, value) of `node` whose key begins `rest` as a whole path part (the longest one)."""
    best: tuple[yaml.Node, yaml.Node] | None = None
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        whole = isinstance(name, str) and rest.startswith(name) and rest[len(name) : len(name) + 1] in ("", ".", "[")
        if not whole:
            continue
        if best is None or len(name) > len(best[0].value):
            best = (key, value)
    return best


def _with_line(detail: ErrorDetail, node: yaml.Node | None) -> ErrorDetail:
    line = field_line(node, detail.path)
    if line is None or not detail.where:
        return detail
    return ErrorDetail(detail.path, detail.message, detail.value, f"{detail.where}, line {line}")


def load_manifests(*paths: str | Path) -> Manifests:
    """Load and validate every document of every file; all or nothing (see the module docstring)."""
    manifests, errors = read_manifests(*paths)
    if errors:
        raise ValidationError(errors)
    return manifests


def read_manifests(*paths: str | Path) -> tuple[Manifests, list[ErrorDetail]]:
    """Every valid document of every file, and every problem of the others (what `load_manifests`
    refuses as a whole; `finesched validate` also checks the valid ones further)."""
    manifests = Manifests()
    errors: list[ErrorDetail] = []
    seen: dict[tuple[str, str], str] = {}
    for path in paths:
        try:
            documents = read_document_nodes(path)
        except ValidationError as exc:
            errors += exc.errors
            continue
        for number, (doc, node) in enumerate(documents, start=1):
            where = f"{path} doc {number}"
            if node is not None:
                manifests.yaml_nodes[where] = node
            try:
                obj: Object | None = parse_manifest(doc, where=where)
            except ValidationError as exc:
                errors += manifests.with_lines(exc.errors)
                obj = None
            # Every document claims its name, an invalid one too, so a duplicate is reported either way.
            key = _document_key(doc) if obj is None else (type(obj).__name__, object_key(obj))
            if key is not None and key in seen:
                duplicate = ErrorDetail("metadata.name", f"duplicate {key[0]} (first in {seen[key]})", key[1], where)
                errors += manifests.with_lines([duplicate])
                continue
            if key is not None:
                seen[key] = where
            if obj is not None:
                manifests.add(obj, where)
    return manifests, errors


def _document_key(doc: object) -> tuple[str, str] | None:
    """The (kind, key) a document claims, read from its raw fields; None when it names none."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("metadata"), Mapping):
        return None
    kind, metadata = doc.get("kind"), doc["metadata"]
    name = metadata.get("name")
    if not isinstance(kind, str) or kind not in KINDS or not isinstance(name, str) or not name:
        return None
    if kind in ("Workload", "Job"):
        return kind, f"{metadata.get('namespace') or 'default'}/{name}"
    return kind, name


def object_key(obj: Object) -> str:
    """What names `obj` among the objects of its kind: ``namespace/name`` or the name."""
    return f"{obj.namespace}/{obj.name}" if isinstance(obj, Workload | Job) else obj.name


def to_manifest(obj: Object) -> dict[str, Any]:
    """The manifest document for `obj`; `parse_manifest(to_manifest(x)) == x`."""
    kind = type(obj).__name__
    data = obj.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    meta_names = METADATA_FIELDS[kind]
    metadata = {k: v for k, v in data.items() if k in meta_names}
    metadata["name"] = obj.name
    spec = {k: v for k, v in data.items() if k not in meta_names}
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def dump(objects: Iterable[Object], fmt: str = "yaml") -> str:
    """Serialize objects as one multi-document YAML stream, or a JSON array."""
    docs = [to_manifest(o) for o in objects]
    if fmt == "json":
        return json.dumps(docs, indent=2)
    return yaml.safe_dump_all(docs, sort_keys=False)
