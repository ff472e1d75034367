"""What every command shares: the error line and exit, manifests loaded or admitted (or every
problem listed and exit 1), and the default data folder.

It sits under `commands/` so that `cli.py` and the command modules both import it and neither
imports the other back (cli.py wires the commands; the commands never import cli.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from finesched.errors import ValidationError
from finesched.model.manifest import Manifests, load_manifests, read_manifests

if TYPE_CHECKING:
    from finesched.admission import World

err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def load_or_exit(paths: list[Path]) -> Manifests:
    """Load manifests, or print every problem and exit 1."""
    try:
        return load_manifests(*paths)
    except ValidationError as exc:
        for detail in exc.errors:
            err.print(f"[bold red]error:[/] {escape(str(detail))}", soft_wrap=True)
        raise typer.Exit(1) from None


def admit_or_exit(paths: list[Path], *, warn: bool = True, known: World | None = None) -> Manifests:
    """Load manifests and apply the server's admission rules to them: every problem of every
    document (on its field's line) and exit 1, or the objects as the server stores them (with, when
    `warn`, a warning for each reference to what neither the files nor `known`, what the server
    said it holds, define)."""
    from finesched.admission import admit_manifests

    read, errors = read_manifests(*paths)
    try:
        manifests, warnings = admit_manifests(read, known)
    except ValidationError as exc:
        errors += read.with_lines(exc.errors)
    if errors:
        for detail in errors:
            err.print(f"[bold red]error:[/] {escape(str(detail))}", soft_wrap=True)
        raise typer.Exit(1) from None
    scope = "these files and the server's tenants and priority classes" if known else "these files only"
    for detail in read.with_lines(warnings) if warn else ():
        err.print(f"[yellow]warning:[/] {escape(str(detail))} ({scope}; the server checks its own)", soft_wrap=True)
    return manifests


def default_data() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "finesched"
