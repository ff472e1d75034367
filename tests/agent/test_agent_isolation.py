"""One binding never stops the agent: unsafe names stay off the file system, a binding that makes
the agent raise is set aside alone, and the agent goes on serving every other binding."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from agent_cluster import NODE, Cluster
from hypothesis import given
from hypothesis import strategies as st
from test_agent_executor import NO_CGROUP, binding, executor, fake_mounts, node, run_to_end
from test_agent_report import FakeServer, gpu_node

from finesched.agent.cgroup import detect
from finesched.agent.cgroup_groups import Group
from finesched.agent.executor import rundir_of
from finesched.agent.loop import Agent, AgentConfig
from finesched.agent.names import safe_name

SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@given(st.text(max_size=400), st.text(max_size=400))
def test_safe_names_are_one_short_plain_component(namespace: str, name: str) -> None:
    safe = safe_name(f"{namespace}/{name}")
    assert set(safe) <= SAFE and len(safe) <= 81 and safe[0] not in ".-" and safe not in (".", "..")
    assert safe != safe_name(f"{namespace}/{name}x")  # the hash tells keys apart, however they sanitize


def test_names_that_were_paths_stay_under_the_data_directory(tmp_path: Path) -> None:
    for key in ("../../etc/passwd", "ns/..", "ns/a/b", "ns/" + "x" * 300, "/", "ns/\x00\n"):
        where = rundir_of(tmp_path, key)
        assert where.parent == tmp_path / "workloads" and len(where.name) <= 81, key


def test_a_300_character_name_runs_with_safe_directories_and_groups(tmp_path: Path, work_root: Path) -> None:
    mountinfo, proc = fake_mounts(tmp_path, v1=("cpuset", "memory"), own="/svc")
    ex = executor(tmp_path / "data", work_root, detect(mountinfo, proc))
    long = "n" * 300
    ex.sync([binding(long, ["/bin/sh", "-c", "echo ran; pwd"])], node())
    run_to_end(ex, f"team/{long}")
    rec = ex.state.records[f"team/{long}"]
    assert rec.phase == "Succeeded" and "ran" in Path(rec.log).read_text()
    assert Path(rec.log).parent == rundir_of(tmp_path / "data", f"team/{long}")
    assert Path(rec.workdir).parent == work_root / ex.scope and len(Path(rec.workdir).name) <= 81
    assert rec.workdir in Path(rec.log).read_text()  # it ran there
    group = Group.from_record(rec.cgroup)
    assert group is not None and all(len(Path(d).name) <= 81 for d in group.dirs)
    assert ex.server.of("ack") == [("ack", f"team/{long}")]  # the server still hears the real name


def test_a_binding_that_makes_the_agent_raise_is_set_aside_alone(tmp_path: Path, work_root: Path, caplog) -> None:
    ex = executor(tmp_path / "data", work_root)
    poison = binding("poison", ["true"], spec={"env": ["not", "a", "mapping"]})  # the launch raises on it
    good = binding("good", ["sleep", "30"])
    with caplog.at_level(logging.ERROR, logger="finesched.agent"):
        ex.sync([poison, good], node())
        ex.sync([poison, good], node())  # the same binding version: not tried again, not logged again
    try:
        (reject,) = ex.server.of("reject")
        assert reject[1] == "team/poison" and "the agent failed on this binding (AttributeError" in reject[2]
        assert ex.state.records["team/good"].phase == "Running" and "team/poison" not in ex.state.records
        assert len([r for r in caplog.records if "team/poison" in r.getMessage()]) == 1
        rebound = binding("poison", ["true"], version=2, spec={"env": ["still", "bad"]})
        ex.sync([rebound, good], node())  # bound anew: tried again (and set aside again)
        assert len(ex.server.of("reject")) == 2
    finally:
        ex.sync([], node())


@pytest.mark.parametrize("name", ["t/a/b", "t/" + "x" * 300 + "/y"])
def test_an_unaddressable_name_from_an_older_server_never_stops_the_agent(
    tmp_path: Path, work_root: Path, caplog, name: str
) -> None:
    server = FakeServer()
    agent = Agent(AgentConfig("unused", "t", tmp_path, work_root=work_root), server, gpu_node, NO_CGROUP)
    agent.start()
    server.items = [
        {"workload": name, "node": "n1", "cpuset": "", "version": 1, "workloadSpec": {"command": ["true"]}},
        {"workload": "t/ok", "node": "n1", "cpuset": "", "version": 1, "workloadSpec": {"command": ["sleep", "30"]}},
    ]
    with caplog.at_level(logging.WARNING, logger="finesched.agent"):
        agent.tick_bindings()
        agent.tick_bindings()
    try:
        assert ("ack", "t/ok") in server.calls and agent.executor.state.records["t/ok"].phase == "Running"
        assert not [c for c in server.calls if c[0] == "reject"]  # no URL can name it: only logged, once
        assert len([r for r in caplog.records if "unreadable binding" in r.getMessage()]) == 1
    finally:
        agent.executor.stop_all()


def test_the_report_of_a_node_running_a_300_character_name_is_accepted(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        agent = cluster.agent()
        long = "w" * 300
        agent.executor.sync([binding(long, ["sleep", "30"], node=NODE)], agent.discovery)
        agent.tick_report()
        assert agent.last_report_error == ""
        report = cluster.admin.get(f"/v1/nodes/{NODE}").json()["status"]["report"]
        assert [w["name"] for w in report["workloadCPUs"]] == [long]
    finally:
        agent.executor.stop_all()
        cluster.close()
