"""How the CLI shows Topologies: `finesched get topologies` and `describe topology NAME`.

`get` lists each topology's levels (coarse to fine) and how many domains each level has on the
cluster now; `describe` adds one row per domain (coarse levels first): its node count and, per
resource, what is free of what is allocatable (summed over its nodes, by the scheduling leader).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.tables import Columns, col, print_table, simple_table
from finesched.model.resources import CPU, GPU_CORE, MEMORY, human_amount

#: The names `get`, `describe` and `delete` accept for the kind.
NAMES = ("topology", "topologies", "topo")

COLUMNS = Columns(col("name"), col("levels"), col("domains", keep=True))
#: The resources `describe` shows (those the cluster has), in this order; the wide output shows every one.
SHOWN = (CPU, MEMORY, GPU_CORE)


def _levels(item: dict[str, Any]) -> list[str]:
    return [str(level.get("nodeLabel", "")) for level in (item.get("spec") or {}).get("levels") or ()]


def domain_counts(item: dict[str, Any]) -> str:
    """How many domains each level has, coarse to fine ("2/6/48"); "-" when the server did not say
    (a replica that does not schedule)."""
    counts = (item.get("status") or {}).get("domainCounts")
    if counts is None:
        return "-"
    return "/".join(str(counts.get(label, 0)) for label in _levels(item))


def topologies_table(items: list[dict[str, Any]], wide: bool) -> Table:
    table = COLUMNS.table(f"{len(items)} topolog{'y' if len(items) == 1 else 'ies'}", wide=wide)
    for item in items:
        levels = " > ".join(_levels(item))
        COLUMNS.add_row(table, escape(item["metadata"]["name"]), escape(levels), domain_counts(item), wide=wide)
    return table


def print_topology(console: Console, item: dict[str, Any], wide: bool) -> None:
    """A topology's levels, then one row per domain: level, domain, nodes, free/allocatable."""
    console.print(f"[bold]Topology[/] {escape(item['metadata']['name'])}")
    console.print("Levels (coarse to fine):")
    for i, label in enumerate(_levels(item)):
        console.print(f"  {i + 1}. {escape(label)}")
    domains = (item.get("status") or {}).get("domains")
    if domains is None:
        console.print("Domains:  - (this server does not schedule; ask the leader)")
        return
    if not domains:
        console.print("Domains:  none (no node carries these labels)")
        return
    print_table(console, domains_table(domains, wide), wide=wide)


def domains_table(domains: list[dict[str, Any]], wide: bool) -> Table:
    """LEVEL, DOMAIN, NODES and one FREE/ALLOCATABLE column per resource the domains have."""
    present: list[str] = []
    for domain in domains:
        present += [r for r in domain.get("allocatable") or {} if r not in present]
    resources = [r for r in SHOWN if r in present]
    if wide:
        resources += sorted(r for r in present if r not in SHOWN)
    headers: list[Any] = ["level", "domain", col("nodes", right=True)]
    headers += [col(f"{r} free/alloc", right=True) for r in resources]
    rows = []
    for domain in domains:
        free, alloc = domain.get("free") or {}, domain.get("allocatable") or {}
        amounts = [_free_of(r, free, alloc) for r in resources]
        rows.append((escape(domain["level"]), escape(domain["name"]), str(domain["nodes"]), *amounts))
    return simple_table(f"{len(domains)} domain(s)", headers, rows)


def _free_of(resource: str, free: dict[str, Any], allocatable: dict[str, Any]) -> str:
    """``free/allocatable`` of one resource ("6/8", "30Gi/32Gi"); "-" where the domain has none. The
    API gives amounts as decimal text of canonical units (millicores, bytes), not as quantities."""
    if resource not in allocatable:
        return "-"
    return f"{human_amount(resource, int(free.get(resource, 0)))}/{human_amount(resource, int(allocatable[resource]))}"
