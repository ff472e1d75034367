"""`finesched plan`: schedule manifests through the queue and show every decision, offline or against a server.

Offline (`finesched plan CLUSTER.yaml WORKLOADS.yaml`): the same Scheduler the server and the
simulator use, on the nodes and tenants of the files; nothing is written anywhere. With
`--server URL` the workloads of the files are planned by the control plane (`POST /v1/plan`) on a
copy of its live state: where they would go now, nothing stored.

Output is a table (or JSON/YAML for scripts, one shape for both: `finesched.sched.records`) plus a
summary. Preemptions (on in the default profile; `--no-preemption` turns them off offline) are
listed with who was evicted for whom and why; an evicted workload's row says so. With
`--defragment` a workload that fits nowhere may be placed by moving running workloads that allow it
(`spec.migration`; offline: workloads of earlier waves), as the control plane's defragmenter would:
the moves are listed (who, from which node and GPUs to which, why) under the decisions. Tables fit
an 80-column terminal (`commands/tables.py`); `-o wide` adds the tenant column and shortens nothing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.devices import format_grants
from finesched.commands.tables import Columns, col, print_table, simple_table
from finesched.errors import ErrorDetail
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.manifest import Manifests
from finesched.model.resources import human_amount, human_amounts
from finesched.model.workload import Workload
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS, node_report
from finesched.sched.defrag import Defragmenter, DefragPlan
from finesched.sched.framework import Preemption
from finesched.sched.profile import Defragmentation, Profile
from finesched.sched.records import decision_records
from finesched.sched.scheduler import Result, Scheduler
from finesched.sched.tenant_usage import binding_amounts
from finesched.state.cluster import ClusterState

OUTPUTS = ("table", "wide", "json", "yaml")


@dataclass
class PlanOutcome:
    state: ClusterState
    scheduler: Scheduler
    results: list[Result]
    preemptions: list[Preemption] = field(default_factory=list)
    defragmentations: list[DefragPlan] = field(default_factory=list)


def run_plan(
    manifests: Manifests,
    profile: str | Profile = "default",
    *,
    preemption: bool = True,
    waves: Sequence[Sequence[Workload]] | None = None,
    defragment: bool = False,
) -> PlanOutcome:
    """Schedule every workload of `manifests` on its nodes through the queue (priority, DRF, preemption).

    With `waves`, each group of workloads is submitted and scheduled after the previous one (work
    that arrives later, e.g. a high-priority service after batch jobs filled the cluster: what
    preemption is for); without, all workloads are submitted at once. `defragment`: a workload that
    fits nowhere may move placed movable ones (with the profile's defragmentation settings, else
    the defaults), as a profile with `defragmentation` does anyway.
    """
    state = ClusterState.from_nodes(manifests.nodes)
    scheduler = Scheduler(state, profile, manifests.tenants, preemption=preemption, topologies=manifests.topologies)
    if defragment and scheduler.defragmenter is None:
        scheduler.defragmenter = Defragmenter(Defragmentation())
    results: list[Result] = []
    for wave in waves if waves is not None else [manifests.workloads]:
        scheduler.submit(wave)
        results += scheduler.run(report_waiting=False)
    results += scheduler.run()
    return PlanOutcome(state, scheduler, results, scheduler.take_preemptions(), scheduler.take_defragmentations())


def resolve_classes(
    manifests: Manifests, waves: Sequence[Sequence[Workload]] | None, warn: Callable[[ErrorDetail], None]
) -> tuple[Manifests, list[list[Workload]] | None]:
    """The workloads (and waves) with their PriorityClasses of the files resolved, as the server's
    admission resolves them; a class the files do not define is a warning (`warn`), an inconsistent
    workload (a class and another raw priority) a ValidationError. A gang's topology must be one the
    files define, with its levels (the plan's cluster is the files'): a ValidationError otherwise."""
    from finesched.admission import World, admit_priority, admit_priority_class, topology_problems
    from finesched.errors import ValidationError

    world = World(strict=False, topologies={t.name: t for t in manifests.topologies})
    for cls in manifests.priority_classes:  # a second global default is an error, as on the server
        world = world.with_priority_class(admit_priority_class(cls, world, where=manifests.where(cls)))
    strict = dataclasses.replace(world, strict=True)

    def resolved(workloads: Sequence[Workload]) -> list[Workload]:
        problems = [
            problem
            for w in workloads
            if w.gang is not None and w.gang.topology is not None
            for problem in topology_problems(w.gang.topology, strict, "spec.gang.topology", manifests.where(w))
        ]
        if problems:
            raise ValidationError(problems)
        return [admit_priority(w, world, where=manifests.where(w)) for w in workloads]

    out = dataclasses.replace(manifests, workloads=resolved(manifests.workloads))
    groups = [resolved(wave) for wave in waves] if waves is not None else None
    for detail in {(w.path, w.message, repr(w.value)): w for w in world.warnings}.values():
        warn(detail)
    return out, groups


def utilization(state: ClusterState) -> dict[str, float]:
    """Fraction of each resource held by bindings, cluster-wide (resources with capacity only).

    Held amounts are summed from the bindings themselves (scalar requests and device grants),
    so device dimensions count exactly like scalar ones.
    """
    held: dict[str, int] = {}
    for binding in state.bindings.values():
        for name, amount in binding_amounts(binding).items():
            held[name] = held.get(name, 0) + amount
    return {name: held.get(name, 0) / total for name, total in state.totals().items() if total > 0}


def outcome_doc(outcome: PlanOutcome, manifests: Manifests, *, show_nodes: bool = False) -> dict[str, Any]:
    """The `-o json` document: results, summary (with utilization), preemptions, nodes (`--show-nodes`)."""
    tenants = {w.key: w.tenant for w in manifests.workloads}
    misses = outcome.scheduler.preemption_misses
    doc = decision_records(outcome.results, outcome.preemptions, tenants, misses, None, outcome.defragmentations)
    defragmenter = outcome.scheduler.defragmenter
    if defragmenter is not None:
        source = "profile" if outcome.scheduler.profile.defragmentation is not None else "defaults"
        doc["defragmentation"] = {"settings": defragmenter.config.model_dump(mode="json", by_alias=True),
                                  "source": source}  # fmt: skip
    doc["summary"]["utilization"] = {k: round(v, 4) for k, v in utilization(outcome.state).items()}
    if show_nodes:
        doc["nodes"] = [node_report(outcome.state, name) for name in outcome.state.names]
    return doc


def render(
    outcome: PlanOutcome, manifests: Manifests, output: str, console: Console, *, show_nodes: bool = False
) -> None:
    doc = outcome_doc(outcome, manifests, show_nodes=show_nodes)
    if output in ("json", "yaml"):
        text = json.dumps(doc, indent=2) if output == "json" else yaml.safe_dump(doc, sort_keys=False)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    render_doc(doc, console, wide=output == "wide")
    if doc.get("defragmentation"):
        console.print(defragmentation_note(doc["defragmentation"]))
    if show_nodes:
        print_table(console, node_reports_table(doc["nodes"], wide=output == "wide"), wide=output == "wide")


def render_doc(doc: Mapping[str, Any], console: Console, *, wide: bool = False, title: str = "") -> None:
    """The decision table, the preemptions (if any) and the summary of a plan document."""
    print_table(console, decision_table(doc["results"], wide=wide, title=title), wide=wide)
    if doc.get("preemptions"):
        print_table(console, preemption_table(doc["preemptions"], wide=wide), wide=wide)
    if any(r.get("moves") for r in doc["results"]):
        print_table(console, moves_table(doc["results"], wide=wide), wide=wide)
    print_table(console, summary_table(doc["summary"]), wide=wide)


DECISION_COLUMNS = Columns(
    col("workload"),
    col("tenant", wide=True),
    col("node"),
    col("score", right=True, keep=True),
    col("placement / reason"),
)


def decision_table(records: Sequence[Mapping[str, Any]], *, wide: bool = False, title: str = "") -> Table:
    table = DECISION_COLUMNS.table(title or "Scheduling decisions (in decision order)", wide=wide)
    for r in records:
        score = "-" if r.get("score") is None else str(r["score"])
        if r.get("evictedBy"):
            why = f"evicted by {r['evictedBy']} ({r.get('evictionReason', '')})"
            detail = f"[magenta]{escape(why)}[/]"
        elif r.get("node"):
            detail = escape(placement_text(r))
            victims = r.get("preempts") or []
            if victims:
                names = "preempts " + ", ".join(v["workload"] or "a workload of another tenant" for v in victims)
                detail += f"\n[magenta]{escape(names)}[/]"
            if r.get("moves"):
                moved = f"after {len(r['moves'])} move(s) (below): {r.get('movesReason', '')}"
                detail += f"\n[cyan]{escape(moved)}[/]"
            if r.get("movedBy"):
                to = r["movedTo"]
                moved = f"then moved by {r['movedBy']} to {to['node']} {format_devices(to['devices'])}".rstrip()
                detail += f"\n[cyan]{escape(moved)}[/]"
        else:
            style = "yellow" if "waiting" in r else "red"
            text = r.get("waiting") or r.get("error") or ""
            if r.get("preemption"):
                text += f" (preemption: {r['preemption']})"
            detail = f"[{style}]{escape(text)}[/]"
        DECISION_COLUMNS.add_row(
            table, escape(r["workload"]), escape(r.get("tenant") or ""), escape(r.get("node") or "-"), score, detail,
            wide=wide,
        )  # fmt: skip
    return table


def placement_text(record: Mapping[str, Any]) -> str:
    """cpuset, NUMA grants and shared pools, devices of one placement record (one line each)."""
    cpuset = f"cpuset {record['cpuset']}" if record.get("cpuset") else ""
    devices = format_devices(record.get("devices") or {})
    return "\n".join(filter(None, [cpuset, format_numa(record), devices]))


def format_numa(record: Mapping[str, Any]) -> str:
    """``numa 0: cpu=2, memory=4Gi`` per NUMA node the placement takes from, and the NUMA shared
    pools an LS workload is bound to (Koordinator's resource-status ``cpuSharedPools``)."""
    parts = []
    for numa, amounts in (record.get("numaResources") or {}).items():
        parts.append(f"numa {numa}: " + human_amounts(amounts))
    status = json.loads((record.get("annotations") or {}).get(ANNOTATION_RESOURCE_STATUS, "{}"))
    pools = status.get("cpuSharedPools") or []
    if pools:
        parts.append("shared pools: " + ", ".join(f"socket {p['socket']} numa {p['node']}" for p in pools))
    return "; ".join(parts)


MOVE_COLUMNS = Columns(
    col("for"),
    col("moved"),
    col("tenant", wide=True),
    col("from"),
    col("to"),
    col("GPU\ncore %", right=True, keep=True),
    col("reason"),
)


def moves_table(records: Sequence[Mapping[str, Any]], *, wide: bool = False) -> Table:
    """The moves each workload placed by defragmentation needs, in the order they are made: who
    moves, from which node and GPUs (minors) to which, with how much of each card, and why."""
    table = MOVE_COLUMNS.table("Moves (running workloads moved so that the workload fits; none made)", wide=wide)
    for r in records:
        for k, move in enumerate(r.get("moves") or ()):
            source, target = move["from"], move["to"]
            mover = move["workload"] or "a workload of another tenant"
            MOVE_COLUMNS.add_row(
                table, escape(r["workload"]) if k == 0 else "", escape(mover),
                escape(move.get("tenant") or "-"), escape(_place(source)), escape(_place(target)), _cores(target),
                escape(move["reason"]), wide=wide,
            )  # fmt: skip
    return table


def _place(place: Mapping[str, Any]) -> str:
    """A move's source or target: its node and GPU minors (``n1 GPU 0,1``), the node alone without GPUs."""
    minors = ",".join(str(g["minor"]) for g in (place.get("devices") or {}).get("gpu", ()))
    return f"{place['node']} GPU {minors}" if minors else place["node"]


def _cores(place: Mapping[str, Any]) -> str:
    """The share of each GPU a mover holds (its gpu-core per card, the same at source and target)."""
    grants = (place.get("devices") or {}).get("gpu", ())
    return ",".join(str(g["resources"].get("gpu-core", "-")) for g in grants) or "-"


def format_devices(devices: Mapping[str, Any]) -> str:
    """A record's devices (``gpu 0: 50% core, 50% memory``), "" when it holds none."""
    grants = {kind: [DeviceGrant.model_validate(g) for g in gs] for kind, gs in (devices or {}).items()}
    return format_grants(Binding(workload="-", node="-", devices=grants)) if grants else ""


PREEMPTION_COLUMNS = Columns(col("preemptor"), col("node"), col("evicted"), col("why"))


def preemption_table(preemptions: Sequence[Mapping[str, Any]], *, wide: bool = False) -> Table:
    table = PREEMPTION_COLUMNS.table("Preemptions (in decision order)", wide=wide)
    for p in preemptions:
        victims = "\n".join(
            f"{v['workload']} (tenant {v['tenant']}, priority {v['priority']})"
            if v["workload"]
            else f"a workload of another tenant (priority {v['priority']})"
            for v in p["victims"]
        )
        reasons = "\n".join(v["reason"] for v in p["victims"])
        if p.get("budgetViolations"):
            reasons += f"\nbreaks {p['budgetViolations']} disruption budget(s)"
        PREEMPTION_COLUMNS.add_row(table, escape(p["preemptor"]), escape(p["node"]), escape(victims), escape(reasons))
    return table


def summary_table(summary: Mapping[str, Any]) -> Table | str:
    """The summary line, with each resource's utilization when the plan knows it (offline)."""
    evicted = f", {summary['evicted']} evicted" if summary.get("evicted") else ""
    moved = f", {summary['moves']} move(s)" if summary.get("moves") else ""
    title = f"Summary: {summary['placed']} placed, {summary['unschedulable']} not placed{evicted}{moved}"
    rows = [(name, f"{100 * fraction:.1f} %") for name, fraction in (summary.get("utilization") or {}).items()]
    if not rows:
        return title
    return simple_table(title, [col("resource"), col("utilization", right=True)], rows)


NODE_COLUMNS = Columns(
    col("node"),
    col("numa", right=True, keep=True),
    col("cpu", right=True, keep=True),
    col("memory", right=True, keep=True),
    col("shared pool"),
    col("BE pool", wide=True),
    col("pinned"),
)


def node_reports_table(reports: Sequence[Mapping[str, Any]], *, wide: bool = False) -> Table:
    """The nodes' NUMA zones, pools and pinned workloads (``finesched plan --show-nodes``)."""
    title = "Nodes: NUMA zones (cpu and memory free/allocatable; shared: held in no zone), CPU pools, pinned workloads"
    table = NODE_COLUMNS.table(title, wide=wide)
    for report in reports:
        pinned = "\n".join(f"{p['namespace']}/{p['name']} {p['cpuset']}" for p in report["podCPUAllocs"]) or "-"
        shared = {p["node"]: p["cpuset"] for p in report.get("cpuSharedPools", ())}
        be = {p["node"]: p["cpuset"] for p in report.get("beCPUSharedPools", ())}
        rows = [_zone_row(zone) for zone in report["zones"]] or [("-", "-", "-")]
        unbound = report.get("unboundUse")
        if report["zones"] and unbound:  # held outside any zone (the LS shared pool's): from any of them
            rows.append(("shared", *(f"{human_amount(r, unbound.get(r, '0'))} used" for r in ("cpu", "memory"))))
        for k, (numa, cpu, memory) in enumerate(rows):
            nid = int(numa) if numa.isdigit() else -1
            NODE_COLUMNS.add_row(
                table, report["name"] if k == 0 else "", numa, cpu, memory,
                shared.get(nid, "-"), be.get(nid, "-"), escape(pinned) if k == 0 else "", wide=wide,
            )  # fmt: skip
    return table


def _zone_row(zone: Mapping[str, Any]) -> tuple[str, str, str]:
    """(NUMA id, cpu free/allocatable, memory free/allocatable) of one ``node-<id>`` zone."""
    res = {r["name"]: f"{human_amount(r['name'], r['available'])}/{human_amount(r['name'], r['allocatable'])}"
           for r in zone["resources"]}  # fmt: skip
    numa = zone["name"][5:] if zone["name"].startswith("node-") else "-"
    return numa, res.get("cpu", "-"), res.get("memory", "-")


def server_plan_problem(manifests: Manifests, offline_flags: Sequence[str]) -> tuple[str, int] | None:
    """Why `plan --server` cannot run with these files and flags: (message, exit code), or None."""
    if offline_flags:
        return f"{', '.join(offline_flags)}: only for an offline plan, not with --server", 2
    objects = (*manifests.nodes, *manifests.tenants, *manifests.jobs, *manifests.priority_classes,
               *manifests.topologies)  # fmt: skip
    others = [f"{type(o).__name__} {o.name}" for o in objects]
    if others or not manifests.workloads:
        what = f"not {', '.join(others)}" if others else "none given"
        return f"--server plans Workloads against the server's own nodes, tenants and priority classes ({what})", 1
    return None


def plan_on_server(
    manifests: Manifests, server: str, token: str, output: str, console: Console, *, ca: Path | None = None,
    insecure: bool = False, defragment: bool = False,
) -> None:  # fmt: skip
    """POST the workloads of `manifests` to `server`'s /v1/plan and show the answer (nothing is stored there)."""
    from finesched.commands.client import Client
    from finesched.model.manifest import to_manifest

    client = Client(server, token, ca=ca, insecure=insecure)
    workloads = [to_manifest(w) for w in manifests.workloads]
    answer = client.call(
        "POST", "/v1/plan", json={"workloads": workloads, "defragment": True} if defragment else workloads
    )
    if output in ("json", "yaml"):
        text = json.dumps(answer, indent=2) if output == "json" else yaml.safe_dump(answer, sort_keys=False)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    cluster = answer.get("cluster", {})
    title = f"Where they would go now on {server} ({cluster.get('nodes', '?')} nodes; nothing stored)"
    render_doc(answer, console, wide=output == "wide", title=title)
    if cluster.get("pending"):
        console.print(f"{cluster['pending']} workload(s) already waiting there were not planned with these.")
    if answer.get("defragmentation"):
        console.print(defragmentation_note(answer["defragmentation"]))


def defragmentation_note(block: Mapping[str, Any]) -> str:
    """Which defragmentation settings the plan used: the profile's, or the defaults."""
    settings = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in block["settings"].items())
    where = "the profile's" if block["source"] == "profile" else "the defaults (the profile does not defragment)"
    return f"Moves planned with {where} defragmentation settings: {settings}."
