"""`finesched token create|list|revoke`: API credentials, on the database or through a running server.

With `--db URL` (or FINESCHED_DB, or neither: the default database) the commands work on the store
directly, as the first admin token has to be made; with `--server URL` (or FINESCHED_SERVER) and an
admin's `--token` they go through the admin API (`/v1/tokens`), as the other client commands do
(`--ca`, `--insecure`: commands/client.py). `--db` given on the command line wins over
FINESCHED_SERVER; both on the command line is a usage error. Either way the same functions decide
(server/api/auth.py). `create` prints the token alone on stdout (its last line: `finesched up` and
scripts read it there) and what it is on stderr; `list` never shows a token or its digest.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.markup import escape

from finesched.commands.client import CaOption, Client, InsecureOption, TokenOption, err, out
from finesched.commands.serve import DEFAULT_DB, DbOption
from finesched.commands.tables import col, print_table, simple_table
from finesched.errors import ValidationError

token_app = typer.Typer(
    help="API tokens: create (printed once, stored hashed), list, revoke; on --db or through --server.",
    no_args_is_help=True,
)

ServerOption = Annotated[
    str | None,
    typer.Option("--server", envvar="FINESCHED_SERVER", help="Through this control plane's admin API (with "
                 "an admin's --token) instead of the database."),
]  # fmt: skip
#: The API's field names as this command's options (errors name what the user typed).
FLAGS = {"role": "--role", "tenant": "--tenant", "node": "--node", "ttlSeconds": "--ttl",
         "description": "--description"}  # fmt: skip
OUTPUTS = ("table", "wide", "json", "yaml")


def _on_server(ctx: typer.Context, server: str | None) -> bool:
    """Whether to go through the API: --server (or FINESCHED_SERVER) unless --db is on the command line."""

    def typed(name: str) -> bool:  # given on the command line (not from the environment or a default)
        source = ctx.get_parameter_source(name)
        return source is not None and source.name == "COMMANDLINE"

    db_given = typed("db")
    if db_given and typed("server"):
        raise typer.BadParameter("give --db (the database) or --server (a running control plane), not both",
                                 param_hint="--server")  # fmt: skip
    return server is not None and not db_given


def _store(db: str) -> Any:
    from finesched.server.store.store import Store

    return Store.open(db)


def _as_flags(exc: ValidationError) -> ValidationError:
    return ValidationError([replace(e, path=FLAGS.get(e.path, e.path)) for e in exc.errors])


def _dump(data: Any, output: str) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n" if output == "json" else yaml.safe_dump(data, sort_keys=False))


def _check_output(output: str, allowed: tuple[str, ...]) -> None:
    if output not in allowed:
        raise typer.BadParameter(f"{output!r}: use one of {', '.join(allowed)}", param_hint="-o")


def _what(info: dict[str, Any]) -> str:
    """ "admin", "tenant team-a", "agent n1"."""
    return " ".join(p for p in (info["role"], info.get("tenant") or info.get("node")) if p)


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    role: Annotated[str, typer.Option(help="admin, agent (one node) or tenant (one tenant).")],
    db: DbOption = DEFAULT_DB,
    tenant: Annotated[str | None, typer.Option(help="The tenant of a tenant token (it must exist).")] = None,
    node: Annotated[str | None, typer.Option(help="The node of an agent token.")] = None,
    ttl: Annotated[
        str | None, typer.Option(help="Lifetime: seconds, or 90s, 15m, 12h, 30d (at most 3650d); none: until revoked.")
    ] = None,
    description: Annotated[str, typer.Option(help="What the token is for (shown by `token list`).")] = "",
    server: ServerOption = None,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    output: Annotated[str, typer.Option("-o", "--output", help="token (just the token), json or yaml.")] = "token",
) -> None:
    """Print a new token for ROLE (keep it: only its hash is stored)."""
    from finesched.server.api.auth import issue_token, parse_ttl

    _check_output(output, ("token", "json", "yaml"))
    try:
        ttl_s = parse_ttl(ttl) if ttl is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--ttl") from None
    if _on_server(ctx, server):
        assert server is not None
        body = {"role": role, "tenant": tenant, "node": node, "ttlSeconds": ttl_s, "description": description}
        client = Client(server, token, ca=ca, insecure=insecure)
        answer = client.call("POST", "/v1/tokens", json={k: v for k, v in body.items() if v not in (None, "")})
        secret, info = answer.pop("token"), answer
    else:
        store = _store(db)
        try:
            issued = issue_token(store, role, tenant, node, ttl_s=ttl_s, description=description)
        except ValidationError as exc:
            raise _as_flags(exc) from None
        finally:
            store.close()
        secret, info = issued.token, issued.info
    if output != "token":
        _dump({"token": secret, **info}, output)
        return
    until = f", expires {info['expires']}" if info.get("expires") else ", no expiry"
    err.print(f"token {info['id']}: {escape(_what(info))}{until}; shown once", soft_wrap=True)
    typer.echo(secret)


def _when(stamp: str | None, wide: bool) -> str:
    if stamp is None:
        return "-"
    return stamp if wide else datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M")


@token_app.command("list")
def token_list(
    ctx: typer.Context,
    db: DbOption = DEFAULT_DB,
    server: ServerOption = None,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    output: Annotated[str, typer.Option("-o", "--output", help="table, wide, json or yaml.")] = "table",
) -> None:
    """Every token: id, role, tenant or node, created, expires, revoked, description (never the token)."""
    from finesched.server.api.auth import list_tokens

    _check_output(output, OUTPUTS)
    if _on_server(ctx, server):
        assert server is not None
        items = Client(server, token, ca=ca, insecure=insecure).call("GET", "/v1/tokens")["items"]
    else:
        store = _store(db)
        try:
            items = list_tokens(store)
        finally:
            store.close()
    if output in ("json", "yaml"):
        _dump(items, output)
        return
    wide = output == "wide"
    rows = [(str(i["id"]), i["role"], escape(i.get("tenant") or i.get("node") or "-"), _when(i["created"], wide),
             _when(i["expires"], wide), _when(i["revoked"], wide), i["state"], escape(i["description"]))
            for i in items]  # fmt: skip
    headers = [col("id", right=True), "role", "tenant/node", "created (UTC)", "expires", "revoked", "state",
               "description"]  # fmt: skip
    print_table(out, simple_table(f"{len(items)} token(s)", headers, rows), wide=wide)


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context,
    ids: Annotated[
        list[int],
        typer.Argument(help="The ids of the tokens (`finesched token list`).", min=1, max=2**63 - 1, metavar="ID"),
    ],
    db: DbOption = DEFAULT_DB,
    server: ServerOption = None,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Revoke tokens by id: every server refuses them within a second.

    All or none: an unknown id is an error and nothing is revoked."""
    from finesched.server.api.auth import revoke_tokens
    from finesched.server.store.store import NotFound

    if _on_server(ctx, server):
        assert server is not None
        client = Client(server, token, ca=ca, insecure=insecure)
        known = {i["id"] for i in client.call("GET", "/v1/tokens")["items"]}
        missing = [str(i) for i in dict.fromkeys(ids) if i not in known]
        if missing:
            _refuse(f"no token with id {', '.join(missing)}")
        revoked = [client.call("DELETE", f"/v1/tokens/{i}") for i in dict.fromkeys(ids)]
    else:
        store = _store(db)
        try:
            revoked = revoke_tokens(store, ids)
        except NotFound as exc:
            _refuse(str(exc))
        finally:
            store.close()
    for info in revoked:
        out.print(f"token {info['id']} ({escape(_what(info))}) revoked at {info['revoked']}")


def _refuse(message: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}; nothing was revoked", soft_wrap=True)
    raise typer.Exit(1)
