"""The executor keeps running workloads in their S3.2 pools, with real processes on this machine.

Every check reads the threads' ``Cpus_allowed_list`` from /proc (pool_probe.py). Each test runs
with CPU affinity only and, where this machine has a writable cpuset controller, with cgroups too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from pool_probe import CPUS, all_on, command, pids
from test_agent_executor import binding, executor, node, wait_for

from finesched.agent.binding import AgentBinding, BindingError, parse_binding
from finesched.agent.cgroup import CgroupSupport, detect
from finesched.agent.cgroup_groups import Group
from finesched.agent.executor import Executor
from finesched.cpuset import CPUSet
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS
from reachable import SYSTEM_PYTHON

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
ALL, FIRST, REST = CPUSet(CPUS).format(), str(CPUS[0]), CPUSet(CPUS[1:]).format()
LS = {"requests": {"cpu": "100m"}}
WHOLE = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}


def support(mode: str) -> CgroupSupport:
    if mode == "affinity":
        return CgroupSupport(None, reason="test")
    found = detect()
    if "cpuset" not in found.controllers:
        pytest.skip(f"no writable cpuset controller here: {found.describe()}")
    return found


@pytest.fixture(params=["affinity", "cgroup"])
def ex(request: pytest.FixtureRequest, tmp_path: Path, work_root: Path) -> Any:
    made = executor(tmp_path / "data", work_root, support(request.param))
    yield made
    made.sync([], node())  # stops every workload and drops its groups
    wait_for(lambda: made.sweep() == 0, "the workloads' cgroups to be removed")


def acked(b: AgentBinding) -> AgentBinding:
    return parse_binding({**b.raw, "acked": True, "workloadSpec": dict(b.spec)})


def group_cpus(ex: Executor, key: str) -> str | None:
    group = Group.from_record(ex.state.records[key].cgroup)
    if group is None or "cpuset" not in group.controllers:
        return None
    return (Path(group.controllers["cpuset"]) / "cpuset.cpus").read_text().strip()


def test_lse_starts_at_once_and_ls_be_move_out_then_grow_back(ex: Executor, exchange: Path) -> None:
    ls = binding("web", command(exchange / "web"), spec=LS)
    be = binding("batch", command(exchange / "batch"))
    ex.sync([ls, be], node())
    web, batch = pids(exchange / "web"), pids(exchange / "batch")
    assert all_on(web) == all_on(batch) == {ALL}
    ls, be = acked(ls), acked(be)

    lse = binding("db", ["sleep", "600"], cpuset=FIRST, qos="LSE", spec=WHOLE)
    ex.sync([ls, be, lse], node())  # one pass: the LS and BE threads move, then the LSE starts
    assert ex.server.of("reject") == [] and ex.state.records["team/db"].phase == "Running"
    assert all_on(web) == all_on(batch) == {REST}  # BE pool = CPUs not held by LSE
    assert ex.state.records["team/web"].pool == "shared pool"
    if group_cpus(ex, "team/web") is not None:
        assert group_cpus(ex, "team/web") == group_cpus(ex, "team/batch") == REST
    ex.report()
    moved = [c for c in ex.server.of("status") if c[1] == "team/web"][-1]
    assert moved[2] == "Running" and moved[4]["cpuset"] == REST  # the server hears of the move

    ex.sync([ls, be], node())  # the LSE is gone: LS and BE grow back
    assert all_on(web) == all_on(batch) == {ALL}
    if group_cpus(ex, "team/web") is not None:
        assert group_cpus(ex, "team/web") == ALL


def test_be_keeps_lsr_cpus_and_ls_grows_back_when_the_lsr_ends(ex: Executor, exchange: Path) -> None:
    go = exchange / "go"
    ls = binding("web", command(exchange / "web"), spec=LS)
    be = binding("batch", command(exchange / "batch"))
    waits = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"
    lsr = binding("cache", [SYSTEM_PYTHON, "-c", waits], cpuset=FIRST, qos="LSR", spec=WHOLE)
    ex.sync([ls, be, lsr], node())
    web, batch = pids(exchange / "web"), pids(exchange / "batch")
    assert all_on(web) == {REST} and all_on(batch) == {ALL}  # LSR CPUs are shared with BE only
    go.touch()

    def ended() -> bool:
        ex.poll()
        return ex.state.records["team/cache"].phase != "Running"

    wait_for(ended, "the LSR workload to end")
    assert all_on(web) == {ALL}  # its CPU is back in the shared pool at once


def test_adopted_workloads_are_put_back_in_their_pools(tmp_path: Path, work_root: Path, exchange: Path) -> None:
    """An agent killed in the middle of a move: the restarted one finishes it before starting the LSE."""
    data = tmp_path / "data"
    first = executor(data, work_root)
    ls = binding("web", command(exchange / "web"), spec=LS)
    first.sync([ls], node())
    web = pids(exchange / "web")
    os.sched_setaffinity(web[0], {CPUS[1]})  # half moved when the agent died
    del first

    second = executor(data, work_root)
    assert second.adopt() == {"team/web": f"adopted pid {second.state.records['team/web'].pid}"}
    lse = binding("db", ["sleep", "600"], cpuset=FIRST, qos="LSE", spec=WHOLE)
    try:
        second.sync([acked(ls), lse], node())
        assert all_on(web) == {REST} and second.state.records["team/db"].phase == "Running"
        second.sync([acked(ls)], node())
        assert all_on(web) == {ALL}  # every thread, the one left on CPU 1 too
    finally:
        second.sync([], node())


def test_the_periodic_check_fixes_stray_threads_and_keeps_narrower_ones(
    tmp_path: Path, work_root: Path, exchange: Path
) -> None:
    ex = executor(tmp_path / "data", work_root)
    ex.keeper.recheck_s = 0.0
    lse = binding("db", ["sleep", "600"], cpuset=FIRST, qos="LSE", spec=WHOLE)
    ls = binding("web", command(exchange / "web"), spec=LS)
    try:
        ex.sync([lse, ls], node())
        main, child = pids(exchange / "web")
        os.sched_setaffinity(child, set(CPUS))  # escaped its pool (say, forked during a move)
        ex.poll()
        assert all_on([main, child]) == {REST}
        ex.sync([acked(lse)], node())  # the LS binding ends; back to one workload
        ex.sync([], node())
        ls2 = binding("web2", command(exchange / "web2"), spec=LS)
        ex.sync([ls2], node())
        main, _ = pids(exchange / "web2")
        task = sorted(int(t) for t in os.listdir(f"/proc/{main}/task"))[-1]
        os.sched_setaffinity(task, {CPUS[1]})  # the workload pinned one of its threads inside its pool
        ex.poll()
        assert CPUSet(os.sched_getaffinity(task)) == CPUSet([CPUS[1]])
    finally:
        ex.sync([], node())


def test_the_pools_report_says_where_each_workload_runs(ex: Executor) -> None:
    lsr = binding("cache", ["sleep", "600"], cpuset=FIRST, qos="LSR", spec=WHOLE)
    ex.sync([lsr, binding("batch", ["sleep", "600"])], node())
    report = ex.pools_report(node())
    assert report["cpuSharedPools"] == [{"socket": 0, "node": 0, "cpuset": REST}]
    assert report["beCPUSharedPools"] == [{"socket": 0, "node": 0, "cpuset": ALL}]
    assert report["podCPUAllocs"] == [{"namespace": "team", "name": "cache", "cpuset": FIRST, "qos": "LSR"}]
    by_name = {w["name"]: (w["qos"], w["pool"], w["cpuset"]) for w in report["workloadCPUs"]}
    assert by_name == {"cache": ("LSR", "LSR cpuset", FIRST), "batch": ("BE", "BE pool", ALL)}


def test_constrained_burst_runs_in_its_numa_nodes_shared_pool(tmp_path: Path, work_root: Path) -> None:
    ex = executor(tmp_path / "data", work_root)
    status = json.dumps({"cpuSharedPools": [{"socket": 0, "node": 0}]})
    burst = binding("burst", ["sleep", "600"], spec=LS, annotations={ANNOTATION_RESOURCE_STATUS: status})
    lsr = binding("cache", ["sleep", "600"], cpuset=FIRST, qos="LSR", spec=WHOLE)
    try:
        ex.sync([lsr, burst], node())
        rec = ex.state.records["team/burst"]
        assert (rec.pool, rec.cpuset) == ("shared pool of NUMA node 0", REST)
    finally:
        ex.sync([], node())
    with pytest.raises(BindingError, match=re.escape(f"annotations.{ANNOTATION_RESOURCE_STATUS}")):
        binding("bad", ["true"], annotations={ANNOTATION_RESOURCE_STATUS: "{not json"})
