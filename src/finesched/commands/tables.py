"""Tables for the terminal that stay readable in 80 columns, and `-o wide` for everything in full.

Rules (what `kubectl get` users expect):

* a cell wraps between words, never inside one;
* a word too wide for its column (a workload's, a slot's, a node's name, a path) is shortened in its
  middle (``clicks-r…on-0-3``, `Cell`), so names that differ only at their end (a job's slots)
  stay apart;
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

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
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


def shorten_middle(text: str, width: int) -> str:
    """`text` in at most `width` cells: whole when it fits, else its start and its end around "…",
    the end kept one longer (where a job's slots and numbered names differ)."""
    head, tail = _middle_cut(text, width)
    return text if head + tail == len(text) else f"{text[:head]}…{text[len(text) - tail :]}"


def _middle_cut(word: str, width: int) -> tuple[int, int]:
    """How many characters of `word` `shorten_middle` keeps at its start and at its end."""
    if cell_len(word) <= width:
        return len(word), 0
    room = max(width - 1, 0)
    head, tail = 0, 0
    while head < len(word) and cell_len(word[: head + 1]) <= room // 2:
        head += 1
    while tail < len(word) - head and cell_len(word[len(word) - tail - 1 :]) <= room - cell_len(word[:head]):
        tail += 1
    return head, tail


def shorten_words(text: Text, width: int) -> Text:
    """`text` with every word wider than `width` shortened in its middle (styles kept): a cell then
    wraps between words and never breaks or cuts one at its end."""
    plain = text.plain
    long = [m for m in re.finditer(r"\S+", plain) if cell_len(m.group()) > width]
    if not long or width < 1:
        return text
    out = text.blank_copy()
    position = 0
    for match in long:
        head, tail = _middle_cut(match.group(), width)
        out.append_text(text[position : match.start() + head])
        out.append("…")
        position = match.end() - tail
    out.append_text(text[position:])
    return out


class Cell:
    """A table cell's text (console markup): measured as rich measures text (at least its longest
    word, so columns wrap before they shorten), rendered to its column's width with every word too
    wide for it shortened in its middle (`shorten_words`), then wrapped between words."""

    def __init__(self, markup: str, *, wrap: bool = True):
        self.text = Text.from_markup(markup)
        self.wrap = wrap

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.text)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = shorten_words(self.text, options.max_width)
        text.no_wrap = not self.wrap
        text.overflow = "ellipsis"
        if not self.wrap:  # one line: the whole cell, shortened in its middle when too wide
            head, tail = _middle_cut(text.plain, options.max_width)
            if head + tail < len(text.plain):
                text = Text.assemble(text[:head], "…", text[len(text.plain) - tail :])
        yield text

    def __str__(self) -> str:
        return self.text.plain


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
        shown = [_cell(c, v, wide) for c, v in zip(self.columns, values, strict=True) if wide or not c.wide]
        table.add_row(*shown, **options)


def _cell(column: Col, value: RenderableType | None, wide: bool) -> RenderableType | None:
    """A cell's text (markup, as every cell is given) as a `Cell`; other renderables as given. With
    `wide` nothing is shortened (the table is printed at its natural width)."""
    if isinstance(value, str) and not wide:
        return Cell(value, wrap=not column.keep)
    return value


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
