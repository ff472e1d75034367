"""`finesched logs WORKLOAD [--follow] [--tail N]`: a workload's output, from wherever it ran.

The server fetches it from the node agent that ran the workload (server/logs.py), so this works
from any machine that reaches the server, with the same rights as `finesched get` (a tenant token
reads its own workloads). ``--data DIR`` reads the agent's data directory on this machine instead
(no server needed: the machine the workload ran on).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from finesched.commands.client import (
    DEFAULT_SERVER,
    CaOption,
    Client,
    InsecureOption,
    NamespaceOption,
    ServerOption,
    TokenOption,
    _fail,
    _workload_key,
)
from finesched.commands.client import _fail_response as fail_response


def logs_cmd(
    name: Annotated[str, typer.Argument(help="Workload NAME or NAMESPACE/NAME.")],
    namespace: NamespaceOption = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the process ends.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N lines.")] = None,
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    data: Annotated[
        Path | None,
        typer.Option("--data", help="Read the log from this agent data directory on this machine, not the server."),
    ] = None,
) -> None:
    """Print a workload's output (stdout and stderr), fetched by the server from its node's agent."""
    if data is not None:  # no server to ask a tenant token's namespace: -n, or default
        _local("/".join(_workload_key(name, namespace)), data, tail)
        return
    params: dict[str, str | int] = {"follow": "true"} if follow else {}
    if tail is not None:
        params["tail"] = tail
    import httpx

    client = Client(server, token, timeout=None, ca=ca, insecure=insecure)
    key = "/".join(client.key(name, namespace))
    out = sys.stdout.buffer
    try:
        with client.http.stream("GET", f"/v1/workloads/{key}/logs", params=params) as response:
            if response.status_code >= 400:
                response.read()
                fail_response(response, client)
            for chunk in response.iter_raw():
                out.write(chunk)
                out.flush()
    except httpx.HTTPError as exc:
        _fail(f"logs of {key}: {exc}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _local(key: str, data: Path, tail: int | None) -> None:
    from finesched.agent.executor import rundirs_of
    from finesched.agent.logs import tail_offset

    for root in (data, data / "agent"):
        found = rundirs_of(root, key)  # the newest object of that name (deleted ones' logs may remain)
        path = found[0] / "output.log" if found else None
        if path is not None:
            with path.open("rb") as f:
                f.seek(tail_offset(f, tail) if tail is not None else 0)
                sys.stdout.buffer.write(f.read())
            return
    _fail(f"no log for {key} under {data} (is this the machine its agent runs on?)")
