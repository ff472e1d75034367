"""CLI tables in an 80-column terminal: no line longer, no word ever broken in two (words wrap whole or
are shortened in their middle with "…", so names that differ at their end stay apart), and `-o wide`
shows every word in full."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from finesched.cli import app
from finesched.commands.tables import Columns, col, event_time, print_table, shorten_middle

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BOX = re.compile(r"[\u2500-\u257f]")  # box-drawing characters: borders, not words
runner = CliRunner()


def words(text: str) -> list[str]:
    return [w for line in text.splitlines() for w in BOX.sub(" ", line).split()]


def shortened_from(word: str, whole: set[str]) -> bool:
    """Whether `word` is a word of `whole` shortened in its middle: its start, "…", its end."""
    head, sep, tail = word.partition("…")
    return bool(sep) and any(len(w) > len(word) - 1 and w.startswith(head) and w.endswith(tail) for w in whole)


def assert_readable(narrow: str, wide: str, width: int = 80) -> None:
    """Every line fits `width`; every word of `narrow` is a word of `wide`, or one shortened in its middle."""
    for line in narrow.splitlines():
        assert cell_len(line) <= width, f"{cell_len(line)} columns: {line!r}"
    whole = set(words(wide))
    for word in words(narrow):
        assert word in whole or shortened_from(word, whole), f"broken word {word!r}"
    assert "…" not in wide


def render(width: int, values: list[list[str]], headers: list[str], wide: bool) -> str:
    columns = Columns(*(col(h, wide=i == 1) for i, h in enumerate(headers)))
    table = columns.table("a title that is long enough to wrap in a narrow terminal somewhere", wide=wide)
    for row in values:
        columns.add_row(table, *row, wide=wide)
    console = Console(width=width, file=io.StringIO(), color_system=None)
    print_table(console, table, wide=wide)
    return console.file.getvalue()  # type: ignore[attr-defined]


WORD = st.text(alphabet="abcdefghij-/0123456789", min_size=1, max_size=40)
CELL = st.lists(WORD, min_size=0, max_size=6).map(" ".join)


@given(
    width=st.integers(40, 120),
    rows=st.lists(st.lists(CELL, min_size=4, max_size=4), min_size=1, max_size=5),
)
def test_no_word_is_ever_broken(width: int, rows: list[list[str]]) -> None:
    headers = ["workload", "tenant", "node", "placement / reason"]
    narrow, wide = render(width, rows, headers, False), render(width, rows, headers, True)
    assert_readable(narrow, wide, width)
    for row in rows:  # wide shows every value, the wide-only column included, unshortened
        for value in row:
            assert all(w in words(wide) for w in value.split())


def invoke(*args: str, columns: int = 80) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def narrow_and_wide(*args: str) -> None:
    narrow = invoke(*args)
    wide = invoke(*args, "-o", "wide", columns=80)
    assert_readable(narrow, wide)


def paths(*names: str) -> Iterable[str]:
    return [str(EXAMPLES / name) for name in names]


def test_plan_tables_fit_80_columns() -> None:
    narrow_and_wide("plan", *paths("cluster.yaml", "workloads.yaml"), "--show-nodes")
    narrow_and_wide("plan", "--waves", *paths("preemption-batch.yaml", "preemption-serving.yaml"))
    # the tenant column is there with -o wide only
    assert "tenant" not in invoke("plan", *paths("cluster.yaml", "workloads.yaml")).split("\n", 3)[2]
    assert "tenant" in invoke("plan", *paths("cluster.yaml", "workloads.yaml"), "-o", "wide")


def test_validate_and_job_tables_fit_80_columns() -> None:
    narrow = invoke("validate", *paths("cluster.yaml", "workloads.yaml"))
    assert_readable(narrow, invoke("validate", *paths("cluster.yaml", "workloads.yaml"), columns=400))
    job = paths("jobs/gpu-inference.yaml")
    narrow_and_wide("job", "plan", *job, "--cluster", *paths("cluster.yaml"))
    narrow_and_wide("job", "plan", *paths("jobs/named-groups.yaml"))


def test_event_times_are_short_in_tables_and_whole_with_wide() -> None:
    today = datetime.now(UTC).replace(hour=9, minute=5, second=7, microsecond=123456)
    assert event_time(today.isoformat(), wide=False) == "09:05:07"
    assert event_time("2020-01-31T23:59:00.5+02:00", wide=False) == "01-31 21:59"  # shown in UTC
    assert event_time("2020-01-31T23:59:00.5+02:00", wide=True) == "2020-01-31T23:59:00.5+02:00"
    assert event_time("not a time", wide=False) == "not a time"


@given(name=st.text(alphabet="abc-0123456789/", min_size=1, max_size=60), width=st.integers(1, 70))
def test_a_name_is_shortened_in_its_middle_keeping_its_end(name: str, width: int) -> None:
    short = shorten_middle(name, width)
    if len(name) <= width:
        assert short == name
        return
    head, sep, tail = short.partition("…")
    assert sep and len(short) == width and name.startswith(head) and name.endswith(tail)
    assert len(tail) >= len(head)  # the end, where numbered names differ, is kept at least as long


def test_slot_names_stay_apart_at_80_columns() -> None:
    slots = [f"team-a/clicks-region-0-{i}" for i in range(12)]
    rows = [[s, "Bound", "gpu-node-with-a-rather-long-name-1", "a reason that takes a fair part of the line"]
            for s in slots]  # fmt: skip
    narrow = render(80, rows, ["workload", "tenant", "node", "placement / reason"], False)
    shown = [w for w in words(narrow) if "region-0" in w or "gion" in w or ("…" in w and w[-1].isdigit())]
    assert len(set(shown)) >= len(slots)  # each slot's own word, whole or shortened: none looks like another
