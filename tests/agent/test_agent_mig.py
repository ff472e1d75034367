"""MIG on the node, with the simulated NVML and its MIG calls (fake_mig.py): discovery of mode, profile table
and instances; the report's S0.2-encoded MIG part checked by the server; the executor's creation of a
dynamic instance, ``NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`` in the child, and cleanup; and the whole
path through a control plane on 127.0.0.1."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import NODE, PROBE, Cluster, inventory, phase_is
from agent_fakes import eight_gpus
from fake_mig import MIGNVML, FakeMIGCard

from finesched.agent.binding import parse_binding
from finesched.agent.cgroup import CgroupSupport
from finesched.agent.discover import Discovery, discover
from finesched.agent.executor import Executor
from finesched.agent.mig import MIGControl
from finesched.agent.report import build_report
from finesched.codec import encode
from finesched.cpuset import CPUSet
from finesched.model.mig import PRODUCTS
from finesched.model.node import Node
from finesched.server.api.reports import NodeReport, check_report
from reachable import SYSTEM_PYTHON


def no_nvml() -> tuple[None, str]:
    return None, "absent"


def machine(root: Path, cards: dict[int, FakeMIGCard]) -> Any:
    return MIGNVML(eight_gpus(root)[:3], cards)


@pytest.fixture
def cards() -> dict[int, FakeMIGCard]:
    h100 = FakeMIGCard("H100-80GB")
    h100.add("3g.40gb", 4)  # made by an admin (mig-parted)
    return {0: h100, 1: FakeMIGCard("A30-24GB")}


def test_discovery_reads_the_table_and_instances_from_nvml(tmp_path: Path, cards: dict[int, FakeMIGCard]) -> None:
    nvml = machine(tmp_path, cards)
    node = discover("n", root=tmp_path, nvml=nvml, mig_mode="dynamic").node
    h100, a30, plain = node.devices[:3]
    assert plain.mig is None
    assert h100.mig is not None and a30.mig is not None and h100.mig.mode == "dynamic"
    # the axis and placements come from NVML: 8 slices on the H100, 4 on the A30 (MIG.md §0, §1.3, §1.6)
    assert (h100.mig.memory_slices, h100.mig.compute_slices) == (8, 7)
    assert (a30.mig.memory_slices, a30.mig.compute_slices) == (4, 4)
    for device, product in ((h100, "H100-80GB"), (a30, "A30-24GB")):
        g, want = device.mig.geometry, PRODUCTS[product]
        assert [p.name for p in g.profiles] == [p.name for p in want.profiles]
        assert g.masks == want.masks and g.placements == want.placements
    (inst,) = h100.mig.instances
    assert (inst.profile, inst.start) == ("3g.40gb", 4) and inst.uuid.startswith("MIG-")


def test_report_carries_instances_and_the_server_checks_them(tmp_path: Path, cards: dict[int, FakeMIGCard]) -> None:
    d = discover("n", root=tmp_path, nvml=machine(tmp_path, cards), mig_mode="dynamic")
    body = build_report(d.node, [], d)
    mig = body["mig"]
    assert set(mig["instances"]) == {"0", "1"} and [i["start"] for i in mig["instances"]["0"]] == [4]
    assert mig["slices"]["count"] == 2 and mig["slices"]["bits"] == 8
    assert mig["slices"]["k"] == encode([0b11110000, 0], 8)  # the 3g at 4 holds slices 4-7
    assert "gpu" in body["devices"] and body["devices"]["gpu"]["gpu-core"]["count"] == 1  # only the non-MIG GPU
    assert check_report(d.node, NodeReport.model_validate(body)) == []
    wrong = json.loads(json.dumps(body))
    wrong["mig"]["slices"]["k"] = encode([0b1111, 0], 8)
    problems = check_report(d.node, NodeReport.model_validate(wrong))
    assert [p["loc"] for p in problems] == [["body", "mig", "slices", "k"]]
    overlap = json.loads(json.dumps(body))
    overlap["mig"]["instances"]["0"].append({"profile": "1g.10gb", "start": 5})
    problems = check_report(d.node, NodeReport.model_validate(overlap))
    assert problems[0]["loc"] == ["body", "mig", "instances", "0", "1", "start"]  # the second instance
    assert "overlaps memory slices" in problems[0]["msg"]


def mig_binding(name: str, command: list[str], minor: int, profile: str, start: int, uuid: str | None = None) -> Any:
    mig: dict[str, Any] = {"profile": profile, "start": start, **({"uuid": uuid} if uuid else {})}
    item = {
        "workload": f"team/{name}", "node": "n", "cpuset": "", "version": 1, "acked": False,
        "devices": {"gpu": [{"minor": minor, "resources": {}, "mig": mig}]},
        "workloadSpec": {"command": command},
    }  # fmt: skip
    return parse_binding(item)


def here(d: Discovery) -> Discovery:
    """`d` with this machine's CPUs online (the fake sysfs tree has none), so children can be pinned."""
    return Discovery(node=d.node, online=CPUSet(os.sched_getaffinity(0)), sources=d.sources)


class Server:
    def __init__(self) -> None:
        self.rejects: list[str] = []

    def ack(self, workload: str, object_uid: str = "") -> None: ...

    def reject(self, workload: str, reason: str, object_uid: str = "") -> None:
        self.rejects.append(reason)

    def status(self, *args: Any) -> None: ...


def run_probe(ex: Executor, b: Any, d: Discovery) -> None:
    ex.sync([b], d)
    assert not ex.server.rejects, ex.server.rejects  # type: ignore[attr-defined]
    for _ in range(500):
        ex.poll()
        if all(r.phase != "Running" for r in ex.state.records.values()):
            return
        time.sleep(0.02)
    raise AssertionError("the probe did not end")


def test_dynamic_instance_is_created_passed_to_the_child_and_destroyed(
    tmp_path: Path, cards: dict[int, FakeMIGCard], work_root: Path, exchange: Path
) -> None:
    nvml = machine(tmp_path, cards)
    d = here(discover("n", root=tmp_path, nvml=nvml, mig_mode="dynamic"))
    ex = Executor(tmp_path / "data", Server(), CgroupSupport(None, reason="test"), mig=MIGControl(nvml),
                  work_root=work_root)  # fmt: skip
    out = exchange / "probe.json"
    run_probe(ex, mig_binding("m", [SYSTEM_PYTHON, "-c", PROBE, str(out)], 0, "1g.10gb", 2), d)
    env = json.loads(out.read_text())["env"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-") and env["FINESCHED_DEVICES_GPU"] == "0"
    h100 = cards[0]
    assert h100.calls[0] == "create 1g.10gb@2" and h100.calls[-1].startswith("destroy")
    assert h100.layout() == [("3g.40gb", 4)]  # the admin's instance stays, ours is gone


def test_existing_instance_is_used_and_a_missing_one_is_rejected(
    tmp_path: Path, cards: dict[int, FakeMIGCard], work_root: Path, exchange: Path
) -> None:
    nvml = machine(tmp_path, cards)
    d = here(discover("n", root=tmp_path, nvml=nvml, mig_mode="static"))
    server = Server()
    ex = Executor(tmp_path / "data", server, CgroupSupport(None, reason="test"), mig=MIGControl(nvml),
                  work_root=work_root)  # fmt: skip
    out = exchange / "probe.json"
    run_probe(ex, mig_binding("s", [SYSTEM_PYTHON, "-c", PROBE, str(out)], 0, "3g.40gb", 4), d)
    uuid = next(i.uuid for i in d.node.devices[0].mig.instances)
    assert json.loads(out.read_text())["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert cards[0].calls == []  # static: nothing created or destroyed
    ex.sync([mig_binding("t", ["true"], 0, "3g.40gb", 0)], d)
    assert server.rejects == ["gpu 0 has no 3g.40gb instance at start 0"]
    ex.sync([mig_binding("u", ["true"], 2, "1g.10gb", 0)], d)
    assert server.rejects[-1] == "gpu 2 is not in MIG mode here"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_end_to_end_a_mig_workload_runs_on_its_instance(cluster: Cluster, tmp_path: Path) -> None:
    cards = {0: FakeMIGCard("H100-80GB"), 1: FakeMIGCard("H100-80GB")}
    cards[0].add("1g.10gb", 6)  # something outside finesched holds slice 6 on card 0
    nvml = machine(tmp_path, cards)

    def discovery() -> Discovery:
        """This machine's CPUs (as the other end-to-end tests) with the fake NVML's GPUs."""
        base = inventory()
        gpus = discover(NODE, root=tmp_path, nvml=nvml, mig_mode="dynamic").node.devices
        data = {**base.node.model_dump(by_alias=True), "devices": [d.model_dump(by_alias=True) for d in gpus]}
        return Discovery(node=Node.model_validate(data), online=base.online, sources=base.sources)

    discovery.nvml = nvml  # type: ignore[attr-defined]  # the executor creates instances through it
    agent = cluster.agent(discovery=discovery)
    agent.tick_report()
    command, out = cluster.probe("m")
    cluster.submit("m", command, {"cpu": "100m", "nvidia.com/mig-2g.20gb": 1})
    w = cluster.until(agent, "m", phase_is("Succeeded", "Failed"), "to finish")
    assert w["status"]["phase"] == "Succeeded", w["status"]
    env = json.loads(out.read_text())["env"]
    (grant,) = json.loads(env["FINESCHED_BINDING"])["devices"]["gpu"]
    # the scored choice: the used card (a fresh one would lose its 7g), at 4 (a 2g at 0 or 2 blocks the 4g)
    assert (grant["minor"], grant["mig"]["profile"], grant["mig"]["start"]) == (0, "2g.20gb", 4)
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert w["status"]["info"]["mig"][0]["uuid"] == env["NVIDIA_VISIBLE_DEVICES"]
    agent.tick_report()  # the report (with the instances as they are now) is accepted
    assert agent.last_report_error == ""
