"""The documentation's Python blocks marked runnable run as written, and say what they compute."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from docs_pages import ROOT, page_text, run_block, runnable_blocks

FINESCHED = [sys.executable, "-m", "finesched.cli"]


def finesched(*args: str, home: Path) -> str:
    """Run the CLI as a reader does (a real process), with HOME at `home`; its stdout."""
    env = {**os.environ, "HOME": str(home), "COLUMNS": "80"}
    done = subprocess.run([*FINESCHED, *args], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"finesched {' '.join(args)}: {done.stderr}"
    return done.stdout


def default_store(home: Path) -> str:
    """The store `finesched up` keeps under HOME, with an admin token in it (what backups.md copies)."""
    url = f"sqlite:///{home}/.local/share/finesched/finesched.db"
    finesched("token", "create", "--db", url, "--role", "admin", "--description", "docs", home=home)
    return url


def test_the_pages_mark_their_examples_runnable() -> None:
    marked = {page for page, _ in runnable_blocks()}
    assert {"reference/python-api.md", "concepts/dataflow.md", "concepts/cpus-and-numa.md"} <= marked
    assert "operations/backups.md" in marked


@pytest.mark.parametrize(("page", "code"), runnable_blocks(), ids=lambda v: v if v.endswith(".md") else "")
def test_every_runnable_block_runs(page: str, code: str, tmp_path: Path) -> None:
    default_store(tmp_path)
    run_block(page, code, tmp_path)


def test_the_python_api_example_places_a_workload(tmp_path: Path) -> None:
    code = next(c for p, c in runnable_blocks() if p == "reference/python-api.md" and "Scheduler(" in c)
    namespace = run_block("reference/python-api.md", code, tmp_path)
    assert namespace["binding"].node


def test_the_dataflow_example_runs_and_its_figures_hold(tmp_path: Path) -> None:
    code = next(c for p, c in runnable_blocks() if p == "concepts/dataflow.md" and "compile_job(" in c)
    namespace = run_block("concepts/dataflow.md", code, tmp_path)
    c = namespace["c"]
    assert c.slots_needed == 11 and c.component_slots == 6
    assert c.slot_requests["io"]["network"] == 2**20
    assert c.fractions["feature-state"] == (0.0, 0.75)
    assert len(namespace["workloads"]) == 11
    assert "11 slots (over groups; over connected components: 6)" in page_text("concepts/dataflow.md")


def test_the_backup_is_a_store_with_the_same_tokens(tmp_path: Path) -> None:
    """The copy backups.md makes opens as a store, at the source's revision, with its tokens."""
    url = default_store(tmp_path)
    code = next(c for p, c in runnable_blocks() if p == "operations/backups.md")
    run_block("operations/backups.md", code, tmp_path)
    copy = tmp_path / "finesched-backup.db"
    assert copy.stat().st_mode & 0o077 == 0  # private, as the page says
    listed = finesched("token", "list", "--db", f"sqlite:///{copy}", "-o", "json", home=tmp_path)
    assert listed == finesched("token", "list", "--db", url, "-o", "json", home=tmp_path)
    assert '"docs"' in listed


def test_the_public_api_sequence_runs_verbatim() -> None:
    """The public API sequence as issue 3 writes it: the same workloads through one, batch and queue."""
    from finesched import ClusterState, FitError, Scheduler, load_manifests

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        m = load_manifests("examples/cluster.yaml", "examples/workloads.yaml")
    finally:
        os.chdir(cwd)
    state = ClusterState.from_nodes(m.nodes)
    sched = Scheduler(state, profile="default", tenants=m.tenants)
    binding = sched.schedule_one(m.workloads[0])
    results = sched.schedule_batch(m.workloads)
    assert len(results) == len(m.workloads) and results[0] is binding
    failed = [r.workload for r in results if isinstance(r, FitError)]
    sched.submit(m.workloads)
    retried = sched.run()
    assert sorted(r.workload for r in retried) == sorted(failed)  # only the unplaced ones were queued
    sched.release(binding)
    state.check_invariants()
