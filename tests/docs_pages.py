"""The documentation as tests read it: README.md and every page under docs/, their code blocks, and
the Python blocks a page marks as runnable (a line `<!-- runnable -->` just above the block)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUNNABLE = re.compile(r"^<!-- runnable -->\n```python\n(.*?)```", flags=re.S | re.M)


def pages() -> list[Path]:
    """README.md, then docs/**/*.md in path order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def page_text(name: str) -> str:
    """One page by its path under docs/ (`concepts/dataflow.md`) or `README.md`."""
    path = ROOT / name if name == "README.md" else DOCS / name
    return path.read_text(encoding="utf-8")


def all_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in pages())


def runnable_blocks() -> list[tuple[str, str]]:
    """(page, code) of every block marked runnable, in page order."""
    return [
        (p.relative_to(DOCS).as_posix(), block)
        for p in sorted(DOCS.rglob("*.md"))
        for block in RUNNABLE.findall(p.read_text(encoding="utf-8"))
    ]


def run_block(page: str, code: str, where: Path) -> dict[str, Any]:
    """Run a page's block as a reader would, in `where` (with the repository's `examples/` there and
    HOME pointing at it), and return its names. The working directory, HOME and umask are restored."""
    examples = where / "examples"
    if not examples.exists():
        examples.symlink_to(ROOT / "examples")
    cwd, home, umask = os.getcwd(), os.environ.get("HOME"), os.umask(0o022)
    os.umask(umask)
    os.chdir(where)
    os.environ["HOME"] = str(where)
    try:
        namespace: dict[str, Any] = {}
        exec(compile(code, f"docs/{page}", "exec"), namespace)
        return namespace
    finally:
        os.chdir(cwd)
        os.umask(umask)
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
