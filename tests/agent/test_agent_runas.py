"""A workload's process as its tenant's user (agent/launch.py, runas.py, workdirs.py), with real processes:
its user and groups, capabilities, no_new_privs, umask, an environment built from scratch, its own
working directory, and files of the agent that only the agent reads."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from test_agent_executor import binding, executor, node, run_to_end

from finesched.agent.executor import Executor, rundir_of
from finesched.agent.launch import FIXED_PATH
from reachable import ROOT, ROOT_RUN_AS, SYSTEM_PYTHON, needs_system_python

pytestmark = needs_system_python
as_root = pytest.mark.skipif(not ROOT, reason="the agent switches users only as root")

#: What the workload sees of itself, written to the file named by its first argument.
SELF = """
import json, os, sys
open("made-here", "w").close()
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
json.dump({
    "uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
    "env": dict(os.environ), "caps": {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")},
    "no_new_privs": status["NoNewPrivs"].strip(), "made": oct(os.stat("made-here").st_mode & 0o777),
}, open(sys.argv[1], "w"))
"""


def seen_by(ex: Executor, exchange: Path, name: str, **extra: Any) -> dict[str, Any]:
    out = exchange / f"{name}.json"
    ex.sync([binding(name, [SYSTEM_PYTHON, "-c", SELF, str(out)], **extra)], node())
    run_to_end(ex, f"team/{name}")
    rec = ex.state.records[f"team/{name}"]
    assert rec.phase == "Succeeded", Path(rec.log).read_text()
    return json.loads(out.read_text())


def mode(path: str | Path) -> int:
    return stat.S_IMODE(Path(path).stat().st_mode)


@as_root
def test_a_workload_runs_as_its_tenant_s_user_with_nothing_of_root(
    tmp_path: Path, work_root: Path, exchange: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SECRET", "only-the-agent-knows")
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/preload.so")  # never reaches the root wrapper or the helper
    ex = executor(tmp_path / "data", work_root)
    seen = seen_by(ex, exchange, "me")
    rec = ex.state.records["team/me"]
    uid = ex.users.uids.given["team"]
    assert uid in range(200000, 300000) and (rec.uid, rec.gid, rec.tenant) == (uid, uid, "team")
    assert seen["uid"] == [uid] * 3 and seen["gid"] == [uid] * 3 and seen["groups"] == []
    assert set(seen["caps"].values()) == {"0000000000000000"} and seen["no_new_privs"] == "1"
    assert seen["made"] == "0o600"  # umask 077
    workdir = Path(rec.workdir)
    assert seen["cwd"] == str(workdir) and workdir.parent == work_root / ex.scope
    assert workdir.stat().st_uid == uid and mode(workdir) == 0o700 and mode(workdir.parent) == 0o711
    env = seen["env"]
    assert "AGENT_SECRET" not in env and "LD_PRELOAD" not in env
    assert env["PATH"] == FIXED_PATH and env["HOME"] == str(workdir) and env["LANG"] == "C.UTF-8"
    assert env["USER"] == env["LOGNAME"] == "team"  # no account of that uid here: the tenant's name
    assert env["GREETING"] == "hi" and env["FINESCHED_WORKLOAD"] == "team/me"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "none"  # the spec's "all" cannot override what the agent owns
    assert json.loads(env["FINESCHED_BINDING"])["workload"] == "team/me"
    extra = set(env) - {"PATH", "HOME", "LANG", "USER", "LOGNAME", "GREETING", "CUDA_VISIBLE_DEVICES",
                        "NVIDIA_VISIBLE_DEVICES"}  # fmt: skip
    assert all(k.startswith("FINESCHED_") for k in extra), extra
    info = ex.server.of("status")[-1][4]
    assert info["user"]["uid"] == uid and "--tenant-uids" in info["user"]["from"] and info["sandbox"] == "none"


@as_root
def test_the_root_wrapper_gets_none_of_the_tenant_s_environment(tmp_path: Path, work_root: Path) -> None:
    ex = executor(tmp_path / "data", work_root)
    spec = {"env": {"LD_PRELOAD": "/nonexistent/evil.so", "PYTHONPATH": "/nonexistent"}}
    ex.sync([binding("env", ["sleep", "30"], spec=spec)], node())
    try:
        rec = ex.state.records["team/env"]
        wrapper = Path(f"/proc/{rec.pid}/environ").read_bytes().split(b"\0")
        assert [v for v in wrapper if v] == [f"PATH={FIXED_PATH}".encode()]  # the root wrapper's whole environment
    finally:
        ex.sync([], node())


@as_root
def test_the_agent_s_files_are_its_own(tmp_path: Path, work_root: Path, exchange: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)  # as an older version left it: tightened at start
    ex = executor(data, work_root)
    seen_by(ex, exchange, "files")
    rec = ex.state.records["team/files"]
    assert mode(data) == mode(data / "workloads") == mode(rundir_of(data, "team/files")) == 0o700
    for path in (rec.log, rec.exit_file, data / "agent-state.json", data / "tenant-uids.json"):
        assert mode(path) == 0o600 and Path(path).stat().st_uid == 0, path


@as_root
def test_a_tenant_with_run_as_runs_as_that_user_and_root_only_when_allowed(
    tmp_path: Path, work_root: Path, exchange: Path
) -> None:
    ex = executor(tmp_path / "data", work_root)
    seen = seen_by(ex, exchange, "mapped", tenant="team", runAs={"uid": 4321, "gid": 8765})
    assert seen["uid"] == [4321] * 3 and seen["gid"] == [8765] * 3 and seen["groups"] == []
    assert Path(ex.state.records["team/mapped"].workdir).stat().st_gid == 8765
    root = seen_by(ex, exchange, "admin", tenant="team", runAs=ROOT_RUN_AS)
    assert root["uid"] == [0, 0, 0] and root["caps"]["CapEff"] != "0000000000000000"
    assert root["no_new_privs"] == "1" and "AGENT_SECRET" not in root["env"]


@as_root
def test_a_used_up_range_rejects_the_binding_with_the_reason(tmp_path: Path, work_root: Path) -> None:
    from finesched.agent.identity import Users

    (tmp_path / "data").mkdir()
    users = Users.for_agent(tmp_path / "data", range(299999, 300000))
    ex = executor(tmp_path / "data", work_root, users=users)
    ex.sync([binding("first", ["sleep", "30"], tenant="one")], node())
    try:
        ex.sync([binding("first", ["sleep", "30"], tenant="one"), binding("second", ["true"], tenant="two")], node())
        (reject,) = ex.server.of("reject")
        assert reject[1] == "team/second" and "no uid left for tenant two" in reject[2]
        assert "team/second" not in ex.state.records
    finally:
        ex.sync([], node())


def test_the_working_directory_goes_with_its_workload(tmp_path: Path, work_root: Path) -> None:
    ex = executor(tmp_path / "data", work_root)
    ex.sync([binding("a", ["sleep", "30"]), binding("b", ["sleep", "30"])], node())
    first, second = (Path(ex.state.records[f"team/{n}"].workdir) for n in "ab")
    (first / "left-behind").write_text("x")
    assert first.is_dir() and second.is_dir()
    ex.sync([binding("b", ["sleep", "30"])], node())  # a's binding is gone
    assert not first.exists() and second.is_dir()
    ex.sync([], node())
    assert not second.exists() and not (work_root / ex.scope).exists()  # the scope goes with the last one
    assert work_root.is_dir()


def test_up_s_exit_removes_every_ended_workload_s_directory(tmp_path: Path, work_root: Path) -> None:
    ex = executor(tmp_path / "data", work_root)
    ex.sync([binding("done", ["true"]), binding("runs", ["sleep", "30"])], node())
    run_to_end(ex, "team/done")  # ended, its binding not yet gone: its directory is still there
    dirs = [Path(ex.state.records[key].workdir) for key in ("team/done", "team/runs")]
    assert all(d.is_dir() for d in dirs)
    ex.stop_all()  # `finesched up` stops: nothing runs in them any more
    assert not any(d.exists() for d in dirs) and not (work_root / ex.scope).exists()


@as_root
def test_a_work_root_others_cannot_reach_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        executor(tmp_path / "data", tmp_path / "work")  # pytest's tmp_path is under a 0700 directory
    said = str(caught.value)
    assert said.startswith(f"--work-root {tmp_path / 'work'}: ") and "(o+x)" in said
