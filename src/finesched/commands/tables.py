"""Tables for the terminal that stay readable in 80 columns, and `-o wide` for everything in full.

Rules (what `kubectl get` users expect):

* a cell wraps between words, never inside one; a word too long for its column is shortened
  with an ellipsis ("…"), never broken in two;
* columns marked `wide` (details a narrow terminal has no room for) appear only with `-o wide`;
* `-o wide` prints every column at its natural width, nothing shortened, however long the lines
  get (for wide terminals, files and `less -S`).

Every table of the command line is built here, so the rules hold everywhere::

    columns = Columns(Col("workload"), Col("node"), Col("cpuset", wide=True))
    table = columns.table("3 workload(s)", wide=False)
    columns.add_row(table, "team-a/web", "n1", "0-3")      # "0-3" dropped unless wide
    print_table(console, table, wide=False)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

Justify = Literal["left", "center", "right"]
#: What `-o` accepts where a table is printed (wide: every column, nothing shortened).
TABLE_OUTPUTS = ("table", "wide")


@dataclass(frozen=True)
class Col:
    """One column: its header, alignment, whether only `-o wide` shows it, and whether its cells
    never wrap (short values such as numbers and phases: other columns give way first)."""

    header: str
    justify: Justify = "right"
    wide: bool = False
    keep: bool = False

    def __post_init__(self) -> None:
        if self.justify not in ("left", "center", "right"):
            raise ValueError(f"justify must be left, center or right, not {self.justify!r}")


def col(header: str, *, right: bool = False, wide: bool = False, keep: bool = False) -> Col:
    """A left-aligned column (numbers: `right=True`; `keep`: cells never wrap)."""
    return Col(header, "right" if right else "left", wide, keep)


class Columns:
    """A table's columns; builds the table and its rows for the narrow (default) or wide output."""

    def __init__(self, *columns: Col | str):
        self.columns = [c if isinstance(c, Col) else col(c) for c in columns]

    def table(self, title: str | None = None, *, wide: bool = False, **options: Any) -> Table:
        """The table (its columns for `wide` or not); at least as wide as its title, so a short
        table under a long title does not wrap the title between words it has room for."""
        if title:
            options.setdefault("min_width", cell_len(Text.from_markup(title).plain) + 2)
        table = Table(title=title, **options)
        for c in self.columns:
            if c.wide and not wide:
                continue
            table.add_column(c.header, justify=c.justify, overflow="ellipsis", no_wrap=wide or c.keep)
        return table

    def add_row(self, table: Table, *values: RenderableType | None, wide: bool = False, **options: Any) -> None:
        """Add one row given a value for every column; wide-only values are dropped unless `wide`."""
        if len(values) != len(self.columns):
            raise ValueError(f"{len(values)} values for {len(self.columns)} columns")
        shown = [v for c, v in zip(self.columns, values, strict=True) if wide or not c.wide]
        table.add_row(*shown, **options)


def simple_table(title: str | None, headers: Sequence[Col | str], rows: Sequence[Sequence[Any]]) -> Table:
    """A narrow table of `rows` (every column shown): for small summaries without wide details."""
    columns = Columns(*headers)
    table = columns.table(title)
    for row in rows:
        columns.add_row(table, *row)
    return table


def print_table(console: Console, renderable: RenderableType, *, wide: bool = False) -> None:
    """Print a table: narrow to the console's width, or (`wide`) at its natural width, unshortened."""
    if not wide:
        console.print(renderable)
        return
    width = max(console.measure(renderable, options=console.options.update(width=10**6)).maximum, 20)
    full = Console(file=console.file, width=width, highlight=False, color_system=console.color_system,
                   force_terminal=console.is_terminal, no_color=console.no_color)  # fmt: skip
    full.print(renderable, crop=False)


def check_output(output: str, allowed: Sequence[str]) -> None:
    """Raise ValueError naming the allowed values when `-o` is not one of them."""
    if output not in allowed:
        raise ValueError(f"-o {output!r}: use one of {', '.join(allowed)}")


def event_time(stamp: str, wide: bool) -> str:
    """An event's time as a reader scans it: the full ISO stamp with -o wide, else UTC
    `HH:MM:SS` for today's events and `MM-DD HH:MM` for older ones (the table keeps its width for
    the message)."""
    if wide:
        return stamp
    try:
        when = datetime.fromisoformat(stamp).astimezone(UTC)
    except ValueError:
        return stamp
    return when.strftime("%H:%M:%S" if when.date() == datetime.now(UTC).date() else "%m-%d %H:%M")
