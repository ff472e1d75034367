"""Label selectors as text, in Kubernetes' syntax (`kubectl -l`, `?labelSelector=`).

``a=b,c!=d,e in (x,y),f notin (z),g,!h``: every requirement must hold (a comma between
requirements is AND). ``a=b`` and ``a==b``: label a is b; ``a!=b``: a is absent or not b; ``in`` /
``notin``: one of / none of the set (``notin`` also holds when the label is absent); ``g``: the
label exists; ``!h``: it does not. An empty selector matches everything. Keys and values follow
Kubernetes' label rules (an optional DNS-subdomain prefix and a ``/``, then a name of at most 63
alphanumerics, ``-``, ``_``, ``.``; a value may be empty).

The text parses into the `DeviceLabelSelector` model (matchLabels + matchExpressions), whose
`matches` is the one implementation of what a selector selects.
"""

from __future__ import annotations

import re

from finesched.errors import ValidationError
from finesched.model.workload import DeviceLabelSelector, NodeAffinityTerm

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = rf"(?:[a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}"
_VALUE = rf"(?:{_NAME})?"
_EXISTS = re.compile(rf"^(?P<not>!)?\s*(?P<key>{_KEY})$")
_EQUALS = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})$")
_SET = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
MAX_SELECTOR = 4096


def _requirements(text: str) -> list[str]:
    """The requirements of `text`: split at the commas outside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_selector(text: str, path: str = "labelSelector") -> DeviceLabelSelector:
    """The selector `text` says; ValidationError naming each requirement it cannot read."""
    if len(text) > MAX_SELECTOR:
        raise ValidationError(f"must be no more than {MAX_SELECTOR} characters", path=path, value=text[:80] + "...")
    labels: dict[str, str] = {}
    terms: list[NodeAffinityTerm] = []
    problems = []
    if not text.strip():
        return DeviceLabelSelector()
    for requirement in _requirements(text):
        if (m := _EQUALS.match(requirement)) is not None:
            key, value = m["key"], m["value"]
            if m["op"] == "!=":
                terms.append(NodeAffinityTerm(key=key, operator="NotIn", values=(value,)))
            elif key in labels and labels[key] != value:
                terms.append(NodeAffinityTerm(key=key, operator="In", values=(value,)))  # a=b,a=c: nothing matches
            else:
                labels[key] = value
        elif (m := _SET.match(requirement)) is not None:
            values = tuple(v.strip() for v in m["values"].split(","))
            bad = [v for v in values if not re.fullmatch(_VALUE, v)]
            if not m["values"].strip() or bad:
                why = "an empty set" if not m["values"].strip() else f"{bad[0]!r} is not a label value"
                problems.append(f"{requirement!r}: {why}")
                continue
            terms.append(NodeAffinityTerm(key=m["key"], operator="In" if m["op"] == "in" else "NotIn", values=values))
        elif (m := _EXISTS.match(requirement)) is not None:
            terms.append(NodeAffinityTerm(key=m["key"], operator="DoesNotExist" if m["not"] else "Exists"))
        else:
            problems.append(
                f"{requirement!r} is not a requirement (use key=value, key!=value, key in (a,b), "
                "key notin (a,b), key or !key, separated by commas)"
            )
    if problems:
        raise ValidationError("; ".join(problems), path=path, value=text)
    return DeviceLabelSelector(match_labels=labels, match_expressions=tuple(terms))
