"""The README's dataflow example runs as written and says what the compiler computes."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_dataflow_example_runs_and_its_figures_hold() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    example = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "compile_job(" in b)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        namespace: dict[str, object] = {}
        exec(compile(example, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    c = namespace["c"]
    assert c.slots_needed == 11 and c.component_slots == 6  # type: ignore[attr-defined]
    assert c.slot_requests["io"]["network"] == 2**20  # type: ignore[attr-defined]
    assert c.fractions["feature-state"] == (0.0, 0.75)  # type: ignore[attr-defined]
    assert len(namespace["workloads"]) == 11  # type: ignore[arg-type]
    assert "11 slots (over groups; over connected components: 6)" in text
