"""`finesched agent` and `finesched up`: the node side of a real cluster (`logs` is commands/logs.py).

* ``agent --server URL --token T``: run this machine's node agent (discovery, reports, deploys,
  and workload logs served to the control plane on ``--logs-port``).
* ``up``: a one-machine cluster: the control plane (``finesched serve``, SQLite under the data
  directory, mode 700) as a child process, an admin token (printed, and written to
  ``<data>/admin.token``, mode 600), and this machine's agent in the foreground. Ctrl-C stops the
  workloads, the agent and the server. ``--fake-gpus N[:MEMORY]`` gives the node N simulated GPUs.
  The port is checked before anything is written; a data directory that already has a valid admin
  token keeps it (``--new-admin-token`` makes another), and its agent keeps its own.

Both take the isolation options (agent/identity.py, workdirs.py, sandbox.py): ``--tenant-uids``,
``--work-root``, ``--sandbox none|bwrap`` and ``--allow-tenant-sharing``; `up`'s sandbox hides its
whole data directory (database, tokens, server log) from workloads.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from finesched.commands.client import CaOption, InsecureOption
from finesched.commands.common import default_data, fail
from finesched.commands.serve import AgentCaOption, InsecureAgentLogsOption, TlsCertOption, TlsKeyOption
from finesched.commands.supervise import SupervisedServer
from finesched.private import private_dir, private_file, write_private

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

DataOption = Annotated[
    Path | None,
    typer.Option("--data", help="State directory (default: finesched in the XDG data directory, ~/.local/share)."),
]
FakeGpusOption = Annotated[
    str | None,
    typer.Option(
        "--fake-gpus",
        metavar="N[:MEMORY]",
        help="Give this node N simulated GPUs of MEMORY each (default 16Gi) instead of NVML: try GPU sharing "
        "without a GPU. Marked simulated in `describe node` and the agent's log.",
    ),
]
LogsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        help="Serve workload logs (--logs-port) over HTTPS with this certificate (PEM) for --logs-address.",
    ),
]
LogsKeyOption = Annotated[Path | None, typer.Option("--tls-key", help="The private key of --tls-cert (PEM).")]
TenantUidsOption = Annotated[
    str,
    typer.Option(
        "--tenant-uids",
        metavar="START-END",
        help="The uids workloads of tenants without a spec.runAs run as (one per tenant, gid = uid; "
        "kept in the data directory). Used when the agent runs as root.",
    ),
]
WorkRootOption = Annotated[
    Path | None,
    typer.Option(
        "--work-root",
        help="Where workloads' working directories go (default as root: finesched/work in /var/lib; else "
        "work in --data). Every parent must let others through (o+x).",
    ),
]
SandboxOption = Annotated[
    str,
    typer.Option(
        "--sandbox",
        metavar="none|bwrap",
        help="bwrap: run each workload in bubblewrap (read-only system, private /tmp, data directories "
        "hidden, own PID namespace); needs Debian's bubblewrap package.",
    ),
]
SharingOption = Annotated[
    bool,
    typer.Option(
        "--allow-tenant-sharing",
        help="Let several tenants' workloads share this node although the agent is not root (they run as "
        "the agent's user and can reach each other); without it the scheduler places one tenant at a time.",
    ),
]
LogsPortOption = Annotated[
    int,
    typer.Option("--logs-port", min=0, max=65535, help="Port the control plane reads workload logs on (0: any)."),
]
KeepFinishedOption = Annotated[
    str,
    typer.Option(
        "--keep-finished",
        metavar="DURATION",
        help="How long a finished workload's working directory (under --work-root) is kept after its process "
        "ended: 0, 30s, 15m, 1h, 7d (0: removed at once).",
    ),
]
KeepLogsOption = Annotated[
    str,
    typer.Option(
        "--keep-logs",
        metavar="DURATION",
        help="How long a finished workload's output.log (in the agent's data directory) is kept for "
        "`finesched logs` after its process ended: 0, 30s, 15m, 1h, 7d.",
    ),
]
FAKE_GPU_MEMORY = "16Gi"
MAX_FAKE_GPUS = 64


def parse_fake_gpus(text: str | None) -> tuple[int, int] | None:
    """``N[:MEMORY]`` -> (count, bytes); a usage error (exit 2) naming the option otherwise."""
    from finesched.quantity import parse_quantity

    if text is None:
        return None
    count, _, memory = text.partition(":")
    if not count.isdigit() or not 1 <= int(count) <= MAX_FAKE_GPUS:
        raise fail(f"--fake-gpus {text!r}: N must be a whole number from 1 to {MAX_FAKE_GPUS}", 2)
    try:
        size = parse_quantity(memory or FAKE_GPU_MEMORY, "bytes")
    except ValueError as exc:
        raise fail(f"--fake-gpus {text!r}: MEMORY {exc}", 2) from None
    if size <= 0:
        raise fail(f"--fake-gpus {text!r}: MEMORY must be more than 0", 2)
    return int(count), size


def parse_retention(keep_finished: str, keep_logs: str) -> tuple[float, float]:
    """``--keep-finished``, ``--keep-logs`` -> seconds; a usage error (exit 2) naming the option otherwise."""
    from finesched.agent.retention import parse_duration

    try:
        return parse_duration(keep_finished, "--keep-finished"), parse_duration(keep_logs, "--keep-logs")
    except ValueError as exc:
        raise fail(str(exc), 2) from None


def parse_tenant_uids(text: str) -> range:
    """``--tenant-uids START-END`` -> range; a usage error (exit 2) naming the option and value otherwise."""
    from finesched.agent.identity import parse_uid_range

    try:
        return parse_uid_range(text)
    except ValueError as exc:
        raise fail(str(exc), 2) from None


def check_sandbox(kind: str) -> None:
    """A usage error (exit 2) for an unknown --sandbox, before anything starts (bwrap itself is
    looked for and tried when the agent starts)."""
    from finesched.agent.sandbox import SANDBOXES

    if kind not in SANDBOXES:
        raise fail(f"--sandbox {kind!r}: must be one of {', '.join(SANDBOXES)}", 2)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # The agent polls its server every second: one INFO line per HTTP request would bury its own
    # log (bindings started, pools moved, rejections) under hundreds of request lines a minute.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _parse_labels(label: list[str] | None) -> dict[str, str]:
    """`--label KEY=VALUE` options as a dict; a usage error (exit 2) naming the bad one otherwise."""
    labels = {}
    for item in label or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--label must be KEY=VALUE, got {item!r}", 2)
        labels[key] = value
    return labels


def _agent_client(server: str, token: str, ca: Path | None, insecure: bool) -> Any:
    """The agent's client of `server`; a URL the token must not be sent to, or an unreadable CA file,
    is a usage error (exit 2)."""
    from finesched.agent.client import AgentClient
    from finesched.tls import TransportError

    try:
        return AgentClient(server, token, ca=ca, insecure=insecure)
    except TransportError as exc:
        raise fail(str(exc), 2) from None


def agent_cmd(
    server: Annotated[str, typer.Option("--server", help="Control plane URL, e.g. http://10.0.0.1:8080.")],
    token: Annotated[str, typer.Option("--token", help="An agent (or admin) token.", envvar="FINESCHED_TOKEN")],
    node_name: Annotated[str | None, typer.Option("--node-name", help="Node name (default: hostname).")] = None,
    data: DataOption = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between reports.")] = 5.0,
    watch: Annotated[float, typer.Option("--watch", min=0.1, help="Seconds between binding checks.")] = 1.0,
    label: Annotated[list[str] | None, typer.Option("--label", help="Node label KEY=VALUE (repeatable).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors.")] = False,
    ca: CaOption = None,
    insecure: InsecureOption = False,
    logs_port: LogsPortOption = 0,
    logs_address: Annotated[
        str | None,
        typer.Option(
            "--logs-address",
            help="Address the control plane reaches this machine at (default: the local end of the route to --server).",
        ),
    ] = None,
    tls_cert: LogsCertOption = None,
    tls_key: LogsKeyOption = None,
    fake_gpus: FakeGpusOption = None,
    mig_mode: Annotated[
        str, typer.Option("--mig-mode", help="GPUs in MIG mode: static (assign existing instances) or dynamic.")
    ] = "static",
    tenant_uids: TenantUidsOption = "200000-299999",
    work_root: WorkRootOption = None,
    sandbox: SandboxOption = "none",
    allow_tenant_sharing: SharingOption = False,
    keep_finished: KeepFinishedOption = "1h",
    keep_logs: KeepLogsOption = "7d",
) -> None:
    """Run this machine's node agent: register, report resources, run bound workloads pinned, each as
    its tenant's user (as root; see --tenant-uids, --sandbox)."""
    from finesched.agent.loop import AgentConfig
    from finesched.tls import TransportError, server_tls

    simulated = parse_fake_gpus(fake_gpus)
    try:
        server_tls(tls_cert, tls_key)  # the log port's pair: checked before anything starts
    except TransportError as exc:
        raise fail(str(exc), 2) from None
    labels = _parse_labels(label)
    if mig_mode not in ("static", "dynamic"):
        raise fail(f"--mig-mode must be static or dynamic, got {mig_mode!r}", 2)
    uids = parse_tenant_uids(tenant_uids)
    keep_finished_s, keep_logs_s = parse_retention(keep_finished, keep_logs)
    check_sandbox(sandbox)
    _logging(not quiet)
    config = AgentConfig(server, token, data or default_data(), node_name, interval, watch, labels,
                         logs_port=logs_port, logs_host=logs_address, tls_cert=tls_cert, tls_key=tls_key,
                         fake_gpus=simulated, mig_mode=mig_mode, tenant_uids=uids, work_root=work_root,
                         sandbox=sandbox, allow_tenant_sharing=allow_tenant_sharing,
                         keep_finished_s=keep_finished_s, keep_logs_s=keep_logs_s)  # fmt: skip
    client = _agent_client(server, token, ca, insecure)
    agent = _new_agent(config, client)
    _stop_on_signals(agent.stopping)
    _run(agent)


def _new_agent(config: Any, client: Any) -> Any:
    """The agent; a state file, work root or sandbox it cannot use is one line and exit 1."""
    from finesched.agent.loop import Agent

    try:
        return Agent(config, client)
    except ValueError as exc:  # an unreadable state file, a work root or sandbox that cannot serve
        raise fail(str(exc)) from None


def _run(agent: object) -> None:
    """Run the agent; a refused registration (bad token, wrong node) is one line and exit 1."""
    from finesched.agent.executor import ServerError

    try:
        agent.run()  # type: ignore[attr-defined]
    except ServerError as exc:
        raise fail(f"the server refused this agent: {exc}") from None


def _stop_on_signals(event: object) -> None:
    def handler(signum: int, frame: object) -> None:
        event.set()  # type: ignore[attr-defined]

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "finesched.cli", *args]


def _wait_ready(
    url: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 60.0, verify: object = True
) -> None:
    """Until the server answers at all (its /healthz: no token, so no failed authentication logged)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise fail(f"the server exited with code {server.returncode}: {_last_error(log)} (see {log})")
        try:
            if httpx.get(f"{url}/healthz", timeout=2, verify=verify).status_code < 500:  # type: ignore[arg-type]
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise fail(f"the server did not answer at {url} within {timeout:.0f}s")


def _last_error(log: Path) -> str:
    """The server log's last line that says what went wrong (its last line otherwise)."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or line.startswith(("OSError", "ValueError")):
            return line
    return lines[-1] if lines else "no output"


def check_port(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None: it can), asked before anything starts.
    Bound as uvicorn binds (SO_REUSEADDR), so a port in TIME_WAIT is free and a listening one is not."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"cannot resolve --host {host}: {exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def _valid(url: str, token: str, path: str, verify: Any) -> bool:
    """Whether the running server takes `token` for GET `path`."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    try:
        return httpx.get(f"{url}{path}", headers=headers, timeout=10, verify=verify).status_code == 200
    except httpx.HTTPError:
        return False


def _kept_or_new(
    path: Path, url: str, check: str, verify: Any, db: str, *role: str, new: bool = False
) -> tuple[str, bool]:
    """The token kept in `path` when the server still takes it (and `new` is not asked), else a new
    one written there (mode 600); and whether it was kept."""
    if not new and path.is_file():
        private_file(path)  # an older version's, made with the umask's mode: tightened, and said
        kept = path.read_text().strip()
        if kept and _valid(url, kept, check, verify):
            return kept, True
    token = _token(db, *role)
    write_private(path, token + "\n")
    return token, False


def _up_tls(
    tls_cert: Path | None, tls_key: Path | None, agent_ca: Path | None, insecure_agent_logs: bool
) -> tuple[bool, list[str], list[str], Any]:
    """`up`'s transport, checked before anything starts (a usage error, exit 2, otherwise): whether the
    server speaks HTTPS, `serve`'s TLS options and agent-log options, and the pinned context its own
    agent and checks verify the server with (None: plain HTTP)."""
    from finesched.tls import TransportError, pinned_context, server_tls

    try:
        tls = server_tls(tls_cert, tls_key)
        agent_logs_args = _agent_logs_args(tls_cert, agent_ca, insecure_agent_logs)
    except TransportError as exc:
        raise fail(str(exc), 2) from None
    tls_args = ["--tls-cert", str(tls_cert), "--tls-key", str(tls_key)] if tls else []
    verify = pinned_context(tls_cert) if tls and tls_cert is not None else None
    return bool(tls), tls_args, agent_logs_args, verify


def _start_server(data: Path, db: str, host: str, port: int, interval: float, extra: list[str]) -> SupervisedServer:
    """`up`'s control plane: `finesched serve` on `db` as a child process, its output in
    `<data>/server.log` (`extra`: its TLS and agent-log options)."""
    return SupervisedServer(
        _cli("serve", "--db", db, "--host", host, "--port", str(port), "--heartbeat", str(interval), *extra),
        data / "server.log",
    )


def _up_tokens(data: Path, url: str, name: str, verify: Any, db: str, *, new_admin: bool) -> tuple[str, bool, str]:
    """`up`'s admin token, whether it was kept from the last run, and its agent's token (each kept in
    the data directory while the server takes it)."""
    admin, kept = _kept_or_new(data / "admin.token", url, "/v1/nodes", verify, db, "--role", "admin", new=new_admin)
    agent_token, _ = _kept_or_new(
        data / "agent.token", url, f"/v1/bindings?node={name}", verify, db, "--role", "agent", "--node", name
    )
    return admin, kept, agent_token


def _token(db: str, *role: str) -> str:
    done = subprocess.run(_cli("token", "create", "--db", db, *role), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise fail(f"token create failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().splitlines()[-1].strip()


def _agent_logs_args(local_cert: Path | None, agent_ca: Path | None, insecure: bool) -> list[str]:
    """`serve`'s options for reading agents' log ports, from `up`'s (raises tls.TransportError for a
    CA file that cannot be read, before the server starts)."""
    from finesched.tls import ca_context

    args = ["--local-agent-cert", str(local_cert)] if local_cert is not None else []
    if agent_ca is not None:
        ca_context(agent_ca, "--agent-ca")
        args += ["--agent-ca", str(agent_ca)]
    return args + (["--insecure-agent-logs"] if insecure else [])


def _check_ports(host: str, port: int, logs_port: int) -> None:
    """Refuse a server port or a log port that cannot be listened on, before anything is written or started."""
    busy = check_port(host, port)
    if busy is not None:
        raise fail(f"{busy}; is finesched (or something else) already running there? Stop it or pass --port")
    busy = check_port("127.0.0.1", logs_port) if logs_port else None
    if busy is not None or logs_port == port:
        raise fail(f"--logs-port {logs_port}: {busy or 'is the server port'}; pass another --logs-port (0: any)")


def _local_node_name(node_name: str | None) -> str:
    """`--node-name`, or this host's name as kubelet names a node after its host; refused (exit 2)
    when it is not a valid node name."""
    import socket

    from finesched.model.names import subdomain_problems

    name = node_name or socket.gethostname().lower()
    if subdomain_problems(name):
        raise fail(f"node name {name!r}: {subdomain_problems(name)[0]}; pass --node-name", 2)
    return name


def _print_welcome(
    url: str,
    name: str,
    data: Path,
    db: str,
    admin: str,
    *,
    kept: bool,
    simulated: tuple[int, int] | None,
    tls: bool,
    port: int,
) -> None:
    """What `up` tells its user once the server answers: the URL, the admin token, where the logs
    are, and how another machine joins."""
    scheme = "https" if tls else "http"
    print(f"finesched is up: {url}  (node {name})")
    again = "kept from the last run; --new-admin-token makes another" if kept else "new"
    print(f"admin token: {admin}  ({again}; also in {data / 'admin.token'})")
    print(f"server log: {data / 'server.log'}; a workload's output: finesched logs NAME --server {url} "
          "--token TOKEN (or FINESCHED_SERVER / FINESCHED_TOKEN)")  # fmt: skip
    if simulated is not None:
        print(f"node {name} has {simulated[0]} SIMULATED GPU(s) (--fake-gpus): no real GPU is used", flush=True)
    joining = (
        "--ca CA.pem (the CA of --tls-cert) --tls-cert NODE.pem --tls-key NODE-key.pem (its log port's pair, "
        "from the CA of --agent-ca)"
        if tls
        else "--insecure (the token crosses the network in clear)"
    )
    print(
        f"add a machine: finesched token create --db {db} --role agent --node NODE, then on that machine: "
        f"finesched agent --server {scheme}://<this host>:{port} --token TOKEN --node-name NODE {joining}",
        flush=True,
    )


UpHostOption = Annotated[
    str, typer.Option("--host", help="Listen address; 0.0.0.0 lets agents on other machines join.")
]
NewAdminTokenOption = Annotated[
    bool, typer.Option("--new-admin-token", help="Make a new admin token even if the data directory has one.")
]


def _agent_inputs(
    fake_gpus: str | None, tenant_uids: str, keep_finished: str, keep_logs: str, sandbox: str
) -> tuple[tuple[int, int] | None, range, tuple[float, float]]:
    """The local agent's options read (a clear error and exit 2 for a bad one): its simulated GPUs,
    its tenants' uid range and its retention times; the sandbox is checked to be available."""
    simulated = parse_fake_gpus(fake_gpus)
    uids = parse_tenant_uids(tenant_uids)
    retention = parse_retention(keep_finished, keep_logs)
    check_sandbox(sandbox)
    return simulated, uids, retention


def _profile_args(profile: str) -> list[str]:
    """`serve`'s --profile from `up`'s, checked before anything starts (exit 2 for a bad one); a
    file is given by its absolute path (the server is started again from anywhere)."""
    from finesched.errors import ValidationError
    from finesched.sched.profile import BUILTIN_PROFILES, resolve_profile

    try:
        resolve_profile(profile)
    except (ValidationError, OSError) as exc:
        raise fail(f"--profile {profile}: {exc}", 2) from None
    if profile == "default":
        return []
    return ["--profile", profile if profile in BUILTIN_PROFILES else str(Path(profile).resolve())]


def up_cmd(
    data: DataOption = None,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Server port.")] = 8080,
    host: UpHostOption = "127.0.0.1",
    node_name: Annotated[str | None, typer.Option("--node-name", help="This machine's node name.")] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between agent reports.")] = 5.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Agent logs only warnings and errors.")] = False,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    agent_ca: AgentCaOption = None,
    insecure_agent_logs: InsecureAgentLogsOption = False,
    fake_gpus: FakeGpusOption = None,
    new_admin_token: NewAdminTokenOption = False,
    tenant_uids: TenantUidsOption = "200000-299999",
    work_root: WorkRootOption = None,
    sandbox: SandboxOption = "none",
    allow_tenant_sharing: SharingOption = False,
    logs_port: LogsPortOption = 0,
    keep_finished: KeepFinishedOption = "1h",
    keep_logs: KeepLogsOption = "7d",
    profile: Annotated[
        str, typer.Option("--profile", help="Scheduling profile: a built-in name or a YAML file (`serve --profile`).")
    ] = "default",
) -> None:
    """Start a one-machine cluster: control plane + this machine's agent; print the URL and an admin token.

    With --tls-cert/--tls-key the server speaks HTTPS, and this machine's agent trusts exactly that certificate;
    agents on other machines verify it with --ca. The agent's log port speaks HTTPS with the same pair (the server
    trusts that certificate there, whatever names it carries); other machines' log ports are verified with
    --agent-ca. A server that dies is started again on the same data (the workloads run on); a killed `up` takes
    its server along and leaves the workloads to the next `up`'s agent."""
    from finesched.agent.client import AgentClient
    from finesched.agent.loop import AgentConfig

    tls, tls_args, agent_logs_args, verify = _up_tls(tls_cert, tls_key, agent_ca, insecure_agent_logs)
    simulated, uids, retention = _agent_inputs(fake_gpus, tenant_uids, keep_finished, keep_logs, sandbox)
    profile_args = _profile_args(profile)
    _check_ports(host, port, logs_port)
    name = _local_node_name(node_name)
    _logging(not quiet)
    data = private_dir((data or default_data()).resolve())  # the database, tokens, logs: the owner's alone
    db = f"sqlite:///{data / 'finesched.db'}"
    url = f"{'https' if tls else 'http'}://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    supervised = _start_server(data, db, host, port, interval, [*tls_args, *agent_logs_args, *profile_args])
    agent = None
    try:
        _wait_ready(url, supervised.process, data / "server.log", verify=verify or True)
        supervised.supervise()  # from now on a dead server is started again; the agent keeps running
        admin, kept, agent_token = _up_tokens(data, url, name, verify or True, db, new_admin=new_admin_token)
        _print_welcome(url, name, data, db, admin, kept=kept, simulated=simulated, tls=tls, port=port)
        # the local agent serves logs to the local server: on the loopback interface only
        config = AgentConfig(url, agent_token, data / "agent", name, interval, stop_workloads_on_exit=True,
                             logs_port=logs_port, logs_host="127.0.0.1", tls_cert=tls_cert, tls_key=tls_key,
                             fake_gpus=simulated, tenant_uids=uids, work_root=work_root, sandbox=sandbox,
                             allow_tenant_sharing=allow_tenant_sharing, hide=(data,),
                             keep_finished_s=retention[0], keep_logs_s=retention[1])  # fmt: skip
        agent = _new_agent(config, AgentClient(url, agent_token, verify=verify))  # TLS: exactly the server's own
        _stop_on_signals(agent.stopping)
        _run(agent)
    finally:
        if agent is not None:  # its keep-alive connection would hold the server's TLS shutdown up
            agent.client.close()
        supervised.stop()
        print("finesched stopped", flush=True)


def register(app: typer.Typer) -> None:
    from finesched.commands.logs import logs_cmd

    app.command("agent")(agent_cmd)
    app.command("up")(up_cmd)
    app.command("logs")(logs_cmd)
