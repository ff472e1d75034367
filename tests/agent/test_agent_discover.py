"""Discovery from fake sysfs trees and a fake NVML module, and once from this machine's /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_fakes import FakeGPU, add_hca, add_pci, eight_gpus, fake_nvml, make_sysfs

from finesched.agent.discover import discover
from finesched.agent.sysfs import normalize_bus_id
from finesched.cpuset import CPUSet


def no_nvml() -> tuple[None, str]:
    return None, "NVML unavailable: test"


def by_id(d) -> dict[int, tuple[int, int, int]]:
    return {c.id: (c.socket, c.core, c.numa) for c in d.node.cpu_topology.cpus}


def test_one_socket_no_smt(tmp_path: Path) -> None:
    want = make_sysfs(tmp_path, sockets=1, cores_per_numa=4, threads=1, mem_kb_per_numa=2048)
    d = discover("n1", root=tmp_path, load=no_nvml)
    assert by_id(d) == want
    assert d.online == CPUSet("0-3")
    assert d.node.allocatable["cpu"] == 4000
    assert d.node.allocatable["memory"] == 2048 * 1024
    assert [(z.id, z.memory) for z in d.node.numa_zones] == [(0, 2048 * 1024)]
    assert d.node.devices == ()
    assert d.sources["gpu"].startswith("absent") and "NVML unavailable: test" in d.sources["gpu"]
    assert d.sources["rdma"].startswith("absent")


def test_two_sockets_two_numa_each_with_smt_cores_are_machine_unique(tmp_path: Path) -> None:
    # core_id restarts per socket and has gaps (stride 2): only (socket, core_id) is unique
    want = make_sysfs(tmp_path, sockets=2, numa_per_socket=2, cores_per_numa=2, threads=2, core_id_stride=2)
    d = discover("n2", root=tmp_path, load=no_nvml)
    assert by_id(d) == want  # core numbers follow lowest-CPU order: 0..7, siblings CPU c and c+8
    topo = d.node.cpu_topology
    assert topo.socket_ids == (0, 1) and topo.numa_ids == (0, 1, 2, 3)
    assert len({c.core for c in topo.cpus}) == 8
    assert by_id(d)[9] == (0, 1, 0)  # second thread of core 1
    assert d.node.allocatable["memory"] == 4 * 1024 * 1024 * 1024


def test_offline_cpus_are_left_out(tmp_path: Path) -> None:
    make_sysfs(tmp_path, cores_per_numa=4, threads=2, offline=(5,))
    d = discover("n", root=tmp_path, load=no_nvml)
    assert d.online == CPUSet("0-4,6-7")
    assert 5 not in d.node.cpu_topology.all_cpus


def test_missing_numa_and_topology_are_reported_not_fatal(tmp_path: Path) -> None:
    for cpu in range(2):
        (tmp_path / f"sys/devices/system/cpu/cpu{cpu}").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:  1000 kB\nMemFree: 10 kB\n")
    d = discover("bare", root=tmp_path, load=no_nvml)
    assert d.online == CPUSet("0-1")
    assert "cpu.online" in d.sources and d.sources["numa"].startswith("absent")
    assert "no topology for CPUs 0-1" in d.sources["cpu"]
    assert d.node.allocatable["memory"] == 1000 * 1024
    assert {c.numa for c in d.node.cpu_topology.cpus} == {0}


def test_eight_gpus_with_nvlink_pairs(tmp_path: Path) -> None:
    make_sysfs(tmp_path, sockets=2, cores_per_numa=4, threads=2)
    d = discover("g8", root=tmp_path, nvml=fake_nvml(eight_gpus(tmp_path)))
    gpus = d.node.devices_of("gpu")
    assert [g.minor for g in gpus] == list(range(8))
    assert [g.numa for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]  # from sysfs numa_node
    assert gpus[3].uuid == "GPU-00000003-aaaa" and gpus[3].pcie == "pci0000:20"
    assert gpus[0].resources["gpu-memory"] == 80 * 2**30 and gpus[0].resources["gpu-core"] == 100
    assert all(g.health for g in gpus)
    assert [(link.a, link.b) for link in d.node.links] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert d.sources["gpu"] == "ok: 8 device(s)"


def test_gpu_errors_mark_it_unhealthy_and_nvml_numa_is_a_fallback(tmp_path: Path) -> None:
    make_sysfs(tmp_path, sockets=2, cores_per_numa=2)
    gpus = [
        FakeGPU("GPU-a", 0, 16 * 2**30, "00000000:3B:00.0", numa=1),
        FakeGPU("GPU-b", 1, 16 * 2**30, "00000000:5E:00.0", numa=7, broken=True),  # numa 7 does not exist
    ]
    d = discover("g2", root=tmp_path, nvml=fake_nvml(gpus))
    a, b = d.node.devices_of("gpu")
    assert (a.health, a.numa) == (True, 1)
    assert (b.health, b.numa, b.uuid) == (False, None, None)
    assert "GPU 1: unhealthy (GPU is lost)" in d.sources["gpu"]
    assert d.healthy("gpu", 1) is False and d.healthy("gpu", 9) is None


def test_nvml_count_failure_is_reported(tmp_path: Path) -> None:
    make_sysfs(tmp_path)
    d = discover("g0", root=tmp_path, nvml=fake_nvml([], count_fails=True))
    assert d.node.devices == () and "Driver Not Loaded" in d.sources["gpu"]


def test_rdma_ports_and_numa(tmp_path: Path) -> None:
    make_sysfs(tmp_path, sockets=2, cores_per_numa=2)
    add_hca(tmp_path, "mlx5_0", "0000:3b:00.0", numa=0, states=["4: ACTIVE"], host="pci0000:3a")
    add_hca(tmp_path, "mlx5_1", "0000:af:00.0", numa=1, states=["1: DOWN", "1: DOWN"], host="pci0000:ae")
    d = discover("r", root=tmp_path, load=no_nvml)
    r0, r1 = d.node.devices_of("rdma")
    assert (r0.minor, r0.numa, r0.health, r0.pcie) == (0, 0, True, "pci0000:3a")
    assert (r1.minor, r1.numa, r1.health, r1.pcie) == (1, 1, False, "pci0000:ae")
    assert d.rdma_names == {0: "mlx5_0", 1: "mlx5_1"}
    assert d.sources["rdma"] == "ok: 2 device(s)"


def test_pci_numa_minus_one_means_unknown(tmp_path: Path) -> None:
    make_sysfs(tmp_path)
    add_pci(tmp_path, "0000:3b:00.0", numa=-1)
    d = discover("u", root=tmp_path, nvml=fake_nvml([FakeGPU("GPU-x", 0, 2**30, "00000000:3B:00.0")]))
    assert d.node.devices[0].numa is None


@pytest.mark.parametrize(
    ("raw", "want"),
    [("00000000:3B:00.0", "0000:3b:00.0"), (b"00000000:AF:00.0", "0000:af:00.0"), ("0000:3b:00.0", "0000:3b:00.0")],
)
def test_normalize_bus_id(raw: str | bytes, want: str) -> None:
    assert normalize_bus_id(raw) == want


@pytest.mark.skipif(not Path("/sys/devices/system/cpu/online").exists(), reason="needs Linux sysfs")
def test_this_machine() -> None:
    d = discover(load=no_nvml)
    assert set(d.online) >= os.sched_getaffinity(0)
    assert d.node.cpu_topology is not None
    assert set(d.node.cpu_topology.all_cpus) == set(d.online)
    assert d.node.allocatable["cpu"] == 1000 * len(d.online)
    assert d.node.allocatable["memory"] > 0
