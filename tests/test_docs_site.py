"""The documentation site builds with `mkdocs build --strict` (a broken link or any warning fails it),
and its Reference pages hold what the code has: every manifest kind, CLI command, API operation and
metric."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from docs_pages import DOCS, ROOT
from finesched.cli import app
from finesched.model.manifest import KINDS

sys.path.insert(0, str(ROOT / "scripts"))
from docs_reference import openapi_document

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*MKDOCS, "-f", str(config), "-d", str(site)], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr
    return out


def commands(group: typer.core.TyperGroup, path: str) -> list[str]:
    found = []
    for name, command in group.commands.items():
        if not command.hidden:
            found.append(f"{path} {name}")
            if hasattr(command, "commands"):
                found += commands(command, f"{path} {name}")
    return found


def test_every_page_of_docs_is_built(site: Path) -> None:
    for page in DOCS.rglob("*.md"):
        assert (site / page.relative_to(DOCS).with_suffix(".html")).is_file(), page


def test_the_reference_lists_every_kind_command_operation_and_metric(site: Path) -> None:
    manifests = (site / "reference/manifests.html").read_text()
    for kind in KINDS:
        assert f'id="{kind.lower()}"' in manifests, kind
    cli = (site / "reference/cli.html").read_text()
    every = commands(typer.main.get_command(app), "finesched")  # type: ignore[arg-type]
    assert "finesched token create" in every and "finesched sim fill" in every
    for command in every:
        assert f">{command}<" in cli, command
    api = (site / "reference/http-api.html").read_text()
    operations = [f"{m.upper()} {path}" for path, ops in openapi_document()["paths"].items() for m in ops]
    assert {"GET /v1/workloads", "POST /v1/plan", "GET /metrics"} <= set(operations)
    for operation in operations:
        assert f">{operation}<" in api, operation
    metrics = (site / "reference/metrics.html").read_text()
    for name in ("finesched&#95;queue&#95;depth", "finesched&#95;http&#95;requests&#95;total"):
        assert name in metrics, name
    assert (site / "benchmarks.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    (docs / "concepts/queue.md").write_text("[gone](no-such-page.md)\n", encoding="utf-8")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("- scripts/docs_reference.py", f"- {ROOT / 'scripts/docs_reference.py'}")
    (tmp_path / "mkdocs.yml").write_text(config, encoding="utf-8")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
