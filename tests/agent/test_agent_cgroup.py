"""cgroup v1 enforcement on this machine (cpuset, memory, cpu), with real processes and the kernel.

Skipped, with the reason, where the agent cannot write a v1 cpuset and memory hierarchy (not root,
cgroup v2 only, a read-only /sys/fs/cgroup). Groups go below the test process's own cgroups and are
removed afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pool_probe import CPUS, command, pids
from test_agent_executor import binding, executor, node, run_to_end, wait_for

from finesched.agent.cgroup import detect
from finesched.agent.cgroup_groups import Group
from finesched.agent.executor import OOM_KILLED, Executor
from reachable import SYSTEM_PYTHON

MiB = 2**20


@pytest.fixture
def ex(tmp_path: Path, work_root: Path) -> Any:
    support = detect()
    v1 = {c for h in support.usable if h.version == 1 for c in h.controllers}
    if not {"cpuset", "memory"} <= v1:
        pytest.skip(f"cgroup v1 cpuset and memory are not writable here: {support.describe()}")
    made = executor(tmp_path / "data", work_root, support)
    yield made
    made.sync([], node())
    wait_for(lambda: made.sweep() == 0, "the workloads' cgroups to be removed")


def dirs(ex: Executor, key: str) -> dict[str, Path]:
    group = Group.from_record(ex.state.records[key].cgroup)
    assert group is not None
    return {controller: Path(path) for controller, path in group.controllers.items()}


def member_of(pid: int, group: Path) -> bool:
    return str(pid) in (group / "cgroup.procs").read_text().split()


def test_running_workload_is_confined_and_its_children_inherit(ex: Executor, exchange: Path) -> None:
    cpu = CPUS[-1]
    spec = {"requests": {"cpu": "1", "memory": "96Mi"}, "limits": {"cpu": "1", "memory": "96Mi"}}
    pinned = binding("pinned", command(exchange / "pinned"), cpuset=str(cpu), numa=[{"numa": 0}], qos="LSR", spec=spec)
    ex.sync([pinned], node())
    main, child = pids(exchange / "pinned")
    where = dirs(ex, "team/pinned")
    assert (where["cpuset"] / "cpuset.cpus").read_text().strip() == str(cpu)
    assert (where["cpuset"] / "cpuset.mems").read_text().strip() == "0"
    assert (where["memory"] / "memory.limit_in_bytes").read_text().strip() == str(96 * MiB)
    for pid in (main, child):  # the command and the process it started are in every group
        assert all(member_of(pid, d) for d in where.values()), pid
        assert f"{where['cpuset']}".endswith(Path(f"/proc/{pid}/cpuset").read_text().strip())
    if "cpu" in where:
        assert (where["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "-1"  # LSR owns its CPU: no quota
    info = ex.state.records["team/pinned"].info["cgroup"]
    assert info["cpuset.cpus"] == str(cpu) and info["memory.limit_in_bytes"] == str(96 * MiB)


def test_ls_workload_gets_its_cpu_limit_as_a_quota(ex: Executor) -> None:
    spec = {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m", "memory": "128Mi"}}
    ex.sync([binding("shared", ["sleep", "600"], spec=spec)], node())
    where = dirs(ex, "team/shared")
    if "cpu" not in where:
        pytest.skip("no writable v1 cpu controller here")
    assert (where["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (where["cpu"] / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (where["cpu"] / "cpu.shares").read_text().strip() == "102"  # 100m, as kubelet computes shares


def test_workload_over_its_memory_limit_ends_oomkilled(ex: Executor) -> None:
    hog = [SYSTEM_PYTHON, "-c", "x = b'1' * (256 << 20); print('not killed')"]
    ex.sync([binding("hog", hog, spec={"limits": {"memory": "48Mi"}})], node())
    where = dirs(ex, "team/hog")
    assert (where["memory"] / "memory.limit_in_bytes").read_text().strip() == str(48 * MiB)
    run_to_end(ex, "team/hog")
    rec = ex.state.records["team/hog"]
    assert (rec.phase, rec.reason, rec.exit_code) == ("Failed", OOM_KILLED, 137)
    assert "OOM killer ended 1 process(es) at the memory limit of 50331648 bytes" in rec.info["oom"]
    final = ex.server.of("status")[-1]
    assert final[1:4] == ("team/hog", "Failed", 137) and final[5] == "OOMKilled" and final[4]["oom"] == rec.info["oom"]
    wait_for(lambda: ex.sweep() == 0 and not any(d.exists() for d in where.values()), "its groups to go")
