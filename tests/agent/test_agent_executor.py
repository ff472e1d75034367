"""The Deploy Executor with real child processes and a recording stand-in for the server.

Run as root, the workloads run as a uid of the agent's range (tenant "team"): they run system
programs and write what they saw to an exchange directory (reachable.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from finesched.agent.binding import AgentBinding, parse_binding
from finesched.agent.cgroup import CgroupSupport, detect
from finesched.agent.cgroup_groups import Limits, make_group
from finesched.agent.discover import Discovery
from finesched.agent.executor import MAX_REASON, UNKNOWN_AFTER_RESTART, Executor, ServerError
from finesched.agent.launch import gpu_env
from finesched.agent.names import safe_name
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from reachable import SYSTEM_PYTHON

CPUS = sorted(os.sched_getaffinity(0))
NO_CGROUP = CgroupSupport(None, reason="test")
# The child writes its affinity and environment to the file named by its first argument.
PROBE = (
    "import json, os, sys; "
    "json.dump({'affinity': sorted(os.sched_getaffinity(0)), 'env': dict(os.environ)}, open(sys.argv[1], 'w'))"
)


class RecordingServer:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_status = 0

    def ack(self, workload: str, object_uid: str = "") -> None:
        self.calls.append(("ack", workload))

    def reject(self, workload: str, reason: str, object_uid: str = "") -> None:
        self.calls.append(("reject", workload, reason))

    def status(
        self, workload: str, phase: str, reason: str, exit_code: int | None, info: dict[str, Any], object_uid: str = ""
    ) -> None:
        if self.fail_status:
            raise ServerError(self.fail_status, "down")
        self.calls.append(("status", workload, phase, exit_code, info, reason))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == kind]


def node(gpus: int = 0, unhealthy: tuple[int, ...] = ()) -> Discovery:
    devices = [
        {
            "type": "gpu",
            "minor": i,
            "uuid": f"GPU-{i}",
            "health": i not in unhealthy,
            "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "16Gi"},
        }
        for i in range(gpus)
    ]
    cpus = [{"id": c, "core": c, "socket": 0, "numa": 0} for c in CPUS]
    n = Node.model_validate({"name": "n1", "cpuTopology": {"cpus": cpus}, "devices": devices})
    return Discovery(node=n, online=CPUSet(CPUS))


def binding(name: str, command: list[str], cpuset: str = "", version: int = 1, **extra: Any) -> AgentBinding:
    item = {"workload": f"team/{name}", "node": "n1", "cpuset": cpuset, "version": version, "acked": False}
    spec = {"command": command, "env": {"GREETING": "hi", "NVIDIA_VISIBLE_DEVICES": "all"}, **extra.pop("spec", {})}
    item.update(extra)
    item["workloadSpec"] = spec
    return parse_binding(item)


def gpu(minor: int) -> dict[str, Any]:
    return {"devices": {"gpu": [{"minor": minor, "resources": {"gpu-core": 100}}]}}


def wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_to_end(ex: Executor, key: str) -> None:
    def ended() -> bool:
        ex.poll()
        return ex.state.records[key].phase != "Running"

    wait_for(ended, f"{key} to end")
    ex.report()


def executor(data: Path, work: Path, cgroups: CgroupSupport = NO_CGROUP, **kwargs: Any) -> Executor:
    """An executor whose workloads' working directories go under `work` (the `work_root` fixture)."""
    return Executor(data, RecordingServer(), cgroups, work_root=work, **kwargs)


@pytest.fixture
def ex(tmp_path: Path, work_root: Path) -> Executor:
    return executor(tmp_path / "data", work_root)


def test_child_runs_pinned_with_env_and_succeeds(ex: Executor, exchange: Path) -> None:
    out = exchange / "probe.json"
    b = binding("p", [SYSTEM_PYTHON, "-c", PROBE, str(out)], cpuset=str(CPUS[-1]))
    ex.sync([b], node())
    server = ex.server
    assert server.of("ack") == [("ack", "team/p")]
    ex.report()
    running = server.of("status")[0]
    assert running[2] == "Running" and running[4]["affinity"] == str(CPUS[-1])
    assert running[4]["cgroup"].startswith("unavailable: test")
    run_to_end(ex, "team/p")
    assert server.of("status")[-1][2:4] == ("Succeeded", 0)
    seen = json.loads(out.read_text())
    assert seen["affinity"] == [CPUS[-1]]
    env = seen["env"]
    assert env["GREETING"] == "hi" and env["FINESCHED_CPUSET"] == str(CPUS[-1])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "none" and env["CUDA_VISIBLE_DEVICES"] == ""  # the spec cannot widen
    assert json.loads(env["FINESCHED_BINDING"])["workload"] == "team/p"
    assert os.sched_getaffinity(0) == set(CPUS)  # the agent's own mask is restored


def test_failure_exit_code_and_log(ex: Executor) -> None:
    b = binding("f", [SYSTEM_PYTHON, "-c", "print('to the log'); raise SystemExit(3)"])
    ex.sync([b], node())
    run_to_end(ex, "team/f")
    final = ex.server.of("status")[-1]
    assert final[2:4] == ("Failed", 3)
    assert "to the log" in Path(final[4]["log"]).read_text()


def test_status_is_resent_after_a_server_error(ex: Executor) -> None:
    ex.sync([binding("r", ["true"])], node())
    ex.server.fail_status = 503
    run_to_end(ex, "team/r")
    assert ex.server.of("status") == []
    ex.server.fail_status = 0
    ex.report()
    assert [c[2] for c in ex.server.of("status")] == ["Succeeded"]  # Running was superseded


@pytest.mark.parametrize(
    ("kwargs", "discovery", "reason"),
    [
        pytest.param(gpu(1), node(2, unhealthy=(1,)), "gpu 1 is unhealthy", id="unhealthy-gpu"),
        pytest.param(gpu(5), node(2), "gpu 5 does not exist", id="missing-gpu"),
        pytest.param({"cpuset": "63"}, node(), "CPUs 63 are not online", id="offline-cpu"),
        pytest.param({"node": "other"}, node(), "binding is for node 'other'", id="wrong-node"),
    ],
)  # fmt: skip
def test_rejects_with_reason(ex: Executor, kwargs: dict[str, Any], discovery: Discovery, reason: str) -> None:
    b = binding("x", ["true"], **kwargs)
    ex.sync([b], discovery)
    (call,) = ex.server.calls
    assert call[0] == "reject" and reason in call[2]
    assert ex.state.records == {}


def test_exclusive_cpus_are_not_shared(ex: Executor) -> None:
    cpu = str(CPUS[0])
    first = binding("a", ["sleep", "30"], cpuset=cpu, qos="LSR")
    second = binding("b", ["true"], cpuset=cpu)
    ex.sync([first, second], node())
    assert ex.server.of("reject")[0][1:] == ("team/b", f"CPUs {cpu} are held by team/a (LSR cpuset)")
    ex.sync([], node())  # binding gone: the process is stopped and forgotten
    assert ex.state.records == {}


def test_a_rejection_does_not_name_another_namespaces_workload(ex: Executor) -> None:
    """The reason reaches the rejected workload's tenant: the holder of its CPUs stays unnamed."""
    cpu = str(CPUS[0])
    theirs = parse_binding({"workload": "other/secret-project", "node": "n1", "cpuset": cpu, "version": 1,
                            "acked": False, "qos": "LSR", "workloadSpec": {"command": ["sleep", "30"]}})  # fmt: skip
    ex.sync([theirs, binding("b", ["true"], cpuset=cpu)], node())
    ((_, key, reason),) = ex.server.of("reject")
    assert (key, reason) == ("team/b", f"CPUs {cpu} are held by a workload of another namespace (LSR cpuset)")
    ex.sync([], node())


def test_no_cpuset_runs_in_the_shared_pool(ex: Executor) -> None:
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    shared = binding("s", ["true"], spec={"requests": {"cpu": "100m"}})  # LS: a request and no limit
    ex.sync([binding("a", ["sleep", "30"], cpuset=str(CPUS[0]), qos="LSE"), shared], node())
    rec = ex.state.records["team/s"]
    assert CPUSet(rec.cpuset) == CPUSet(CPUS) - CPUSet([CPUS[0]])
    assert rec.info["pool"] == rec.pool == "shared pool"
    ex.sync([], node())


def test_restart_adopts_running_child_and_reports_its_end(tmp_path: Path, work_root: Path, exchange: Path) -> None:
    data, go = tmp_path / "data", exchange / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nraise SystemExit(4)"
    first = executor(data, work_root)
    b = binding("long", [SYSTEM_PYTHON, "-c", wait], cpuset=str(CPUS[0]))
    first.sync([b], node())
    first.report()
    pid = first.state.records["team/long"].pid
    del first  # the agent "crashes": nothing is stopped

    acked = parse_binding({**b.raw, "acked": True, "workloadSpec": dict(b.spec)})
    second = executor(data, work_root)
    assert second.adopt() == {"team/long": f"adopted pid {pid}"}
    second.sync([acked], node())
    assert second.server.calls == []  # known, acked, reported: nothing to do
    go.touch()
    run_to_end(second, "team/long")
    assert second.server.of("status")[-1][2:4] == ("Failed", 4)


def test_restart_reports_a_child_that_ended_while_down(tmp_path: Path, work_root: Path) -> None:
    data = tmp_path / "data"
    first = executor(data, work_root)
    first.sync([binding("quick", ["true"])], node())
    wait_for(lambda: first.procs["team/quick"].poll() is not None, "the child to exit")  # first never polls it
    second = executor(data, work_root)
    assert second.adopt() == {"team/quick": "Succeeded while the agent was down"}
    second.report()
    assert second.server.of("status")[0][2:4] == ("Succeeded", 0)


def test_acked_binding_unknown_after_restart_is_rejected(ex: Executor) -> None:
    b = parse_binding({"workload": "team/ghost", "node": "n1", "cpuset": "", "acked": True, "version": 2})
    ex.sync([b], node())
    assert ex.server.calls == [("reject", "team/ghost", UNKNOWN_AFTER_RESTART)]


def test_new_placement_replaces_the_process(ex: Executor) -> None:
    ex.sync([binding("v", ["sleep", "30"], cpuset=str(CPUS[0]), version=1)], node())
    old = ex.state.records["team/v"].pid
    acked = binding("v", ["sleep", "30"], cpuset=str(CPUS[0]), version=2, acked=True)
    ex.sync([acked], node())  # the ack bumped the version: same placement, same process
    assert ex.state.records["team/v"].pid == old and ex.server.of("reject") == []
    ex.sync([binding("v", ["sleep", "30"], cpuset=str(CPUS[-1]), version=1)], node())
    rec = ex.state.records["team/v"]
    assert rec.pid != old and rec.cpuset == str(CPUS[-1])
    ex.sync([binding("v", ["sleep", "30"], cpuset=str(CPUS[-1]), version=1)], node())  # rebound, not acked yet
    assert ex.state.records["team/v"].pid != rec.pid
    ex.sync([], node())


def test_shared_gpu_env() -> None:
    d = node(gpus=4)
    grants = {"gpu": [{"minor": 2, "resources": {"gpu-core": 50, "gpu-memory": "8Gi"}},
                      {"minor": 3, "resources": {"gpu-core": 50, "gpu-memory-ratio": 25}}]}  # fmt: skip
    env = gpu_env(binding("g", ["true"], devices=grants), d.node)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == str(8 * 2**30)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == str(4 * 2**30)  # 25% of 16Gi
    assert env["CUDA_DEVICE_SM_LIMIT"] == env["CUDA_DEVICE_SM_LIMIT_1"] == "50"
    whole = gpu_env(binding("w", ["true"], devices={"gpu": [{"minor": 0, "resources": {"gpu-core": 100}}]}), d.node)
    assert whole == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-0",
        "CUDA_VISIBLE_DEVICES": "GPU-0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def fake_mounts(tmp_path: Path, v2: str = "", v1: tuple[str, ...] = (), own: str = "/") -> tuple[Path, Path]:
    """A mountinfo naming a cgroup2 mount at tmp/cg (when `v2` lists its controllers) and v1
    mounts at tmp/cg/<controller>, and a /proc/self/cgroup placing the agent at `own` in each."""
    mount = tmp_path / "cg"
    lines, cgroup = [], []
    if v2:
        (mount / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (mount / own.lstrip("/") / "cgroup.controllers").write_text(v2 + "\n")
        lines.append(f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw")
        cgroup.append(f"0::{own}")
    for i, controller in enumerate(v1):
        where = mount / controller / own.lstrip("/")
        where.mkdir(parents=True, exist_ok=True)
        if controller == "cpuset":
            (where / "cpuset.cpus").write_text(",".join(map(str, CPUS)) + "\n")
            (where / "cpuset.mems").write_text("0\n")
        lines.append(f"{34 + i} 31 0:{31 + i} / {mount / controller} rw,relatime - cgroup cgroup rw,{controller}")
        cgroup.append(f"{i + 1}:{controller}:{own}")
    (tmp_path / "mountinfo").write_text("\n".join(["31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw", *lines]))
    (tmp_path / "proc-cgroup").write_text("\n".join(cgroup) + "\n")
    return tmp_path / "mountinfo", tmp_path / "proc-cgroup"


def test_cgroup_v2_files_in_a_fake_hierarchy(tmp_path: Path, work_root: Path) -> None:
    mountinfo, proc = fake_mounts(tmp_path, v2="cpuset cpu io memory pids", own="/agent.slice")
    support = detect(mountinfo, proc)
    (v2,) = support.usable
    assert (v2.version, v2.base, v2.controllers) == (
        2,
        tmp_path / "cg/agent.slice/finesched",
        {"cpuset", "memory", "cpu"},
    )
    ex = executor(tmp_path / "data", work_root, support)
    spec = {"requests": {"cpu": "250m"}, "limits": {"memory": "64Mi", "cpu": "500m"}}
    b = binding("c", ["sleep", "30"], cpuset=str(CPUS[0]), numa=[{"numa": 0}], spec=spec)
    ex.sync([b], node())
    group = v2.base / ex.scope / safe_name("team/c")
    assert (group / "cpuset.cpus").read_text() == str(CPUS[0])
    assert (group / "cpuset.mems").read_text() == "0"
    assert (group / "memory.max").read_text() == str(64 * 2**20)
    assert (group / "cpu.max").read_text() == "50000 100000"  # a pinned LS workload with a CPU limit: quota
    info = ex.state.records["team/c"].info["cgroup"]
    assert info["memory.max"] == str(64 * 2**20) and info["cgroup.procs"] == str(ex.state.records["team/c"].pid)
    ex.sync([], node())


def test_cgroup_v1_files_in_a_fake_hierarchy(tmp_path: Path, work_root: Path) -> None:
    mountinfo, proc = fake_mounts(tmp_path, v1=("cpuset", "memory", "cpu"), own="/svc")
    support = detect(mountinfo, proc)
    assert {h.version for h in support.usable} == {1} and support.controllers == {"cpuset", "memory", "cpu"}
    ex = executor(tmp_path / "data", work_root, support)
    spec = {"requests": {"cpu": "1", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "32Mi"}}
    ex.sync([binding("x", ["sleep", "30"], cpuset=str(CPUS[0]), qos="LSE", spec=spec)], node())
    name = f"{ex.scope}/{safe_name('team/x')}"
    cpuset, memory, cpu = (tmp_path / "cg" / c / "svc/finesched" / name for c in ("cpuset", "memory", "cpu"))
    assert (cpuset / "cpuset.cpus").read_text() == str(CPUS[0])
    assert (cpuset / "cpuset.mems").read_text() == "0"  # every v1 cpuset level gets its parent's memory nodes
    assert (cpuset.parent / "cpuset.cpus").read_text() == ",".join(map(str, CPUS))
    assert (memory / "memory.limit_in_bytes").read_text() == str(32 * 2**20)
    assert not (memory / "memory.memsw.limit_in_bytes").exists()  # written only where the kernel has it
    assert (cpu / "cpu.shares").read_text() == "1024" and not (cpu / "cpu.cfs_quota_us").exists()  # LSE: no quota
    stale = cpuset.parent / "team.gone-0123"  # a group its workload's end could not remove (unreaped zombie)
    stale.mkdir()
    assert ex.sweep() == 0 and not stale.exists() and cpuset.is_dir()  # the running workload's group stays
    ex.sync([], node())


def test_no_cgroup_is_reported(tmp_path: Path) -> None:
    support = detect(tmp_path / "no-mountinfo", tmp_path / "none")
    assert not support.available and support.describe().startswith("unavailable: no cgroup hierarchy is mounted")
    assert support.describe().endswith("CPU affinity only")


def test_a_long_reject_reason_is_cut_to_what_the_server_takes(ex: Executor) -> None:
    grants = {"gpu": [{"minor": m, "resources": {"gpu-core": 100}} for m in range(1000)]}
    ex.sync([binding("many", ["true"], devices=grants)], node())
    (call,) = ex.server.of("reject")
    assert len(call[2]) <= MAX_REASON and call[2].startswith("gpu 0 does not exist") and "more characters)" in call[2]


def test_cpus_outside_a_confined_agent_are_rejected(ex: Executor) -> None:
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    ex.allowed = CPUSet([CPUS[0]])  # as if the agent itself ran in a one-CPU cpuset
    ex.sync([binding("o", ["true"], cpuset=str(CPUS[1]))], node())
    (call,) = ex.server.calls
    assert call[0] == "reject" and f"CPUs {CPUS[1]} are outside the agent's own CPU affinity {CPUS[0]}" in call[2]


def test_a_corrupt_state_file_stops_the_agent_with_a_clear_error(tmp_path: Path, work_root: Path) -> None:
    (tmp_path / "agent-state.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"agent-state\.json is unreadable .*move it away to start afresh"):
        executor(tmp_path, work_root)


def test_cgroup_controllers_that_cannot_be_enabled_are_explained(tmp_path: Path) -> None:
    mountinfo, proc = fake_mounts(tmp_path, v2="cpuset", own="/svc")  # memory and cpu not delegated here
    (tmp_path / "cg/svc/cgroup.subtree_control").mkdir()  # a write here fails, as EBUSY would
    support = detect(mountinfo, proc)
    assert not support.available
    text = support.describe()
    assert "v2 cpuset not enabled" in text and "svc/cgroup.subtree_control" in text
    assert "no usable cpuset, memory, cpu controller" in text and text.endswith("CPU affinity only")
    assert make_group(support, "scope", "t.w", Limits(CPUSet("0"), (0,), 2**20)) is None
