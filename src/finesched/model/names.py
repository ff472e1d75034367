"""Object names as Kubernetes has them (RFC 1123): namespaces are DNS labels, names DNS subdomains.

A name ends up in URLs (``/v1/workloads/{namespace}/{name}``), in event keys (``namespace/name``)
and, on the node, in the paths the agent writes under; so a ``/``, an upper-case letter, a space or
300 characters must be refused when the object is written, not found when something breaks
later. The rules and messages are Kubernetes' own (apimachinery ``IsDNS1123Label`` and
``IsDNS1123Subdomain``), so a name valid here is valid there and the other way round.

`NamespaceName` and `ObjectName` are pydantic field types: every model that carries a name uses
them, so manifests (`finesched validate`), the API and every other door check one rule.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
SUBDOMAIN_FMT = rf"{LABEL_FMT}(\.{LABEL_FMT})*"
_LABEL = re.compile(rf"^{LABEL_FMT}$")
_SUBDOMAIN = re.compile(rf"^{SUBDOMAIN_FMT}$")

LABEL_RULE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    f"and end with an alphanumeric character (e.g. 'my-name', or '123-abc', regex used for validation is '{LABEL_FMT}')"
)
SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{SUBDOMAIN_FMT}')"
)


def _problems(value: str, longest: int, pattern: re.Pattern[str], rule: str) -> list[str]:
    """Kubernetes' two checks, both reported: the length, then the characters."""
    problems = [f"must be no more than {longest} characters"] if len(value) > longest else []
    return problems + ([] if pattern.match(value) else [rule])


def label_problems(value: str) -> list[str]:
    """Why `value` is not a DNS-1123 label (empty: it is one)."""
    return _problems(value, LABEL_MAX, _LABEL, LABEL_RULE)


def subdomain_problems(value: str) -> list[str]:
    """Why `value` is not a DNS-1123 subdomain (empty: it is one)."""
    return _problems(value, SUBDOMAIN_MAX, _SUBDOMAIN, SUBDOMAIN_RULE)


def key_problem(key: str) -> str | None:
    """Why a workload key ``namespace/name`` breaks the name rules (None: it does not)."""
    namespace, _, name = key.partition("/")
    problems = [f"namespace: {p}" for p in label_problems(namespace)] + [f"name: {p}" for p in subdomain_problems(name)]
    return problems[0] if problems else None


def is_label(value: str) -> bool:
    return not label_problems(value)


def is_subdomain(value: str) -> bool:
    return not subdomain_problems(value)


def _check(problems: list[str], value: str) -> str:
    if problems:
        raise ValueError("; ".join(problems))
    return value


def _label(value: str) -> str:
    return _check(label_problems(value), value)


def _subdomain(value: str) -> str:
    return _check(subdomain_problems(value), value)


#: A namespace: a DNS-1123 label (at most 63 characters).
NamespaceName = Annotated[
    str, Field(min_length=1, json_schema_extra={"maxLength": LABEL_MAX, "pattern": f"^{LABEL_FMT}$"}),
    AfterValidator(_label),
]  # fmt: skip
#: The name of a workload, job, tenant or node: a DNS-1123 subdomain (at most 253 characters).
ObjectName = Annotated[
    str, Field(min_length=1, json_schema_extra={"maxLength": SUBDOMAIN_MAX, "pattern": f"^{SUBDOMAIN_FMT}$"}),
    AfterValidator(_subdomain),
]  # fmt: skip
