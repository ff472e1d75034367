"""The `finesched` command line.

Errors are one clear line on stderr, never a traceback: exit code 1 for invalid input (every
problem listed), 2 for usage errors (typer's own convention).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from finesched import __version__
from finesched.codec import MAX_BITS, CodecError, decode, encode
from finesched.commands.common import admit_or_exit, err, fail, load_or_exit
from finesched.errors import ValidationError
from finesched.model.resources import human_amounts

app = typer.Typer(
    name="finesched",
    help="Fine-grained resource scheduler: fractional GPUs, pinned CPUs, NUMA, devices, fair shares.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False)


@app.command()
def version() -> None:
    """Print the finesched version."""
    out.print(__version__)


#: How `validate` and `plan` reach a server with --server (the client commands' own options say more).
ServerTokenOption = Annotated[str, typer.Option("--token", envvar="FINESCHED_TOKEN", help="Bearer token (--server).")]
ServerCaOption = Annotated[Path | None, typer.Option("--ca", envvar="FINESCHED_CA", help="Server CA file (--server).")]
ServerInsecureOption = Annotated[
    bool, typer.Option("--insecure", envvar="FINESCHED_INSECURE", help="Token over plain HTTP (--server).")
]


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Manifest files (YAML or JSON).")],
    server: Annotated[
        str | None,
        typer.Option("--server", envvar="FINESCHED_SERVER", help="Also know this server's tenants (--token)."),
    ] = None,
    token: ServerTokenOption = "",
    ca: ServerCaOption = None,
    insecure: ServerInsecureOption = False,
) -> None:
    """Check manifest files by the server's rules; print every problem (exit 1) or a summary of what they hold.

    References to tenants and priority classes the files do not define are warnings; with --server
    and --token (or FINESCHED_SERVER / FINESCHED_TOKEN) those the server holds and the token may see
    count as defined (a tenant's own namespaces belong to it)."""
    from finesched.commands.tables import simple_table

    known = None
    if server and token:
        from finesched.commands.client import server_world

        known, problem = server_world(server, token, ca=ca, insecure=insecure)
        if problem:
            err.print(f"note: {escape(problem)}; references are checked against these files only", soft_wrap=True)
    manifests = admit_or_exit(files, known=known)
    rows = [("PriorityClass", c.name, _class_summary(c)) for c in manifests.priority_classes]
    rows += [("Topology", t.name, "levels " + " > ".join(t.labels)) for t in manifests.topologies]
    rows += [("Tenant", tenant.name, f"weight {tenant.weight:g}") for tenant in manifests.tenants]
    rows += [("Node", node.name, _node_summary(node)) for node in manifests.nodes]
    for w in manifests.workloads:
        asks = human_amounts(w.requests) or "nothing"
        priority = f", priority {w.priority}" + (f" ({w.priority_class_name})" if w.priority_class_name else "")
        where = ""
        if w.gang is not None and w.gang.topology is not None:
            ask = w.gang.topology
            where = f", gang {w.gang.name} in one {ask.level} of {ask.name}" + ("" if ask.required else " (preferred)")
        rows.append(("Workload", w.key, f"{w.qos}, asks {asks}{priority if w.priority else ''}{where}"))
    rows += [("Job", f"{job.namespace}/{job.name}", f"{job.mode}, {len(job.tasks)} tasks") for job in manifests.jobs]
    title = f"{len(manifests)} valid objects in {len(files)} file(s)"
    out.print(simple_table(title, ["kind", "name", "summary"], [tuple(map(escape, row)) for row in rows]))


def _class_summary(cls: object) -> str:
    from finesched.model.priority_class import PriorityClass

    assert isinstance(cls, PriorityClass)
    return f"value {cls.value}, {cls.preemption_policy}" + (", global default" if cls.global_default else "")


def _node_summary(node: object) -> str:
    from finesched.model.node import Node

    assert isinstance(node, Node)
    parts = [human_amounts(node.allocatable)]
    if node.cpu_topology is not None:
        topo = node.cpu_topology
        parts.append(f"{len(topo.cpus)} CPUs/{len(topo.socket_ids)} sockets/{len(topo.numa_ids)} NUMA")
    kinds: dict[str, int] = {}
    for device in node.devices:
        kinds[device.type] = kinds.get(device.type, 0) + 1
    if kinds:
        parts.append(" ".join(f"{n}x{k}" for k, n in kinds.items()))
    return "; ".join(parts)


@app.command("encode")
def encode_cmd(
    values: Annotated[list[int], typer.Argument(help="Per-device values Ns1..NsNf.")],
    bits: Annotated[int, typer.Option("--bits", "-b", min=1, max=MAX_BITS, help="Bits per device value.")],
) -> None:
    """Encode per-device values into one integer (seed S0.2): K = Σ Ns_i << ((i-1)·bits)."""
    try:
        k = encode(values, bits)
    except CodecError as exc:
        raise fail(str(exc)) from None
    out.print(k)


@app.command("decode")
def decode_cmd(
    k: Annotated[int, typer.Argument(help="The encoded integer K.")],
    count: Annotated[int, typer.Option("--count", "-n", min=0, help="Number of devices Nf.")],
    bits: Annotated[int, typer.Option("--bits", "-b", min=1, max=MAX_BITS, help="Bits per device value.")],
) -> None:
    """Decode K into per-device values (seed S0.2): device i = (K >> ((i-1)·bits)) & (2^bits - 1)."""
    try:
        values = decode(k, count, bits)
    except CodecError as exc:
        raise fail(str(exc)) from None
    out.print(" ".join(str(v) for v in values))


@app.command("encode-node")
def encode_node_cmd(
    file: Annotated[Path, typer.Argument(help="A manifest file with Node documents.")],
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
) -> None:
    """Print each node's encoded per-device free vectors (S0.2), as its agent would report them."""
    from finesched.commands.devices import encode_node

    try:
        text = encode_node(file, node)
    except ValidationError as exc:
        for detail in exc.errors:
            err.print(f"[bold red]error:[/] {escape(str(detail))}", soft_wrap=True)
        raise typer.Exit(1) from None
    out.print(text, markup=False, highlight=False, soft_wrap=True)


@app.command()
def plan(
    files: Annotated[
        list[Path], typer.Argument(help="Manifest files: nodes, workloads, tenants, priority classes (any order).")
    ],
    profile: Annotated[
        str, typer.Option("--profile", "-p", help="Built-in profile name or a profile YAML file.")
    ] = "default",
    output: Annotated[str, typer.Option("--output", "-o", help="table, wide, json or yaml.")] = "table",
    show_nodes: Annotated[
        bool, typer.Option("--show-nodes", help="Also show each node's NUMA zones, CPU allocations and pools.")
    ] = False,
    no_preemption: Annotated[
        bool, typer.Option("--no-preemption", help="Never evict lower-priority workloads (or reclaim quota).")
    ] = False,
    waves: Annotated[
        bool, typer.Option("--waves", help="Each FILE's workloads arrive after the previous FILE's are scheduled.")
    ] = False,
    server: Annotated[
        str | None, typer.Option("--server", help="Plan FILES' workloads on this control plane's live state instead.")
    ] = None,
    defragment: Annotated[
        bool, typer.Option("--defragment", help="Also move running workloads that allow it, to make one fit.")
    ] = False,
    token: ServerTokenOption = "",
    ca: ServerCaOption = None,
    insecure: ServerInsecureOption = False,
) -> None:
    """Schedule the workloads of FILES onto their nodes (queue, priority, DRF) and show every decision.

    A workload naming a priorityClassName gets the value and policy of that PriorityClass in FILES.
    With --server, the workloads are planned by the control plane on a copy of its live state (where
    they would go now; nothing is stored there); the server's own profile and tenants apply."""
    from finesched.commands.plan import OUTPUTS, plan_on_server, render, run_plan, server_plan_problem
    from finesched.sched.profile import resolve_profile

    if output not in OUTPUTS:
        raise fail(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}", code=2)
    from finesched.commands.plan import resolve_classes

    manifests = load_or_exit(files)
    if server is not None:
        offline = {"--profile": profile != "default", "--show-nodes": show_nodes, "--no-preemption": no_preemption,
                   "--waves": waves}  # fmt: skip
        problem = server_plan_problem(manifests, [flag for flag, given in offline.items() if given])
        if problem is not None:
            raise fail(*problem)
        plan_on_server(manifests, server, token, output, out, ca=ca, insecure=insecure, defragment=defragment)
        return
    try:
        groups = [load_or_exit([f]).workloads for f in files] if waves else None
        manifests, groups = resolve_classes(manifests, groups, warn=lambda w: err.print(
            f"[yellow]warning:[/] {escape(str(w))} (these files only)", soft_wrap=True))  # fmt: skip
        outcome = run_plan(
            manifests, resolve_profile(profile), preemption=not no_preemption, waves=groups, defragment=defragment
        )
    except ValidationError as exc:
        for detail in exc.errors:
            err.print(f"[bold red]error:[/] {escape(str(detail))}", soft_wrap=True)
        raise typer.Exit(1) from None
    render(outcome, manifests, output, out, show_nodes=show_nodes)
    if not manifests.nodes:
        err.print("note: FILES hold no Node, so nothing could be placed; to plan on a running control plane's "
                  "nodes, add --server URL", soft_wrap=True)  # fmt: skip


#: This process is `finesched serve` (or `python -m finesched.cli serve`): only the serve command is
#: added to the ones defined here, so a server's start does not import the other commands' modules
#: (the client, the simulator, the agent, jobs, Kubernetes: about a tenth of a second, without
#: bytecode caches). Its options, help and errors are the same.
_SERVE_ONLY = sys.argv[1:2] == ["serve"]


def _add_sim() -> None:
    from finesched.commands.sim import sim_app

    app.add_typer(sim_app, name="sim", help="Replay GPU traces through the scheduler (FGD protocol) and report.")


if not _SERVE_ONLY:
    _add_sim()


def _add_control_plane() -> None:
    from finesched.commands.serve import serve

    app.command("serve")(serve)
    if _SERVE_ONLY:
        return
    from finesched.commands import client
    from finesched.commands.tokens import token_app

    app.add_typer(token_app, name="token")
    commands = (client.submit, client.get, client.describe, client.delete, client.watch, client.cordon, client.whoami)
    for command in commands:
        app.command(command.__name__)(command)


_add_control_plane()


def _add_agent() -> None:
    from finesched.commands.agent import register

    register(app)  # agent, up, logs


if not _SERVE_ONLY:
    _add_agent()


def _add_job() -> None:
    from finesched.commands.job import job_app

    app.add_typer(job_app, name="job", help="Dataflow jobs (seed S2): plan regions, slots, fractions; place, submit.")


if not _SERVE_ONLY:
    _add_job()


def _add_k8s() -> None:
    from finesched.commands.k8s import k8s_extender

    app.command("k8s-extender")(k8s_extender)


if not _SERVE_ONLY:
    _add_k8s()


def _flowing(paragraph: str) -> str:
    """A help paragraph as one line that wraps to the terminal, unless it is laid out by hand (an
    indented line: a command example, a list), whose lines are kept."""
    lines = paragraph.splitlines()
    if any(line[:1].isspace() or line.lstrip().startswith(("- ", "* ", "$ ")) for line in lines):
        return paragraph
    return " ".join(paragraph.split())


def _one_line_summaries(group: typer.Typer) -> None:
    """Each command's help with its paragraphs flowing (`_flowing`) and its summary in its group's
    list as one line: typer keeps a docstring's own line breaks, ragged at 80 columns."""
    for info in group.registered_commands:
        doc = inspect.getdoc(info.callback) if info.callback is not None else None
        if info.short_help is None and info.help is None and doc:
            paragraphs = doc.split("\n\n")
            info.short_help = " ".join(paragraphs[0].split())
            info.help = "\n\n".join(_flowing(p) for p in paragraphs)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _one_line_summaries(sub.typer_instance)


_one_line_summaries(app)


def main() -> None:
    """Console entry point: usage errors as one line naming the bad value (exit 2), bad input exit 1."""
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # usage errors (exit 2) and other command-line errors
        message = exc.format_message()
        if message:  # empty when the help was shown instead (no arguments at all)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            err.print(f"[bold red]error:[/] {escape(message)}{escape(hint)}", soft_wrap=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:
        sys.exit(130)
    except ValidationError as exc:
        for detail in exc.errors:
            err.print(f"[bold red]error:[/] {escape(str(detail))}", soft_wrap=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
