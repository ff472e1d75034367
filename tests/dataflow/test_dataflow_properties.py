"""What must hold for every job (hypothesis): regions partition the tasks, pipelined edges never cross a
region, the blocking region graph has no cycle, subtask regions refine task regions, every task is in
exactly one group, and the slot count is the sum of the groups' largest parallelism."""

from __future__ import annotations

from typing import Any

from dataflow_builders import make_job, task
from hypothesis import given
from hypothesis import strategies as st

from finesched.dataflow import compile_job
from finesched.model.job import find_cycle


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 9))
    tasks = [task(f"t{i}", p=draw(st.integers(1, 4))) for i in range(n)]
    edges = []
    for b in range(1, n):
        for a in range(b):  # a < b: always a DAG
            if draw(st.integers(0, 3)) == 0:
                kind = draw(st.sampled_from(["pipelined", "blocking"]))
                pattern = draw(st.sampled_from(["all-to-all", "pointwise"]))
                edges.append({"from": f"t{a}", "to": f"t{b}", "type": kind, "pattern": pattern})
    return {"tasks": tasks, "edges": edges, "mode": draw(st.sampled_from(["streaming", "batch"]))}


@given(jobs())
def test_compiled_job_invariants(spec: dict[str, Any]) -> None:
    c = compile_job(make_job(spec["tasks"], spec["edges"], mode=spec["mode"]))
    ids = [t["id"] for t in spec["tasks"]]
    # regions partition the tasks
    assert sorted(t for r in c.regions for t in r) == sorted(ids)
    region_of = {t: k for k, r in enumerate(c.regions) for t in r}
    # a pipelined edge never crosses regions
    assert all(region_of[e["from"]] == region_of[e["to"]] for e in spec["edges"] if e["type"] == "pipelined")
    # regions can run in some order: the graph of edges between regions has no cycle
    between = {(region_of[e["from"]], region_of[e["to"]]) for e in spec["edges"]}
    region_ids = [str(k) for k in range(len(c.regions))]
    assert find_cycle(region_ids, [(str(a), str(b)) for a, b in between if a != b]) == []
    # every subtask region lies inside one task region
    for sub in c.subtask_regions():
        assert len({region_of[t] for t, _ in sub}) == 1
    # groups partition the tasks; slots = Σ max parallelism per group
    assert sorted(t for g in c.groups.values() for t in g) == sorted(ids)
    parallelism = {t["id"]: t["parallelism"] for t in spec["tasks"]}
    assert c.slots_needed == sum(max(parallelism[t] for t in g) for g in c.groups.values())
    # without user groups a group is a region
    assert sorted(map(sorted, c.groups.values())) == sorted(map(sorted, c.regions))
