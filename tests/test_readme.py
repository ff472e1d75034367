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
