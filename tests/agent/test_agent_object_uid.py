"""Object identity on a node, end to end (server in a thread, a real agent, real processes): a
workload created with the name of a deleted one starts clean (uid, events, output.log, working
directory of its own); finished workloads' directories and logs are kept for their retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_cluster import Cluster, phase_is, wait
from typer.testing import CliRunner

from finesched.agent.retention import parse_duration
from finesched.cli import app
from reachable import SYSTEM_PYTHON


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def _printer(text: str) -> list[str]:
    """A command that prints `text` and leaves a file in its working directory."""
    return [SYSTEM_PYTHON, "-c", f"open('left-behind', 'w').write('x'); print({text!r})"]


def _events(cluster: Cluster, **params: str) -> list[dict]:
    return cluster.admin.get("/v1/events", params={"kind": "Workload", "object": "t/w", **params}).json()["items"]


def test_a_workload_created_with_a_deleted_ones_name_starts_clean(cluster: Cluster) -> None:
    agent = cluster.agent(logs=True)
    agent.tick_report()  # the report carries the agent's logs URL
    cluster.submit("w", _printer("first"), {"cpu": "100m"})
    first = cluster.until(agent, "w", phase_is("Succeeded"), "the first to finish")
    old_uid = first["metadata"]["uid"]
    assert cluster.admin.get("/v1/workloads/t/w/logs").text == "first\n"
    assert cluster.admin.delete("/v1/workloads/t/w").status_code == 200

    cluster.submit("w", _printer("second"), {"cpu": "100m"})
    pending = cluster.workload("w")
    new_uid = pending["metadata"]["uid"]
    assert new_uid != old_uid
    # not started yet (the agent has not ticked): no output of its own, and never the deleted one's
    assert cluster.admin.get("/v1/workloads/t/w/logs").status_code == 404
    assert next(e["reason"] for e in _events(cluster, uid=new_uid)) == "Submitted"
    second = cluster.until(agent, "w", phase_is("Succeeded"), "the second to finish")
    assert second["metadata"]["uid"] == new_uid
    assert cluster.admin.get("/v1/workloads/t/w/logs").text == "second\n"

    mine = _events(cluster, uid=new_uid)
    assert mine and {e["uid"] for e in mine} == {new_uid} and "Deleted" not in [e["reason"] for e in mine]
    everything = _events(cluster)  # by name only: both objects' history, each event with its uid
    assert {e["uid"] for e in everything} == {old_uid, new_uid}
    assert [e["reason"] for e in everything if e["uid"] == old_uid][-1] == "Deleted"
    # the two objects' directories are apart: each has its own log
    logs = sorted(p.name for p in (agent.config.data / "workloads").iterdir())
    assert len(logs) == 2 and all(name.startswith("t.w-") for name in logs)
    assert {name.removeprefix("t.w-") for name in logs} == {old_uid, new_uid}
    # `describe` reads the events of this object only
    shown = CliRunner().invoke(app, ["describe", "workload", "t/w", "-o", "json", "--server", cluster.url,
                                     "--token", cluster.admin.headers["Authorization"].split()[1]])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert new_uid in shown.stdout and old_uid not in shown.stdout
    # reading the logs without the server finds the newest object's
    local = CliRunner().invoke(app, ["logs", "t/w", "--data", str(agent.config.data)])
    assert local.exit_code == 0 and local.stdout == "second\n"


def test_an_agent_report_about_a_deleted_object_is_refused(cluster: Cluster) -> None:
    agent = cluster.agent()
    cluster.submit("w", ["sleep", "30"], {"cpu": "100m"})
    uid = cluster.until(agent, "w", phase_is("Running"), "to run")["metadata"]["uid"]
    agent_http = agent.client.http
    other = "0f8fad5b-d9cb-469f-a165-70867728950e"
    refused = agent_http.post("/v1/workloads/t/w/status", params={"uid": other}, json={"phase": "Failed"})
    assert refused.status_code == 409 and uid in refused.json()["detail"]
    bad = agent_http.post("/v1/bindings/t/w/ack", params={"uid": "nope"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "uid"]
    assert cluster.workload("w")["status"]["phase"] == "Running"  # nothing changed
    assert agent_http.post("/v1/bindings/t/w/ack", params={"uid": uid}).status_code == 200


def test_a_finished_workloads_directory_is_kept_then_removed(cluster: Cluster) -> None:
    agent = cluster.agent(keep_finished_s=3600.0, keep_logs_s=3600.0)
    cluster.submit("w", _printer("done"), {"cpu": "100m"})
    uid = cluster.until(agent, "w", phase_is("Succeeded"), "to finish")["metadata"]["uid"]
    scope = agent.executor.workdirs.scope
    workdir = scope / f"t.w-{uid}"
    rundir = agent.config.data / "workloads" / f"t.w-{uid}"
    wait(lambda: (agent.tick_bindings(), "t/w" not in agent.executor.state.records)[1], "the agent to forget it")
    # its binding is gone, it is kept for the retention: what it left there can be looked at
    assert (workdir / "left-behind").read_text() == "x" and (rundir / "output.log").is_file()
    assert agent.executor.sweep_finished(force=True) == []

    agent.executor.keep_finished_s = 0.2  # a short retention: the next sweeps remove the directory
    wait(lambda: (agent.tick_bindings(), not workdir.exists())[1], "the working directory to be removed")
    assert (rundir / "output.log").is_file()  # the log has a retention of its own
    agent.executor.keep_logs_s = 0.2
    wait(lambda: (agent.tick_bindings(), not rundir.exists())[1], "the log to be removed")


def test_a_workload_stopped_while_running_loses_its_directory_at_once(cluster: Cluster) -> None:
    agent = cluster.agent(keep_finished_s=3600.0)
    cluster.submit("w", ["sleep", "30"], {"cpu": "100m"})
    uid = cluster.until(agent, "w", phase_is("Running"), "to run")["metadata"]["uid"]
    workdir = agent.executor.workdirs.scope / f"t.w-{uid}"
    assert workdir.is_dir()
    assert cluster.admin.delete("/v1/workloads/t/w").status_code == 200
    agent.tick_bindings()
    assert not workdir.exists()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("30", 30.0), ("30s", 30.0), ("1.5s", 1.5), ("15m", 900.0), ("1h", 3600.0), ("7d", 604800.0)],
)
def test_retention_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--keep-finished") == seconds


@pytest.mark.parametrize("text", ["", "1x", "-1s", "h", "1h30m", "3651d", "nan"])
def test_bad_retention_durations_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(ValueError, match="--keep-finished"):
        parse_duration(text, "--keep-finished")


@pytest.mark.parametrize("command", [["agent", "--server", "http://127.0.0.1:9", "--token", "x"], ["up"]])
@pytest.mark.parametrize(("option", "text"), [("--keep-finished", "1x"), ("--keep-logs", "3651d")])
def test_the_commands_refuse_a_bad_retention_before_starting(command: list[str], option: str, text: str) -> None:
    shown = CliRunner().invoke(app, [*command, option, text])
    assert shown.exit_code == 2 and option in shown.output and repr(text) in shown.output, shown.output
