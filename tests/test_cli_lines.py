"""YAML errors name the document and the line of the field itself, and every `--help` wraps cleanly
in 80 columns (no word broken, no line longer, summaries not cut where the docstring's lines end)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from finesched.cli import app
from finesched.model.manifest import field_line, parse_document_nodes

runner = CliRunner()
BOX = re.compile(r"[\u2500-\u257f]")
TWO_DOCUMENTS = """\
# two workloads; the second has three mistakes
apiVersion: finesched.io/v1alpha1
kind: Workload
metadata: {name: good, namespace: default}
spec:
  requests: {cpu: "1"}
---
apiVersion: finesched.io/v1alpha1
kind: Workload
metadata:
  name: bad
  namespace: default
spec:
  requests:
    memory: 1Gi
    koordinator.sh/gpu-core: 50
    cpu: abc
  nodeAffinity:
    required:
      - matchExpressions:
          - {key: zone, operator: In, values: [a]}
          - {key: zone, operator: Sideways}
  bogus: 3
"""
#: (field path, its line) in TWO_DOCUMENTS' second document: a key with dots, list items, a missing
#: field (the line of the nearest field above it).
LINES = [
    ("spec.requests.cpu", 17),
    ("spec.requests.koordinator.sh/gpu-core", 16),
    ("spec.nodeAffinity.required[0].matchExpressions[1].operator", 22),
    ("spec.nodeAffinity.required[0].matchExpressions[1]", 22),
    ("spec.bogus", 23),
    ("spec.requests.nvidia.com/gpu", 14),
    ("metadata", 10),
    ("", 8),
]


@pytest.mark.parametrize(("path", "line"), LINES)
def test_a_field_path_finds_its_own_line(path: str, line: int) -> None:
    (_, first), (_, second) = parse_document_nodes(TWO_DOCUMENTS)
    assert field_line(second, path) == line
    assert field_line(first, "spec.requests.cpu") == 6


def test_validate_names_the_document_and_the_fields_line(tmp_path: Path) -> None:
    bad = tmp_path / "two.yaml"
    bad.write_text(TWO_DOCUMENTS)
    result = runner.invoke(app, ["validate", str(bad)], env={"COLUMNS": "80"})
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f'error: {bad} doc 2, line 17: spec.requests.cpu: "abc" is not a quantity' in result.stderr
    assert f"error: {bad} doc 2, line 23: spec.bogus: unknown field" in result.stderr
    assert f"error: {bad} doc 2, line 18: spec.nodeAffinity:" in result.stderr  # the model refuses it whole
    assert all(" doc 2, line " in e for e in errors), errors  # never the first line, never document 1
    as_json = tmp_path / "two.json"  # a JSON file: the same, on its lines
    doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Workload", "metadata": {"name": "w"},
           "spec": {"requests": {"cpu": "abc"}}}  # fmt: skip
    as_json.write_text(json.dumps([doc], indent=1))
    result = runner.invoke(app, ["validate", str(as_json)])
    line = 1 + as_json.read_text().splitlines().index('    "cpu": "abc"')
    assert f"{as_json} doc 1, line {line}: spec.requests.cpu" in result.stderr


def test_admission_errors_name_their_line_too(tmp_path: Path) -> None:
    """What only admission finds (a device request rule, a namespace nobody owns) is placed likewise."""
    path = tmp_path / "admit.yaml"
    path.write_text(TWO_DOCUMENTS.split("  nodeAffinity:")[0].replace("    cpu: abc\n", ""))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    assert f"{path} doc 2, line 14: spec.requests:" in result.stderr and "gpu-core" in result.stderr
    path.write_text(TWO_DOCUMENTS.split("---")[0].replace("namespace: default", "namespace: nobodys"))
    result = runner.invoke(app, ["validate", str(path)])
    assert f"{path} doc 1, line 4: metadata.namespace" in result.stderr  # a warning, on its line


def _commands() -> list[list[str]]:
    def walk(command: Any, path: list[str]) -> list[list[str]]:
        found = [path]
        if hasattr(command, "commands"):  # a group (typer's own click)
            for name, sub in command.commands.items():
                found += walk(sub, [*path, name])
        return found

    return walk(typer.main.get_command(app), [])


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "finesched")
def test_help_wraps_cleanly_in_80_columns(path: list[str]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    shown = set(BOX.sub(" ", result.output).split())
    shown_params = [p for p in command.params if not getattr(p, "hidden", False)]
    texts = [command.help or "", *(getattr(p, "help", None) or "" for p in shown_params)]
    broken = [w for text in texts for w in text.split() if w not in shown and w.strip("`*") not in shown]
    assert broken == [], broken  # every word of the help text shown whole
    # the description above the panels: each paragraph wraps to the width, not where its docstring's lines end
    description = lines[: next((i for i, line in enumerate(lines) if line.startswith("╭─")), len(lines))]
    for above, below in itertools.pairwise(description):
        if not above.strip() or not below.strip() or below.startswith("  ") or above.lstrip().startswith("Usage:"):
            continue  # a paragraph's end, or a line laid out by hand (indented)
        assert len(above.rstrip()) + 1 + len(below.split()[0]) > 79, (above, below)
    # a group's list of commands: each summary wraps to the width, not where its docstring's lines end
    panel = lines[next((i for i, line in enumerate(lines) if line.startswith("╭─ Commands")), len(lines)) :]
    rows = [BOX.sub(" ", line) for line in panel[1 : next((i for i, ln in enumerate(panel) if ln.startswith("╰")), 0)]]
    for above, below in itertools.pairwise(rows):
        if above[:15].strip() or below[:15].strip() != "" or not below.strip():
            continue
        first = below.split()[0]
        assert len(above.rstrip()) + 1 + len(first) > 78, (above, below)
