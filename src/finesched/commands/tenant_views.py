"""How `finesched describe tenant` shows a tenant: its effective spec, every field with the value the
scheduler applies, defaults named as such ("weight 1 (default)"), never a bare ``Spec: {}``.

The API answers the spec as it was written (a tenant created with nothing has an empty one); the
defaults come from the model (`finesched.model.tenant.Tenant`), so this cannot drift from them.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from finesched.errors import ValidationError
from finesched.model.manifest import API_VERSION, parse_manifest
from finesched.model.resources import human_amounts
from finesched.model.tenant import Tenant


def tenant_lines(item: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) per field of the tenant's effective spec; a field it does not set says "(default)"."""
    spec = item.get("spec") or {}
    doc = {"apiVersion": API_VERSION, "kind": "Tenant", "metadata": item["metadata"], "spec": spec}
    try:
        tenant = parse_manifest(doc)
    except ValidationError as exc:  # stored before a rule tightened: show what is stored, and why
        return [("Spec", str(spec)), ("Invalid", str(exc))]
    assert isinstance(tenant, Tenant)

    def given(key: str, text: str) -> str:
        return text if key in spec else f"{text} (default)"

    limits = tenant.limits
    counts = {k: getattr(limits, k) if limits else None for k in ("workloads", "jobs", "pending")}
    run_as = f"uid {tenant.run_as.uid}, gid {tenant.run_as.gid}" if tenant.run_as else "a uid from each agent's range"
    classes = ", ".join(tenant.priority_classes or ()) or "only the global default"
    return [
        ("Weight", given("weight", f"{tenant.weight:g}")),
        ("Quota", given("quota", human_amounts(tenant.quota or {}) or "none: no hard cap")),
        ("Min", given("min", human_amounts(tenant.min or {}) or "none: nothing guaranteed")),
        ("Max", given("max", human_amounts(tenant.max or {}) or "none: no elastic cap")),
        ("Parent", given("parent", tenant.parent or "none: a root tenant")),
        ("Namespaces", ", ".join(tenant.owned_namespaces) or "none"),
        ("Run as", given("runAs", run_as)),
        ("Priority classes", given("priorityClasses", classes)),
        ("Limits", given("limits", ", ".join(f"{k} {'no limit' if v is None else v}" for k, v in counts.items()))),
    ]  # fmt: skip


def print_tenant(console: Console, item: dict[str, Any]) -> None:
    """The tenant's effective spec, one field a line (conditions and events are the caller's)."""
    lines = tenant_lines(item)
    width = max(len(label) for label, _ in lines) + 2
    for label, value in lines:
        console.print(f"{label + ':':<{width}}{escape(value)}")
