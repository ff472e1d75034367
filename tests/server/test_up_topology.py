"""Topology-aware gangs end to end (issue 28): `finesched up` and four more `finesched agent`
processes on this machine, registered in two racks of one block with two simulated GPUs each; the
admin's Topology `dc` and tenants through `finesched submit -f`; tenants' gangs that require one
rack, run as real processes, shown by `finesched logs`, `get workloads` and `describe topology`.

Everything is a real process on 127.0.0.1 over SQLite. The workloads are deleted (and seen to stop)
before the agents and `up` are stopped; whatever a failure leaves behind is killed by its session
(`cleanup`), found by its working directory under this test's work roots.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from manifests import API, tenant, topology
from server_harness import FINESCHED, free_port, wait_until

from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from reachable import reachable_dir, remove

#: The agents' nodes and their racks (all in block b1): two nodes of two GPUs per rack.
RACKS = {"r1-a": "r1", "r1-b": "r1", "r2-a": "r2", "r2-b": "r2"}
#: What each member prints before it sleeps (until its gang is deleted).
COMMAND = ["sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"; exec sleep 600']
#: The first part of a waiting rack-gang's reason (docs/topology.md, "Why a gang waits").
WAITS = "topology dc: best topology.finesched.io/rack"
FAILURE = re.compile(r"Traceback|\bERROR\b")


@dataclass
class Fleet:
    """`up` and the agents (real processes), their logs, where their work roots are, the admin's client."""

    tmp: Path
    data: Path
    base: str
    work: Path  # every work root is under it (o+x all the way)
    up: subprocess.Popen[bytes]
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)
    admin: httpx.Client | None = None
    stopped: bool = False

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def cli(self, *commands: tuple[str, ...], token: str) -> list[str]:
        """Run the `finesched` commands side by side (each a real process); their outputs, in order."""
        env = {**os.environ, "FINESCHED_SERVER": self.base, "FINESCHED_TOKEN": token, "COLUMNS": "200"}
        procs = [
            subprocess.Popen([*FINESCHED, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for c in commands
        ]
        outputs = []
        for command, proc in zip(commands, procs, strict=True):
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"finesched {' '.join(command)}: {err}"
            outputs.append(out)
        return outputs

    def tokens(self, role: str, *names: str) -> list[str]:
        """New tokens of `role` for each node (agent) or tenant (tenant) `names`: `token create --db`."""
        db, option = f"sqlite:///{self.data / 'finesched.db'}", "--node" if role == "agent" else "--tenant"
        made = self.cli(*[("token", "create", "--db", db, "--role", role, option, n) for n in names], token="")
        return [t.strip() for t in made]

    def submit(self, name: str, docs: list[dict[str, Any]], token: str) -> str:
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        return self.cli(("submit", "-f", str(path)), token=token)[0]


def start_up(tmp: Path, *options: str) -> Fleet:
    """`up` on a free port with `options`, once it answers as the leader with its admin token
    (stopped again if it does not)."""
    work = reachable_dir(0o711, "finesched-work-")
    data, port = tmp / "up", free_port()
    with (tmp / "up.out").open("wb") as out:
        up = subprocess.Popen(
            [*FINESCHED, "up", "--data", str(data), "--port", str(port), "--work-root", str(work / "up"),
             "--interval", "1", *options],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    fleet = Fleet(tmp, data, f"http://127.0.0.1:{port}", work, up, logs=[tmp / "up.out", data / "server.log"])
    try:
        token_file = data / "admin.token"
        wait_until(lambda: token_file.is_file() and token_file.read_text().strip() != "", 60, "up's admin token")
        fleet.admin = fleet.client(token_file.read_text().strip())
        wait_until(lambda: _answers(fleet.admin), 60, "the server to answer")
    except BaseException:
        cleanup(fleet)
        raise
    return fleet


def start(tmp: Path) -> Fleet:
    """`up` on a free port, then an agent per node of RACKS with its own token, data and work root
    (all stopped again if one cannot start)."""
    fleet = start_up(tmp)
    work = fleet.work
    try:
        for (name, rack), token in zip(RACKS.items(), fleet.tokens("agent", *RACKS), strict=True):
            (work / name).mkdir(mode=0o711)
            fleet.logs.append(tmp / f"agent-{name}.out")
            with fleet.logs[-1].open("wb") as out:
                fleet.agents[name] = subprocess.Popen(
                    [*FINESCHED, "agent", "--server", fleet.base, "--token", token, "--node-name", name,
                     "--data", str(tmp / f"agent-{name}"), "--work-root", str(work / name), "--interval", "1",
                     "--label", f"{BLOCK_LABEL}=b1", "--label", f"{RACK_LABEL}={rack}", "--fake-gpus", "2:16Gi"],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
    except BaseException:
        cleanup(fleet)
        raise
    return fleet


def _answers(client: httpx.Client | None) -> bool:
    assert client is not None
    try:
        return client.get("/readyz").json().get("leader") is True
    except (httpx.HTTPError, ValueError):
        return False


def _ready(fleet: Fleet) -> bool:
    """Every agent's node registered, ready, labelled with its rack and holding its two GPUs."""
    assert fleet.admin is not None
    for name, process in fleet.agents.items():
        assert process.poll() is None, f"agent {name} exited: {(fleet.tmp / f'agent-{name}.out').read_text()}"
    nodes = {n["metadata"]["name"]: n for n in fleet.admin.get("/v1/nodes").json()["items"]}
    return all(
        name in nodes and nodes[name]["status"]["ready"] and len(nodes[name]["spec"]["devices"]) == 2
        and nodes[name]["metadata"]["labels"].get(RACK_LABEL) == rack
        for name, rack in RACKS.items()
    )  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    fleet = start(tmp_path)
    try:
        wait_until(lambda: _ready(fleet), 90, "the four agents' nodes")
        yield fleet
    finally:
        cleanup(fleet)


def cleanup(fleet: Fleet) -> None:
    """Delete what is left, wait for its processes, stop the agents and `up`; kill any workload
    process still running under the work roots (by its session: the agent's wrapper and all)."""
    if fleet.stopped:
        return
    fleet.stopped = True
    try:
        if fleet.admin is not None and _answers(fleet.admin):
            for item in fleet.admin.get("/v1/workloads").json()["items"]:
                fleet.admin.delete(f"/v1/workloads/{item['metadata']['namespace']}/{item['metadata']['name']}")
            wait_until(lambda: not _workload_processes(fleet.work), 30, "the deleted workloads' processes to end")
    except (AssertionError, httpx.HTTPError):
        pass  # killed below
    finally:
        for process in fleet.agents.values():
            _stop(process, signal.SIGTERM)
        _stop(fleet.up, signal.SIGINT)
        for sid in _workload_processes(fleet.work):
            with contextlib.suppress(OSError):
                os.killpg(sid, signal.SIGKILL)
        if fleet.admin is not None:
            fleet.admin.close()
        remove(fleet.work)


def _stop(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _workload_processes(work: Path, nodes: Collection[str] = ("up", *RACKS)) -> set[int]:
    """The sessions of the live workload processes of `nodes`: those whose working directory is inside
    the node's work root `work`/NODE, or, before they entered it, whose command line names it (the
    agent's wrapper, agent/launch.py; not the agents themselves, whose command lines name their roots)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if any(_in_a_work_root(Path(a), work, nodes) for a in (cwd, *argv)) and stat[0] not in ("Z", "X"):
            found.add(int(stat[3]))  # the session: the agent's wrapper leads it (start_new_session)
    return found


def _in_a_work_root(path: Path, work: Path, nodes: Collection[str]) -> bool:
    """`path` is inside one of the work roots `work`/NODE of `nodes` (a workload's working directory)."""
    if not path.is_absolute() or not path.is_relative_to(work):
        return False
    parts = path.relative_to(work).parts
    return len(parts) > 1 and parts[0] in nodes


def gang(namespace: str, name: str, members: int) -> list[dict[str, Any]]:
    """`members` workloads NAME-0.. of one whole GPU each (and half a core), required in one rack."""
    return [{"apiVersion": API, "kind": "Workload", "metadata": {"name": f"{name}-{i}", "namespace": namespace},
             "spec": {"requests": {"cpu": "500m", "gpu-core": 100, "gpu-memory-ratio": 100}, "command": COMMAND,
                      "gang": {"name": name, "minMember": members,
                               "topology": {"name": "dc", "required": RACK_LABEL}}}}
            for i in range(members)]  # fmt: skip


def running(fleet: Fleet, namespace: str, name: str, members: int) -> list[dict[str, Any]]:
    """The gang's members once all run (each seen with its process)."""
    assert fleet.admin is not None
    keys = [f"{namespace}/{name}-{i}" for i in range(members)]
    found: dict[str, dict[str, Any]] = {}

    def all_run() -> bool:
        for key in keys:
            found[key] = fleet.admin.get(f"/v1/workloads/{key}").json()
        return all(w["status"]["phase"] == "Running" and w["status"]["info"].get("pid") for w in found.values())

    wait_until(all_run, 60, f"{namespace}'s gang {name} to run")
    return [found[key] for key in keys]


def placed(fleet: Fleet, members: list[dict[str, Any]], token: str) -> tuple[str, list[tuple[str, str]]]:
    """The one rack the members run in and each member's (node, GPU), the GPU as its process saw it
    (`finesched logs`); consecutive members share a node; every member has a GPU of its own."""
    assert fleet.admin is not None
    nodes = [m["status"]["node"] for m in members]
    racks = {RACKS[n] for n in nodes}
    assert len(racks) == 1, nodes
    assert [nodes[i] == nodes[i + 1] for i in range(0, len(nodes), 2)] == [True] * (len(nodes) // 2), nodes
    uuids = {}
    for name in set(nodes):
        devices = fleet.admin.get(f"/v1/nodes/{name}").json()["spec"]["devices"]
        uuids |= {(name, d["minor"]): d["uuid"] for d in devices}
    granted = []
    for member in members:
        (grant,) = member["status"]["binding"]["devices"]["gpu"]
        granted.append((member["status"]["node"], uuids[(member["status"]["node"], grant["minor"])]))
    keys = [f"{m['metadata']['namespace']}/{m['metadata']['name']}" for m in members]
    seen: list[str] = []

    def printed() -> bool:  # Running = started; the echo follows once its user is set up
        seen[:] = fleet.cli(*[("logs", key) for key in keys], token=token)
        return all(out.strip() for out in seen)

    wait_until(printed, 30, "the members' output")
    assert [(node, out.split()[0]) for (node, _), out in zip(granted, seen, strict=True)] == granted
    assert len(set(granted)) == len(members)
    return racks.pop(), granted


def _table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of the rich tables in `text`."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


@pytest.mark.slow
def test_gangs_requiring_a_rack_run_inside_one_rack_and_wait_for_one(fleet: Fleet) -> None:
    admin = fleet.admin
    assert admin is not None
    admin_token = admin.headers["Authorization"].removeprefix("Bearer ")
    dc = topology("dc", BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)
    done = fleet.submit("admin", [dc, tenant("team-a"), tenant("team-b")], admin_token)
    assert "dc" in done and "team-a" in done and "team-b" in done
    team_a_token, team_b_token = fleet.tokens("tenant", "team-a", "team-b")
    team_b = fleet.client(team_b_token)

    # team-a's gang of 4: one rack, ranks 0/1 and 2/3 on one node each, a GPU each
    fleet.submit("train-a", gang("team-a", "train", 4), team_a_token)
    rack_a, gpus_a = placed(fleet, running(fleet, "team-a", "train", 4), team_a_token)
    assert rack_a == "r1"  # both racks hold it: BestFit's tie goes to the domain's name (b1/r1)

    # team-b's: the other rack; then a gang of 2 that no rack holds waits, saying why
    fleet.submit("train-b", gang("team-b", "train", 4), team_b_token)
    rack_b, gpus_b = placed(fleet, running(fleet, "team-b", "train", 4), team_b_token)
    assert rack_b == "r2" and not {n for n, _ in gpus_a} & {n for n, _ in gpus_b}
    fleet.submit("pair", gang("team-b", "pair", 2), team_b_token)

    def waits() -> bool:
        reasons = [team_b.get(f"/v1/workloads/team-b/pair-{i}").json()["status"]["reason"] for i in range(2)]
        return all(r.startswith(f"gang pair: {WAITS}") for r in reasons)

    wait_until(waits, 30, "the gang of 2 to wait for a rack")
    (listed,) = fleet.cli(("get", "workloads", "-o", "json"), token=team_b_token)
    pairs = [w for w in json.loads(listed) if w["metadata"]["name"].startswith("pair-")]
    assert len(pairs) == 2 and all(
        w["status"]["phase"] == "Pending" and w["status"]["reason"].startswith(f"gang pair: {WAITS}")
        and " holds 0 of 2 members: 2 need " in w["status"]["reason"] and "gpu-core" in w["status"]["reason"]
        for w in pairs
    ), pairs  # fmt: skip

    # a tenant's wrong input: refused with the field, nothing stored
    assert team_b.post("/v1/topologies", json=topology("mine", RACK_LABEL)).status_code == 403
    assert team_b.delete("/v1/topologies/dc").status_code == 403
    loc = ["body", "spec", "gang", "topology"]
    wrong = {
        "name": {"name": "nope", "required": RACK_LABEL},
        "required": {"name": "dc", "required": "zone"},
        "slice/required": {"name": "dc", "required": RACK_LABEL, "slice": {"size": 2, "required": BLOCK_LABEL}},
    }
    for where, asked in wrong.items():
        (doc,) = gang("team-b", "bad", 1)
        doc["spec"]["gang"] |= {"minMember": 2, "topology": asked}
        answer = team_b.post("/v1/workloads", json=doc)
        assert answer.status_code == 422, answer.text
        assert [d["loc"] for d in answer.json()["detail"]] == [loc + where.split("/")], answer.text
    assert [t["metadata"]["name"] for t in admin.get("/v1/topologies").json()["items"]] == ["dc"]
    assert admin.get("/v1/topologies/dc").json()["spec"] == dc["spec"]
    assert team_b.get("/v1/workloads/team-b/bad-0").status_code == 404

    # both racks are full: 0 of 400 gpu-core free in each (the API, and `describe topology`)
    domains = admin.get("/v1/topologies/dc").json()["status"]["domains"]
    racks = {d["name"]: d for d in domains if d["level"] == RACK_LABEL}
    assert sorted(racks) == ["b1/r1", "b1/r2"]
    assert all((d["nodes"], d["free"]["gpu-core"], d["allocatable"]["gpu-core"]) == (2, "0", "400")
               for d in racks.values()), racks  # fmt: skip
    (described,) = fleet.cli(("describe", "topology", "dc"), token=admin_token)
    rows = {cells[1]: cells for cells in _table_rows(described)}
    assert [(rows[rack][0], rows[rack][2], rows[rack][-1]) for rack in racks] == [("rack", "2", "0/400")] * 2, described

    # team-a's gang deleted: its processes end, and the waiting pair runs in rack r1, on one node
    r1 = [name for name, rack in RACKS.items() if rack == "r1"]
    team_a_sessions = _workload_processes(fleet.work, r1)
    assert len(team_a_sessions) == 4  # a session per member
    for i in range(4):
        assert admin.delete(f"/v1/workloads/team-a/train-{i}").status_code == 200
    wait_until(lambda: not team_a_sessions & _workload_processes(fleet.work, r1), 30, "team-a's processes to end")
    rack_p, gpus_p = placed(fleet, running(fleet, "team-b", "pair", 2), team_b_token)
    assert rack_p == "r1" and gpus_p[0][0] == gpus_p[1][0]
    assert all(w["status"]["phase"] == "Running" for w in admin.get("/v1/workloads").json()["items"])

    # the rest deleted: every process ends; the agents and `up` stop cleanly when asked
    assert len(_workload_processes(fleet.work)) == 6
    for item in admin.get("/v1/workloads").json()["items"]:
        assert admin.delete(f"/v1/workloads/team-b/{item['metadata']['name']}").status_code == 200
    wait_until(lambda: not _workload_processes(fleet.work), 30, "team-b's processes to end")
    cleanup(fleet)
    assert [p.returncode for p in (fleet.up, *fleet.agents.values())] == [0] * 5

    # nothing went wrong on the way: no traceback, no error in the server's or any agent's log
    for log in fleet.logs:
        bad = [line for line in log.read_text(errors="replace").splitlines() if FAILURE.search(line)]
        assert not bad, f"{log.name}: {bad}"
