"""A hostile tenant on a shared node, as issue 25 tried it: every attempt fails, and the other tenant's
workload runs on.

A real control plane and a real agent with this machine's cgroups. The cluster's files are laid out
as `finesched up` lays them out (one data directory holding the database, the admin and agent
tokens and the agent's data), in a directory anyone may pass through, so nothing but finesched's
own modes protect them. Tenant team-b runs a sleeper; tenant team-a then runs a script that tries
to read the tokens, the database, team-b's output and environment, to signal team-b's processes,
to leave its cgroups or join team-b's, to run on a CPU outside its cpuset, to become root, and
to read the agent's environment, printing one verdict line per attempt. The same again with
``--sandbox bwrap`` where bubblewrap is installed, where the data directories are not even
visible and /proc shows the workload's own processes only.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import Cluster, phase_is, wait

from finesched.agent.cgroup import detect, read_mounts
from finesched.agent.cgroup_groups import Group
from finesched.agent.loop import Agent
from finesched.private import private_dir, write_private
from reachable import ROOT, SYSTEM_PYTHON, needs_system_python, reachable_dir, remove, skip_without_bwrap

pytestmark = [needs_system_python, pytest.mark.skipif(not ROOT, reason="the agent switches users only as root")]
SLEEP = "3607"  # team-b's sleeper: `sleep 3607`, a duration nothing else on the machine uses

#: The hostile workload: one "VERDICT <attempt> blocked|LEAK <detail>" line per attempt, then DONE.
#: What it aims at comes as JSON in its first argument; its own cgroups and CPUs it finds itself.
HOSTILE = r"""
import json, os, sys
t = json.loads(sys.argv[1])

def verdict(name, leaked, detail=""):
    print("VERDICT", name, "LEAK" if leaked else "blocked", str(detail).replace("\n", " ")[:200], flush=True)

def attempt(name, action, leaked=lambda got: True):
    try:
        got = action()
    except OSError as exc:
        verdict(name, False, f"{type(exc).__name__}: {exc.strerror}")
    else:
        verdict(name, leaked(got), repr(got)[:80])

def read(path):
    with open(path, "rb") as f:
        return f.read(64)

def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"

for name in ("admin_token", "agent_token", "database", "b_log"):
    attempt("read_" + name, lambda p=t[name]: read(p))
attempt("list_data", lambda: os.listdir(t["data"]), leaked=bool)  # a sandbox shows it empty
attempt("list_agent_data", lambda: os.listdir(t["agent_data"]), leaked=bool)
attempt("list_workloads", lambda: os.listdir(t["scope"]), leaked=lambda got: got != [t["own_name"]])
attempt("list_b_workdir", lambda: os.listdir(t["b_workdir"]))
attempt("write_b_workdir", lambda: write(os.path.join(t["b_workdir"], "planted"), "x"))
for pid in t["b_pids"]:
    attempt(f"read_b_environ_{pid}", lambda pid=pid: read(f"/proc/{pid}/environ"))
    attempt(f"kill_b_{pid}", lambda pid=pid: os.kill(pid, 9))
attempt("read_agent_environ", lambda: read(f"/proc/{t['agent_pid']}/environ"))
leaked = [k for k in os.environ if k in t["agent_env"]]
verdict("own_environment_clean", bool(leaked), leaked or "nothing of the agent's")
own = {}
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.rstrip("\n").split(":", 2)
    for controller in controllers.split(",") if controllers else ["v2"]:
        if controller in t["mounts"]:
            own[controller] = t["mounts"][controller] + path
escape = set(t["escape"])
for controller, path in own.items():
    parent = os.path.dirname(path)
    escape |= {os.path.join(parent, "cgroup.procs"), os.path.join(os.path.dirname(parent), "cgroup.procs")}
    attempt(f"widen_own_cpuset_{controller}", lambda path=path: write(os.path.join(path, "cpuset.cpus"), t["all"]))
    limit = os.path.join(path, "memory.limit_in_bytes")
    attempt(f"own_memory_limit_{controller}", lambda limit=limit: write(limit, "-1"))
for i, path in enumerate(sorted(escape)):
    attempt(f"cgroup_escape_{i}", lambda path=path: write(path, str(os.getpid())))
for i, path in enumerate(t["b_groups"]):
    attempt(f"cgroup_join_b_{i}", lambda path=path: write(path, str(os.getpid())))
mine = os.sched_getaffinity(0)
outside = [c for c in t["cpus"] if c not in mine]
if outside:
    try:
        os.sched_setaffinity(0, set(outside))
    except OSError as exc:
        verdict("affinity_outside_cpuset", False, exc.strerror)
    else:
        now = sorted(os.sched_getaffinity(0))
        verdict("affinity_outside_cpuset", bool(set(now) & set(outside)), now)
attempt("setuid_root", lambda: os.setuid(0))
attempt("setgid_root", lambda: os.setgid(0))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
verdict("running_as_root", 0 in os.getresuid() or 0 in os.getresgid(), (os.getresuid(), os.getgroups()))
caps = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
verdict("capabilities", any(int(v, 16) for v in caps.values()), caps)
verdict("no_new_privs", status["NoNewPrivs"].strip() != "1", status["NoNewPrivs"].strip())
seen = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                seen.append(f.read().split(b"\0"))
        except OSError:
            pass
if t["sandbox"]:
    b_visible = any(argv[:2] == [b"sleep", t["sleep"].encode()] for argv in seen)
    verdict("see_b_processes", b_visible, f"{len(seen)} processes visible")
print("DONE", flush=True)
"""

#: Attempts every run makes (more are made per pid, cgroup and controller).
ATTEMPTS = {
    "read_admin_token", "read_agent_token", "read_database", "read_b_log", "list_data", "list_agent_data",
    "list_workloads", "list_b_workdir", "write_b_workdir", "read_agent_environ", "own_environment_clean",
    "cgroup_escape_0", "cgroup_join_b_0", "setuid_root", "setgid_root", "running_as_root", "capabilities",
    "no_new_privs", "widen_own_cpuset_cpuset",
}  # fmt: skip


@pytest.fixture
def layout() -> Iterator[Path]:
    """A directory anyone may pass through, holding `up`'s data directory (made 0700 as `up` does)."""
    base = reachable_dir(0o755, "finesched-hostile-")
    yield private_dir(base / "up")
    remove(base)


def b_pids(uid: int) -> list[int]:
    """team-b's `sleep` processes (run as its uid)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            owner = entry.stat().st_uid
        except OSError:
            continue
        if entry.name.isdigit() and argv[:2] == [b"sleep", SLEEP.encode()] and owner == uid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def verdicts(log: str) -> dict[str, tuple[str, str]]:
    out = {}
    for line in log.splitlines():
        if line.startswith("VERDICT "):
            _, name, outcome, *detail = line.split(" ", 3)
            out[name] = (outcome, " ".join(detail))
    return out


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_hostile_tenant_gets_nothing_and_the_other_runs_on(
    layout: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sandbox == "bwrap":
        skip_without_bwrap()
    support = detect()
    if "cpuset" not in support.controllers:
        pytest.skip(f"no writable cpuset controller here: {support.describe()}")
    monkeypatch.setenv("FINESCHED_TEST_AGENT_SECRET", "the agent's own")
    cluster = Cluster(layout)  # the database at <data>/fs.db and the agent's data at <data>/agent, as `up`
    try:
        cluster.tenant("team-a")
        cluster.tenant("team-b")
        write_private(layout / "admin.token", cluster.admin.headers["Authorization"].split()[1] + "\n")
        write_private(layout / "agent.token", cluster.agent_token + "\n")
        agent = cluster.agent(cgroups=support, sandbox=sandbox, hide=(layout,))
        agent.tick_report()
        run_hostile(cluster, agent, layout, support, sandbox)
    finally:
        for agent in cluster.agents:
            agent.executor.stop_all()
        cluster.close()


def run_hostile(cluster: Cluster, agent: Agent, layout: Path, support: Any, sandbox: str) -> None:
    cluster.submit("sleeper", ["sleep", SLEEP], {"cpu": "100m", "memory": "32Mi"}, namespace="team-b",
                   limits={"memory": "32Mi"}, env={"TEAM_B_SECRET": "b's own"})  # fmt: skip
    cluster.until(agent, "sleeper", phase_is("Running"), "team-b's sleeper to run", namespace="team-b")
    b = agent.executor.state.records["team-b/sleeper"]
    wait(lambda: bool(b_pids(b.uid)), "team-b's sleep to start")
    sleepers = b_pids(b.uid)
    group = Group.from_record(b.cgroup)
    assert group is not None
    mounts: dict[str, str] = {}
    for m in read_mounts():
        for controller in m.controllers if m.version == 1 else ("v2",):
            mounts.setdefault(controller, str(m.point))
    cpus = sorted(os.sched_getaffinity(0))
    targets = {
        "admin_token": str(layout / "admin.token"), "agent_token": str(layout / "agent.token"),
        "database": str(layout / "fs.db"), "b_log": b.log, "data": str(layout), "agent_data": str(agent.config.data),
        "scope": str(agent.executor.workdirs.scope), "own_name": agent.executor.workdirs.path("team-a/hostile").name,
        "b_workdir": b.workdir, "b_pids": [*sleepers, b.pid], "agent_pid": os.getpid(),
        "agent_env": [k for k in os.environ if k not in ("PATH", "HOME", "LANG", "USER", "LOGNAME")],
        "mounts": mounts, "escape": sorted({f"{p}/cgroup.procs" for p in mounts.values()}),
        "b_groups": group.procs_files(), "cpus": cpus, "all": ",".join(map(str, cpus)),
        "sleep": SLEEP, "sandbox": sandbox == "bwrap",
    }  # fmt: skip
    whole = {"cpu": "1", "memory": "64Mi"}  # an LSE: a CPU of its own, in a cpuset of its own
    cluster.submit("hostile", [SYSTEM_PYTHON, "-c", HOSTILE, json.dumps(targets)], whole, namespace="team-a",
                   limits=whole, qos="LSE")  # fmt: skip
    done = cluster.until(agent, "hostile", phase_is("Succeeded", "Failed"), "the attempts", namespace="team-a")
    a = agent.executor.state.records["team-a/hostile"]
    log = Path(a.log).read_text()
    assert done["status"]["phase"] == "Succeeded" and log.rstrip().endswith("DONE"), log
    found = verdicts(log)
    assert set(found) >= ATTEMPTS, sorted(ATTEMPTS - set(found))
    assert {f"kill_b_{pid}" for pid in sleepers} <= set(found)
    if len(cpus) > 1:
        assert "affinity_outside_cpuset" in found
    if sandbox == "bwrap":
        assert "see_b_processes" in found
    leaks = {name: detail for name, (outcome, detail) in found.items() if outcome != "blocked"}
    assert not leaks, leaks
    assert a.uid != b.uid and 0 not in (a.uid, b.uid)
    # team-b runs on, untouched
    agent.tick_bindings()
    assert cluster.workload("sleeper", "team-b")["status"]["phase"] == "Running"
    assert all(alive(pid) for pid in [*sleepers, b.pid])
    assert not (Path(b.workdir) / "planted").exists()
    assert all(str(a.pid) not in Path(f).read_text().split() for f in group.procs_files())
    assert stat.S_IMODE(layout.stat().st_mode) == 0o700
