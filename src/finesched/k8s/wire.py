"""The kube-scheduler extender's JSON (PROTOCOLS.md section 1), read and written by hand.

The extender/v1 structs have no json tags, so top-level keys are Go field names (``Pod``,
``NodeNames``, ``FailedNodes``) and Go's decoder matches them case-insensitively: `field` does the
same on input. Output always uses the exact Go names and sends unset fields as ``null``, as Go
does. Plain dicts and `json` rather than pydantic models: a filter call at 5,000 nodes carries a
large body, and building a model per node would cost more than the scheduling decision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

MIN_PRIORITY = 0
MAX_PRIORITY = 10  # MaxExtenderPriority


class WireError(ValueError):
    """A request body that is not the extender JSON (the message names the key)."""


def field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` with Go's case-insensitive key matching (an exact match wins)."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if key.lower() == lower:
            return value
    return None


def decode(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WireError(f"request body is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise WireError("request body must be a JSON object")
    return doc


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter and prioritize arguments: the Pod and either node names (nodeCacheCapable) or Nodes."""

    pod: Any
    names: list[str]
    #: The full Node objects when the scheduler sent them (nodeCacheCapable: false), else None.
    nodes: list[dict[str, Any]] | None


def extender_args(doc: Mapping[str, Any]) -> ExtenderArgs:
    pod = field(doc, "Pod")
    names = field(doc, "NodeNames")
    node_list = field(doc, "Nodes")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise WireError("NodeNames must be a list of node names")
        return ExtenderArgs(pod, names, None)
    if node_list is None:
        return ExtenderArgs(pod, [], None)
    items = node_list.get("items") if isinstance(node_list, dict) else None
    if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
        raise WireError("Nodes must be a NodeList object with an items list")
    return ExtenderArgs(pod, [str((n.get("metadata") or {}).get("name", "")) for n in items], items)


def same_names(args: ExtenderArgs, before: ExtenderArgs) -> ExtenderArgs:
    """`args`, holding `before`'s name list itself when the names are equal (kube-scheduler sends
    the same list to every call): what is kept per list (positions, reply prefixes) is then found
    by identity, without hashing thousands of new strings."""
    if args.nodes is None and before.nodes is None and args.names is not before.names and args.names == before.names:
        return ExtenderArgs(args.pod, before.names, None)
    return args


def filter_result(
    args: ExtenderArgs,
    passed: Sequence[int],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """An ExtenderFilterResult answering in the form the request came in (`passed`: input positions)."""
    if args.nodes is not None:
        nodes: Any = {"metadata": {}, "items": list(map(args.nodes.__getitem__, passed))}
        names: Any = None
    elif isinstance(passed, range) and passed == range(len(args.names)):
        nodes, names = None, list(args.names)  # every node passed (the usual answer)
    else:
        nodes, names = None, list(map(args.names.__getitem__, passed))
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def filter_error(args: ExtenderArgs | None, error: str) -> dict[str, Any]:
    """A failed call: an explicit empty node list (absent lists would also mean "none") and Error."""
    cache = args is None or args.nodes is None
    return {
        "Nodes": None if cache else {"metadata": {}, "items": []},
        "NodeNames": [] if cache else None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": error,
    }


def host_priorities(names: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    return [{"Host": n, "Score": int(s)} for n, s in zip(names, scores, strict=True)]


#: Per list of host names (kube-scheduler sends the same one again and again), each entry's JSON up
#: to its score: ``{"Host":"node-1","Score":`` (a few lists kept).
_PREFIXES: dict[tuple[str, ...], list[str]] = {}
_SUFFIXES = [f"{s}}}" for s in range(MIN_PRIORITY, MAX_PRIORITY + 1)]
#: The last name list object itself and its prefixes (`same_names` hands the same list again).
_LAST_PREFIXES: list[Any] = []


def encode_priorities(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """`encode(host_priorities(names, scores))`, written directly: a prioritize reply at 5,000
    nodes would otherwise build 5,000 dicts only to serialize them."""
    if len(names) != len(scores):
        raise ValueError(f"{len(names)} names but {len(scores)} scores")
    if not all(MIN_PRIORITY <= s <= MAX_PRIORITY for s in (min(scores, default=0), max(scores, default=0))):
        raise ValueError(f"scores must be within {MIN_PRIORITY}..{MAX_PRIORITY}")
    if _LAST_PREFIXES and _LAST_PREFIXES[0] is names:
        prefixes = _LAST_PREFIXES[1]
    else:
        key = tuple(names)
        prefixes = _PREFIXES.get(key)
        if prefixes is None:
            prefixes = [f'{{"Host":{encode_basestring(n)},"Score":' for n in names]
            if len(_PREFIXES) >= 4:
                _PREFIXES.pop(next(iter(_PREFIXES)))
            _PREFIXES[key] = prefixes
        if isinstance(names, list):
            _LAST_PREFIXES[:] = [names, prefixes]
    items = ",".join(map(str.__add__, prefixes, map(_SUFFIXES.__getitem__, scores)))
    return f"[{items}]".encode()


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    namespace: str
    uid: str
    node: str


def binding_args(doc: Mapping[str, Any]) -> BindingArgs:
    values = {k: field(doc, k) for k in ("PodName", "PodNamespace", "PodUID", "Node")}
    for key in ("PodName", "Node"):
        if not isinstance(values[key], str) or not values[key]:
            raise WireError(f"{key} must be a non-empty string")
    return BindingArgs(values["PodName"], values["PodNamespace"] or "default", values["PodUID"] or "", values["Node"])


@dataclass(frozen=True, slots=True)
class Victims:
    uids: list[str]
    pdb_violations: int


def preemption_args(doc: Mapping[str, Any]) -> tuple[Any, dict[str, Victims]]:
    """The Pod and, per node, the victims' UIDs (from either the meta or the full-Pod form)."""
    pod = field(doc, "Pod")
    meta = field(doc, "NodeNameToMetaVictims")
    full = field(doc, "NodeNameToVictims")
    source, full_pods = (meta, False) if meta is not None else (full, True)
    out: dict[str, Victims] = {}
    if source is None:
        return pod, out
    if not isinstance(source, dict):
        raise WireError("NodeNameToMetaVictims must be an object keyed by node name")
    for node, victims in source.items():
        if not isinstance(victims, dict):
            raise WireError(f"victims of node {node} must be an object with Pods")
        uids = []
        for p in field(victims, "Pods") or []:
            uid = (
                ((p.get("metadata") or {}).get("uid") if full_pods else field(p, "UID"))
                if isinstance(p, dict)
                else None
            )
            if not isinstance(uid, str):
                raise WireError(f"victims of node {node}: every pod needs a UID")
            uids.append(uid)
        out[node] = Victims(uids, int(field(victims, "NumPDBViolations") or 0))
    return pod, out


def preemption_result(kept: Mapping[str, Victims]) -> dict[str, Any]:
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in v.uids], "NumPDBViolations": v.pdb_violations}
            for node, v in kept.items()
        }
    }


def encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


#: The last name list object passed whole and its JSON (`encode_filter_result`).
_LAST_NAMES_JSON: list[Any] = []


def encode_filter_result(args: ExtenderArgs, doc: Mapping[str, Any]) -> bytes:
    """`encode(doc)` of `filter_result(args, ...)`: when every node passed, the name list's JSON is
    the request's list again, written once per list (`same_names` hands the same list object to
    every call) instead of once per call."""
    names = doc.get("NodeNames")
    if list(doc) != _FILTER_KEYS or doc["Nodes"] is not None or not isinstance(names, list) or names != args.names:
        return encode(doc)
    if not _LAST_NAMES_JSON or _LAST_NAMES_JSON[0] is not args.names:
        _LAST_NAMES_JSON[:] = [args.names, json.dumps(args.names, separators=(",", ":"))]
    rest = json.dumps(
        {k: doc[k] for k in ("FailedNodes", "FailedAndUnresolvableNodes", "Error")}, separators=(",", ":")
    )
    return f'{{"Nodes":null,"NodeNames":{_LAST_NAMES_JSON[1]},{rest[1:]}'.encode()


_FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
