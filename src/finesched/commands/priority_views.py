"""How the CLI shows PriorityClasses: `finesched get priorityclasses` and `describe priorityclass`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.tables import Columns, col

#: The names `get`, `describe` and `delete` accept for the kind (kubectl's short name too).
NAMES = ("priorityclass", "priorityclasses", "pc")

COLUMNS = Columns(
    col("name"), col("value", right=True, keep=True), col("global default", keep=True),
    col("preemption policy"), col("description", wide=True),
)  # fmt: skip


def classes_table(items: list[dict[str, Any]], wide: bool) -> Table:
    table = COLUMNS.table(f"{len(items)} priority class(es)", wide=wide)
    for item in items:
        spec = item.get("spec") or {}
        policy = spec.get("preemptionPolicy", "PreemptLowerPriority")
        COLUMNS.add_row(table, escape(item["metadata"]["name"]), str(spec.get("value", 0)),
                        "yes" if spec.get("globalDefault") else "", policy, escape(spec.get("description", "")),
                        wide=wide)  # fmt: skip
    return table


def print_class(console: Console, item: dict[str, Any]) -> None:
    """A class's fields, one a line (its events follow, printed by the caller)."""
    spec = item.get("spec") or {}
    console.print(f"[bold]PriorityClass[/] {escape(item['metadata']['name'])}")
    console.print(f"Value:             {spec.get('value', 0)}")
    console.print(f"Global default:    {'yes' if spec.get('globalDefault') else 'no'}")
    console.print(f"Preemption policy: {spec.get('preemptionPolicy', 'PreemptLowerPriority')}")
    if spec.get("description"):
        console.print(f"Description:       {escape(spec['description'])}", soft_wrap=True)
