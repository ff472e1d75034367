"""`finesched job`: compile a dataflow job (seed S2) and show or place its slots.

* ``job plan JOB.yaml``: regions, slot sharing groups, slot profiles, slot counts, fractions and
  quotas (rich tables, or ``-o json`` with the Python API's names); ``--cluster FILE`` also places
  the gang offline on those nodes (all slots or none).
* ``job submit JOB.yaml --server URL --token T`` (or FINESCHED_SERVER / FINESCHED_TOKEN): compile
  locally first, and check that every slot has a command (bad input never reaches the server),
  then ``POST /v1/jobs`` the manifest as JSON and print the per-slot bindings the server answers
  with. Listing, describing and deleting jobs are `finesched get|describe|delete job`.

Exit codes: 0 done (a gang that does not fit is a result, shown as Pending), 1 invalid input,
an unreachable server or a refused request, 2 usage errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.client import TOKEN_HINT, CaOption, InsecureOption
from finesched.commands.devices import format_grants
from finesched.commands.tables import Columns, col, print_table
from finesched.dataflow import CompiledJob, compile_job, gang_workloads
from finesched.dataflow.commands import command_problems
from finesched.dataflow.report import compiled_record, slot_records
from finesched.errors import ErrorDetail, ValidationError
from finesched.model.job import Job
from finesched.model.manifest import load_manifests, to_manifest
from finesched.quantity import human_quantity
from finesched.sched.diagnosis import FitError
from finesched.tls import TransportError, client_options

if TYPE_CHECKING:  # httpx is imported where a request is made: `serve` and `--help` need it not
    import httpx

job_app = typer.Typer(
    name="job",
    help="Dataflow jobs (seed S2): compile into regions, slot sharing groups, slots and fractions; place or submit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
OUTPUTS = ("table", "wide", "json")
TIMEOUT_SECONDS = 30.0


def _exit_with(errors: list[ErrorDetail] | str, code: int = 1) -> typer.Exit:
    for detail in [errors] if isinstance(errors, str) else errors:
        err.print(f"[bold red]error:[/] {escape(str(detail))}", soft_wrap=True)
    return typer.Exit(code)


def _load_job(path: Path, **options: Any) -> tuple[Job, CompiledJob]:
    """The file's one Job, compiled; every problem printed with its file and field path (exit 1)."""
    try:
        manifests = load_manifests(path)
    except ValidationError as exc:
        raise _exit_with(exc.errors) from None
    if len(manifests.jobs) != 1:
        raise _exit_with(f"{path}: expected one Job document, found {len(manifests.jobs)}")
    job = manifests.jobs[0]
    try:
        return job, compile_job(job, **{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        raise _exit_with([d.located(f"{path} ({job.namespace}/{job.name})") for d in exc.errors]) from None


SourcesOption = Annotated[
    bool | None,
    typer.Option(
        "--all-sources-in-same-region/--separate-sources",
        help="All sources in one pipelined region (default: streaming yes, batch no, or the manifest's).",
    ),
]
TrimOption = Annotated[
    bool | None,
    typer.Option(
        "--trim-partial-pipelines/--whole-pipelines",
        help="Known specs: a slot holding fewer tasks than its group asks for those only (default: the manifest's).",
    ),
]
WeightsOption = Annotated[
    bool | None,
    typer.Option("--weighted-fractions/--equal-fractions", help="Unknown specs: operator weights instead of 1/n."),
]


@job_app.command("plan")
def plan_cmd(
    file: Annotated[Path, typer.Argument(help="A Job manifest (YAML or JSON).")],
    cluster: Annotated[
        list[Path] | None, typer.Option("--cluster", "-c", help="Node (and Tenant) manifests: also place the gang.")
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, wide or json.")] = "table",
    profile: Annotated[str, typer.Option("--profile", "-p", help="Scheduler profile, with --cluster.")] = "default",
    sources: SourcesOption = None,
    weighted: WeightsOption = None,
    trim: TrimOption = None,
) -> None:
    """Compile JOB and show regions, groups, slot profiles, slot counts, fractions (and placement)."""
    if output not in OUTPUTS:
        raise _exit_with(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}", 2)
    options = {"all_sources_in_same_region": sources, "weighted_fractions": weighted, "trim_partial_pipelines": trim}
    job, compiled = _load_job(file, **options)
    placement = _place(job, compiled, cluster, profile) if cluster else None
    if output == "json":
        record = compiled_record(compiled)
        if placement is not None:
            record["placement"] = placement
        out.print(json.dumps(record, indent=2), markup=False, highlight=False, soft_wrap=True)
        return
    wide = output == "wide"
    for table in _tables(compiled, wide):
        print_table(out, table, wide=wide)
    for warning in compiled.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    if placement is not None:
        print_table(out, _placement_table(placement, wide), wide=wide)


def _place(job: Job, compiled: CompiledJob, files: list[Path], profile: str) -> dict[str, Any]:
    """Place the job's gang on the nodes of `files`: {"status", "reason", "slots"} as the server answers."""
    from finesched.sched.profile import resolve_profile
    from finesched.sched.scheduler import Scheduler
    from finesched.state.cluster import ClusterState

    try:
        manifests = load_manifests(*files)
        state = ClusterState.from_nodes(manifests.nodes)
        scheduler = Scheduler(state, resolve_profile(profile), manifests.tenants, topologies=manifests.topologies)
    except ValidationError as exc:
        raise _exit_with(exc.errors) from None
    workloads = gang_workloads(job, compiled)
    try:
        bindings = scheduler.schedule_gang(workloads)
    except FitError as exc:
        return {"status": "Pending", "reason": exc.message, "slots": slot_records(workloads, None)}
    except ValidationError as exc:  # a slot request the device rules refuse (e.g. 1.5 GPUs of extended shares)
        raise _exit_with(exc.errors) from None
    return {"status": "Bound", "reason": "", "slots": slot_records(workloads, bindings)}


def _bytes(value: int) -> str:
    return human_quantity(value, "bytes")


GROUP_COLUMNS = Columns(
    col("group"), col("tasks"), col("slots", right=True), col("cpu", right=True), col("memory", right=True),
    col("of which", wide=True), col("gpu / extended", wide=True),
)  # fmt: skip
PARTIAL_COLUMNS = Columns(col("group"), col("slot"), col("tasks"), col("cpu"), col("memory"), col("quotas", wide=True))
PLACEMENT_COLUMNS = Columns(
    col("slot"), col("group"), col("node"), col("cpuset", wide=True), col("devices"), col("quotas")
)


def _tables(compiled: CompiledJob, wide: bool = False) -> list[Table]:
    job = compiled.job
    groups_of_region = {
        k: sorted({compiled.group_of_task[t] for t in region}) for k, region in enumerate(compiled.regions)
    }
    order = compiled.graph.task_ids
    components = f"; over connected components: {compiled.component_slots}" if job.mode == "streaming" else ""
    sources = "all sources in one region" if compiled.all_sources_in_same_region else "sources apart"
    slots = f"{compiled.slots_needed} slots (over groups{components})"
    title = f"Job {job.namespace}/{job.name} ({job.mode}, {sources}): {slots}"
    regions = Table(title=title, caption=f"pipelined regions at the subtask level: {len(compiled.subtask_regions())}")
    for column in ("region", "tasks", "groups"):
        regions.add_column(column)
    for k, region in enumerate(compiled.regions):
        regions.add_row(str(k), ", ".join(t for t in order if t in region), ", ".join(groups_of_region[k]))
    kind = "declared specs + network" if compiled.specified else "default slot (specs unknown)"
    groups = GROUP_COLUMNS.table(f"Slot sharing groups: one slot per parallel pipeline, profile = {kind}", wide=wide)
    for name, tasks in compiled.groups.items():
        p = compiled.profiles[name]
        parts = zip(
            ("heap", "off-heap", "managed on-heap", "managed off-heap", "network"),
            (p.task_heap, p.task_off_heap, p.managed_on_heap, p.managed_off_heap, p.network),
            strict=True,
        )
        breakdown = ", ".join(f"{label} {_bytes(v)}" for label, v in parts if v)
        extra = ", ".join([f"gpu {p.gpu}"] * bool(p.gpu) + [f"{k} {v}" for k, v in p.extended])
        row = (name, ", ".join(t for t in order if t in tasks), str(compiled.group_slots[name]))
        GROUP_COLUMNS.add_row(groups, *row, human_quantity(p.cpu, "cpu"), _bytes(p.memory), breakdown, extra,
                              wide=wide)  # fmt: skip
    how = "weight / Σ weights" if compiled.weighted_fractions else "1/n of the users"
    rule = "op managed / group managed" if compiled.specified else how
    fractions = Table(title=f"Managed-memory fractions ({rule}, rounded down) and quotas in one slot")
    for column in ("operator", "task", "group", "on-heap", "off-heap", "quota"):
        fractions.add_column(column, justify="right" if column in ("on-heap", "off-heap", "quota") else "left")
    for task in compiled.graph.tasks:
        group = compiled.group_of_task[task.id]
        quotas = compiled.group_quotas(group)
        for op in task.operators:
            on, off = compiled.fractions[op.id]
            fractions.add_row(op.id, task.id, group, f"{on:.6g}", f"{off:.6g}", _bytes(quotas[op.id]))
    tables = [regions, groups, fractions]
    partial = [
        (group, index)
        for group, count in compiled.group_slots.items()
        for index in range(count)
        if len(compiled.slot_tasks(group, index)) < len(compiled.groups[group])
    ]
    if compiled.trim_partial_pipelines and compiled.specified and partial:
        title = "Partial pipelines: slots that hold fewer tasks than their group ask for those only"
        slots = PARTIAL_COLUMNS.table(title, wide=wide)
        for group, index in partial:
            p = compiled.slot_profile(group, index)
            quotas = ", ".join(f"{op}={_bytes(v)}" for op, v in compiled.slot_quotas(group, index).items() if v)
            row = (group, str(index), ", ".join(compiled.slot_tasks(group, index)), human_quantity(p.cpu, "cpu"))
            PARTIAL_COLUMNS.add_row(slots, *row, _bytes(p.memory), quotas, wide=wide)
        tables.append(slots)
    return tables


def _placement_table(placement: dict[str, Any], wide: bool = False) -> Table:
    status = placement["status"]
    style = "green" if status == "Bound" else "red"
    reason = f": {placement['reason']}" if placement["reason"] else ""
    table = PLACEMENT_COLUMNS.table(f"Gang placement: [{style}]{status}[/]{escape(reason)}", wide=wide)
    for slot in placement["slots"]:
        binding = slot["binding"] or {"node": "-", "cpuset": "", "devices": {}}
        quotas = ", ".join(f"{op}={_bytes(v)}" for op, v in slot["quotas"].items() if v)
        devices = _devices_text(binding["devices"])
        PLACEMENT_COLUMNS.add_row(table, slot["workload"], slot["group"], binding["node"], binding["cpuset"], devices,
                                  quotas, wide=wide)  # fmt: skip
    return table


def _devices_text(devices: dict[str, list[dict[str, Any]]]) -> str:
    from finesched.model.binding import Binding, DeviceGrant

    grants = {
        kind: [DeviceGrant(minor=g["minor"], resources=g["resources"]) for g in gs] for kind, gs in devices.items()
    }
    return escape(format_grants(Binding(workload="-", node="-", devices=grants)))


@job_app.command("submit")
def submit_cmd(
    file: Annotated[Path, typer.Argument(help="A Job manifest (YAML or JSON).")],
    server: Annotated[
        str | None, typer.Option("--server", "-s", envvar="FINESCHED_SERVER", help="Control plane URL.")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", "-t", envvar="FINESCHED_TOKEN", help="Bearer token.", show_default=False)
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, wide or json.")] = "table",
    ca: CaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Compile JOB locally, send it to the server (POST /v1/jobs) and print the per-slot bindings."""
    if output not in OUTPUTS:
        raise _exit_with(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}", 2)
    if not server:
        raise _exit_with("--server (or FINESCHED_SERVER) is required", 2)
    try:
        tls = client_options(server, ca, insecure)  # never a token in clear over the network
    except TransportError as exc:
        raise _exit_with(str(exc), 2) from None
    job, compiled = _load_job(file)
    problems = command_problems(job, compiled)  # what the server refuses: said here, nothing sent
    if problems:
        raise _exit_with([d.located(f"{file} ({job.namespace}/{job.name})") for d in problems])
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = server.rstrip("/") + "/v1/jobs"
    import httpx

    try:
        response = httpx.post(url, json=to_manifest(job), headers=headers, timeout=TIMEOUT_SECONDS, **tls)
    except httpx.HTTPError as exc:
        raise _exit_with(f"cannot reach {url}: {exc}") from None
    if response.status_code >= 400:
        hint = f"; {TOKEN_HINT}" if response.status_code == 401 else ""
        raise _exit_with(f"{url} refused the job ({response.status_code}): {_error_text(response)}{hint}")
    try:
        answer = response.json()
        slots = answer["slots"]
    except (ValueError, KeyError, TypeError):
        raise _exit_with(f"{url} answered {response.status_code} without a job result: {response.text[:200]}") from None
    if output == "json":
        out.print(json.dumps(answer, indent=2), markup=False, highlight=False, soft_wrap=True)
        return
    placement = {"status": answer.get("status", "?"), "reason": answer.get("reason") or "", "slots": slots}
    table = _placement_table(placement, output == "wide")
    table.title = f"Job {answer.get('job', job.name)}: {table.title}"
    print_table(out, table, wide=output == "wide")


def _error_text(response: httpx.Response) -> str:
    """The server's error detail (FastAPI's `detail`, a list of problems or a string), else the body."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text[:500]
    if isinstance(detail, list):
        return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
    return str(detail)
