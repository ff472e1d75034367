"""The README's Python example runs as written (from the repository root)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_example_runs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "load_manifests(" in b and "Scheduler(" in b)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        namespace: dict[str, object] = {}
        exec(compile(example, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["binding"].node  # type: ignore[attr-defined]
