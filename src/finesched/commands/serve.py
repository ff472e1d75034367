"""`finesched serve`: the control plane (its token commands are commands/tokens.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from finesched.server.logs import AgentTrust
    from finesched.server.loop.lease import ReplicaIdentity

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_DB = f"sqlite:///{Path.home() / '.local/share/finesched/finesched.db'}"

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="FINESCHED_DB",
        show_default=False,
        help="Database URL: sqlite:/// then a path, or postgresql+psycopg:// then USER@HOST/DB (default: "
        "finesched.db in the XDG data directory, ~/.local/share).",
    ),
]

TlsCertOption = Annotated[
    Path | None, typer.Option("--tls-cert", help="Serve HTTPS with this certificate (PEM; chain after the leaf).")
]
TlsKeyOption = Annotated[Path | None, typer.Option("--tls-key", help="The private key of --tls-cert (PEM).")]
AgentCaOption = Annotated[
    Path | None,
    typer.Option(
        "--agent-ca",
        help="CA file (PEM) that node agents' log-port certificates are verified with (default: the system's).",
    ),
]
InsecureAgentLogsOption = Annotated[
    bool,
    typer.Option(
        "--insecure-agent-logs",
        help="Read logs over plain HTTP from agents on other machines (log grants and output cross it in clear).",
    ),
]

RequeueAfterOption = Annotated[
    float, typer.Option(min=-1.0, help="Requeue a NotReady node's workloads after this many seconds (-1: never).")
]
ReplicaDataOption = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="This replica's state directory (its identity); default: the SQLite file's directory, "
        "else finesched in the XDG data directory (~/.local/share).",
    ),
]
ReplicaIdOption = Annotated[
    str | None,
    typer.Option(
        "--replica-id", help="A stable name for this replica (e.g. the pod name); default: one kept in --data."
    ),
]
LocalAgentCertOption = Annotated[
    Path | None,
    typer.Option(
        "--local-agent-cert",
        help="Trust exactly this certificate (or one from --agent-ca) for an agent on this machine (a "
        "loopback logs URL), whatever names it carries (`finesched up` passes its --tls-cert: its agent "
        "serves with the server's pair).",
    ),
]
ParentPidOption = Annotated[
    int | None, typer.Option("--parent-pid", hidden=True, help="End when this process (`finesched up`) ends.")
]
EventTtlOption = Annotated[
    float, typer.Option("--event-ttl", min=-1.0, help="Prune events older than this many seconds (-1: keep them).")
]
HeaderTimeoutOption = Annotated[
    float, typer.Option("--header-timeout", min=0.1, help="Close a connection whose request headers take longer (s).")
]
BodyTimeoutOption = Annotated[
    float, typer.Option("--body-timeout", min=0.1, help="Close a connection whose request body takes longer (s).")
]


def serve(
    db: DbOption = DEFAULT_DB,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8080,
    profile: Annotated[str, typer.Option(help="Scheduling profile: a built-in name or a YAML file.")] = "default",
    batch: Annotated[int, typer.Option(min=1, max=10000, help="Workloads decided per store transaction.")] = 100,
    lease_ttl: Annotated[float, typer.Option(min=1.0, help="Scheduler lease TTL in seconds (replicas).")] = 10.0,
    heartbeat: Annotated[float, typer.Option(min=0.1, help="Agent report interval the server expects (s).")] = 5.0,
    missed: Annotated[int, typer.Option(min=1, help="Missed reports before a node is NotReady.")] = 3,
    requeue_after: RequeueAfterOption = 60.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    data: ReplicaDataOption = None,
    replica_id: ReplicaIdOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    agent_ca: AgentCaOption = None,
    local_agent_cert: LocalAgentCertOption = None,
    insecure_agent_logs: InsecureAgentLogsOption = False,
    parent_pid: ParentPidOption = None,
    event_ttl: EventTtlOption = 3600.0,
    max_watches: Annotated[int, typer.Option(min=1, help="Event watches (SSE) held at once, in all.")] = 1000,
    watch_per_token: Annotated[int, typer.Option(min=1, help="Event watches held at once by one token.")] = 10,
    max_connections: Annotated[int, typer.Option(min=1, help="Connections and requests at once (503 past it).")] = 4096,
    header_timeout: HeaderTimeoutOption = 10.0,
    body_timeout: BodyTimeoutOption = 30.0,
) -> None:
    """Run the control plane: HTTP API, store and scheduling loop (one leader per database).

    A restarted replica takes the scheduler lease of its own previous life over at once (same
    --replica-id, or same --data); other replicas wait for it to expire (--lease-ttl). Workload
    logs are read from the agents' log ports over HTTPS verified with --agent-ca, or over plain
    HTTP on loopback only (--insecure-agent-logs: anywhere)."""
    from finesched.sched.profile import resolve_profile
    from finesched.server.api import http_server
    from finesched.server.api.http_server import Timeouts
    from finesched.server.api.watch_hub import WatchLimits
    from finesched.server.app import create_app
    from finesched.server.logs import use_agent_trust
    from finesched.server.loop.loop import LoopConfig
    from finesched.server.store.store import Store

    if parent_pid is not None:
        from finesched.commands.supervise import end_with_parent

        end_with_parent(parent_pid)
    _configure_logging(log_level)
    resolve_profile(profile)  # a bad profile is reported before anything starts
    tls = server_tls_options(tls_cert, tls_key)
    agent_trust = _agent_trust(agent_ca, local_agent_cert, insecure_agent_logs)
    identity = _identity(db, data, replica_id)
    config = LoopConfig(profile=profile, batch_size=batch, lease_ttl_s=lease_ttl, heartbeat_s=heartbeat,
                        missed_heartbeats=missed, requeue_after_s=None if requeue_after < 0 else requeue_after,
                        holder=identity.name, event_ttl_s=None if event_ttl < 0 else event_ttl)  # fmt: skip
    store = Store.open(db)
    app = create_app(store, config, watch=WatchLimits(per_token=watch_per_token, total=max_watches))
    use_agent_trust(app, agent_trust)
    timeouts = Timeouts(header_timeout_s=header_timeout, body_timeout_s=body_timeout, max_connections=max_connections)
    level = log_level.lower()
    http_server.run(app, host, port, timeouts, log_level=level, access_log=level == "debug", **tls)


def _configure_logging(log_level: str) -> None:
    """The process's logging at --log-level (a usage error naming the levels otherwise); below debug
    without the HTTP client's line per request to an agent's log port."""
    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{log_level!r}: use one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if log_level.lower() != "debug":  # the server's own reads of agents' log ports: a line per `logs` call
        for chatty in ("httpx", "httpcore"):
            logging.getLogger(chatty).setLevel(logging.WARNING)


def server_tls_options(cert: Path | None, key: Path | None, client_ca: Path | None = None) -> dict[str, object]:
    """uvicorn's TLS arguments (tls.py), or a clear usage error."""
    from finesched.tls import TransportError, server_tls

    try:
        return server_tls(cert, key, client_ca)
    except TransportError as exc:
        raise typer.BadParameter(str(exc)) from None


def _agent_trust(agent_ca: Path | None, local_agent_cert: Path | None, insecure: bool) -> AgentTrust:
    """How the server reads agents' log ports (a clear error and exit 2 for an unreadable CA or
    certificate); a warning in the log when it may read them in clear."""
    from finesched.server.logs import AgentTrust
    from finesched.tls import TransportError

    try:
        trust = AgentTrust.load(agent_ca, local_agent_cert, insecure)
    except TransportError as exc:
        raise typer.BadParameter(str(exc)) from None
    if insecure:
        logging.getLogger("finesched.server").warning(
            "--insecure-agent-logs: log grants and workload output may cross the network in clear"
        )
    return trust


def _identity(db: str, data: Path | None, replica_id: str | None) -> ReplicaIdentity:
    """This replica's lease identity (see server/loop/lease.py), or a clear error and exit 2."""
    from finesched.commands.common import default_data
    from finesched.errors import ValidationError
    from finesched.server.loop.lease import replica_identity
    from finesched.server.store.db import parse_db_url

    try:
        url = parse_db_url(db)
        if data is None:
            data = Path(url.database).expanduser().parent if url.get_backend_name() == "sqlite" else default_data()
        identity = replica_identity(data, replica_id)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    except OSError as exc:
        raise typer.BadParameter(f"{data}: {exc.strerror}", param_hint="--data") from None
    logging.getLogger("finesched.server").info("replica identity %s (%s)", identity.name, identity.source)
    return identity
