"""Kueue's TAS annotations through the extender: members of a pod group end in one domain.

The extender runs as a process (``finesched k8s-extender --cluster NODES --topology TOPOLOGY``) and
is driven the way kube-scheduler drives it: filter, prioritize, then bind the best-scored feasible
node, one member after the other. Kueue's Topology objects are read from the in-process API server
(tests/k8s/fakeapi.py) through the real kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fakeapi import FakeAPI
from kubernetes import client
from test_api import device_cr, k8s_node, nrt
from test_k8s_cli import serve

from finesched.k8s import wire
from finesched.k8s.api import KubeAPI
from finesched.k8s.kueue import (
    GROUP_INDEX,
    GROUP_NAME,
    GROUP_TOTAL,
    PREFERRED,
    REQUIRED,
    SLICE_REQUIRED,
    SLICE_SIZE,
    TOPOLOGY_NAME,
    UNCONSTRAINED,
)
from finesched.k8s.setup import build_extender
from finesched.k8s.sync import ClusterSync
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL

TOPOLOGY = {
    "apiVersion": "finesched.io/v1alpha1",
    "kind": "Topology",
    "metadata": {"name": "dc"},
    "spec": {"levels": [{"nodeLabel": BLOCK_LABEL}, {"nodeLabel": RACK_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]},
}


def node(name: str, rack: str | None, used: list[int]) -> dict[str, Any]:
    """A node with one GPU per entry of `used` (that many percent taken by pods outside finesched)."""
    labels = {HOSTNAME_LABEL: name, BLOCK_LABEL: "b1"}
    if rack is not None:
        labels[RACK_LABEL] = rack
    card = {"gpu-core": 100, "gpu-memory": "80Gi", "gpu-memory-ratio": 100}
    devices = [{"type": "gpu", "minor": m, "uuid": f"GPU-{name}-{m}", "resources": card} for m in range(len(used))]
    taken = [
        {"type": "gpu", "minor": m, "resources": {"gpu-core": u, "gpu-memory-ratio": u}}
        for m, u in enumerate(used)
        if u
    ]
    spec = {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}, "devices": devices}
    if taken:
        spec["foreignAllocations"] = taken
    return {"apiVersion": "finesched.io/v1alpha1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": spec}  # fmt: skip


def pod(name: str, annotations: dict[str, str], *, labels: dict[str, str] | None = None, share: int = 100) -> dict:
    amounts = {"cpu": "2", "memory": "8Gi", "koordinator.sh/gpu-core": str(share),
               "koordinator.sh/gpu-memory-ratio": str(share)}  # fmt: skip
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": labels or {},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": amounts, "limits": amounts}}]},
    }


def member(group: str, i: int, count: int, asks: dict[str, str], share: int = 100) -> dict[str, Any]:
    labels = {GROUP_NAME: group, GROUP_INDEX: str(i)}
    return pod(f"{group}-{i}", {GROUP_TOTAL: str(count), **asks}, labels=labels, share=share)


def start(tmp_path: Path, nodes: list[dict[str, Any]]) -> Iterator[str]:
    cluster, topology = tmp_path / "nodes.yaml", tmp_path / "topology.yaml"
    cluster.write_text(yaml.safe_dump_all(nodes))
    topology.write_text(yaml.safe_dump(TOPOLOGY))
    yield from serve("--cluster", str(cluster), "--topology", str(topology))


class KubeScheduler:
    """kube-scheduler's side: filter, prioritize, bind the best feasible node (ties: by name)."""

    def __init__(self, url: str, names: list[str]):
        self.url, self.names = url, names

    def filter(self, doc: dict[str, Any]) -> dict[str, Any]:
        return httpx.post(f"{self.url}/filter", json={"Pod": doc, "NodeNames": self.names}).json()

    def schedule(self, doc: dict[str, Any]) -> str:
        body = self.filter(doc)
        assert body["Error"] == "" and body["NodeNames"], body
        prio = httpx.post(f"{self.url}/prioritize", json={"Pod": doc, "NodeNames": self.names}).json()
        scores = {p["Host"]: p["Score"] for p in prio}
        chosen = min(body["NodeNames"], key=lambda n: (-scores[n], n))
        meta = doc["metadata"]
        reply = httpx.post(
            f"{self.url}/bind",
            json={"PodName": meta["name"], "PodNamespace": "ml", "PodUID": meta["uid"], "Node": chosen},
        )
        assert reply.json()["Error"] == "", reply.json()
        return chosen


# Members end in one rack -------------------------------------------------------------------------------------
TWO_RACKS = {"a1": ("r1", [100, 0]), "a2": ("r1", [0, 0]), "c1": ("r2", [0, 0]), "c2": ("r2", [0, 0])}


@pytest.fixture
def two_racks(tmp_path: Path) -> Iterator[KubeScheduler]:
    """Rack r1 holds three whole GPUs (a1's first is taken), rack r2 four."""
    nodes = [node(name, rack, used) for name, (rack, used) in TWO_RACKS.items()]
    for url in start(tmp_path, nodes):
        yield KubeScheduler(url, list(TWO_RACKS))


@pytest.mark.parametrize("ask", [REQUIRED, PREFERRED])
def test_four_whole_gpu_members_end_in_the_rack_that_holds_them_all(two_racks: KubeScheduler, ask: str) -> None:
    placed = [two_racks.schedule(member("train", i, 4, {ask: RACK_LABEL})) for i in range(4)]
    assert sorted(placed) == ["c1", "c1", "c2", "c2"]


def test_a_later_member_is_kept_to_the_rack_of_the_bound_ones(two_racks: KubeScheduler) -> None:
    asks = {REQUIRED: RACK_LABEL}
    first = two_racks.schedule(member("train", 0, 4, asks))
    rack = TWO_RACKS[first][0]
    body = two_racks.filter(member("train", 1, 4, asks))
    assert {TWO_RACKS[n][0] for n in body["NodeNames"]} == {rack}
    outside = [n for n in TWO_RACKS if TWO_RACKS[n][0] != rack]
    for name in outside:
        assert f"outside {RACK_LABEL} b1/{rack}, the domain of gang train" in body["FailedNodes"][name]
    # bind to a node outside the rack (kube-scheduler would not; two members raced): refused
    meta = member("train", 1, 4, asks)["metadata"]
    reply = httpx.post(f"{two_racks.url}/bind", json={"PodName": meta["name"], "PodNamespace": "ml",
                                                      "PodUID": meta["uid"], "Node": outside[0]}).json()  # fmt: skip
    assert "outside" in reply["Error"] and RACK_LABEL in reply["Error"]


def test_slices_keep_each_pair_on_one_host(two_racks: KubeScheduler) -> None:
    asks = {REQUIRED: RACK_LABEL, SLICE_REQUIRED: HOSTNAME_LABEL, SLICE_SIZE: "2"}
    placed = [two_racks.schedule(member("pairs", i, 4, asks)) for i in range(4)]
    assert placed[0] == placed[1] and placed[2] == placed[3]
    assert {TWO_RACKS[n][0] for n in placed} == {"r2"}


def test_a_later_member_preempts_only_inside_the_domain_of_the_bound_ones(two_racks: KubeScheduler) -> None:
    """kube-scheduler proposes victims on nodes of both racks; the member fits on either once they
    are gone, but only the candidate inside its gang's rack is kept (evictions stay in one domain)."""
    asks = {REQUIRED: RACK_LABEL}
    first = two_racks.schedule(member("train", 0, 4, asks))
    rack = TWO_RACKS[first][0]
    inside = next(n for n in TWO_RACKS if TWO_RACKS[n][0] == rack and n != first)
    outside = next(n for n in TWO_RACKS if TWO_RACKS[n][0] != rack)
    victims = {n: {"Pods": [{"UID": f"elsewhere-{n}"}], "NumPDBViolations": 0} for n in (inside, outside)}
    request = {"Pod": member("train", 1, 4, asks), "NodeNameToMetaVictims": victims}
    reply = httpx.post(f"{two_racks.url}/preempt", json=request).json()
    assert set(reply["NodeNameToMetaVictims"]) == {inside}, reply


# GPU shares, not scalar counts, decide the rack ---------------------------------------------------------------
SHARES = {
    # r1: four cards per node, each 60% taken: 160% free per node, so a scalar count of gpu-core
    # (Kueue's estimate) holds 3 half-card members per node, 6 in the rack; no card has 50% free.
    "a1": ("r1", [60, 60, 60, 60]),
    "a2": ("r1", [60, 60, 60, 60]),
    # r2: two free cards per node: 4 halves per node, 8 in the rack.
    "c1": ("r2", [0, 0]),
    "c2": ("r2", [0, 0]),
}


def test_a_rack_that_holds_the_scalar_count_but_not_the_shares_is_avoided(tmp_path: Path) -> None:
    free = {rack: 0 for rack, _ in SHARES.values()}
    for rack, used in SHARES.values():
        free[rack] += sum(100 - u for u in used)
    scalar = {rack: total // 50 for rack, total in free.items()}
    # Kueue's BestFit on scalar counts: the tightest rack that holds 4 is r1
    assert scalar == {"r1": 6, "r2": 8} and min((c, r) for r, c in scalar.items() if c >= 4)[1] == "r1"
    nodes = [node(name, rack, used) for name, (rack, used) in SHARES.items()]
    for url in start(tmp_path, nodes):
        scheduler = KubeScheduler(url, list(SHARES))
        asks = {REQUIRED: RACK_LABEL}
        body = scheduler.filter(member("half", 0, 4, asks, share=50))
        assert "a1" in body["FailedNodes"] and "a2" in body["FailedNodes"]
        placed = [scheduler.schedule(member("half", i, 4, asks, share=50)) for i in range(4)]
        assert {SHARES[n][0] for n in placed} == {"r2"}


def test_a_gang_no_rack_holds_is_refused_on_every_node_with_the_reason(two_racks: KubeScheduler) -> None:
    body = two_racks.filter(member("big", 0, 6, {REQUIRED: RACK_LABEL}))
    assert body["NodeNames"] == [] and set(body["FailedNodes"]) == set(TWO_RACKS)
    assert all(reason for reason in body["FailedNodes"].values())


# Bad annotation values ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeScheduler]:
    """Two nodes in rack r1 and one node without a rack label (filter only: nothing changes)."""
    nodes = [node("a1", "r1", [0, 0]), node("a2", "r1", [0, 0]), node("loose", None, [0, 0])]
    for url in start(tmp_path_factory.mktemp("loose"), nodes):
        yield KubeScheduler(url, ["a1", "a2", "loose"])


GROUP = {GROUP_NAME: "g"}
BAD = [
    ({REQUIRED: "Not A Label!"}, {}, [REQUIRED, "'Not A Label!'", "label key"]),
    ({REQUIRED: RACK_LABEL, PREFERRED: RACK_LABEL}, {}, [REQUIRED, PREFERRED, "not both"]),
    ({UNCONSTRAINED: "yes"}, {}, [UNCONSTRAINED, "'yes'", '"true" or "false"']),
    ({UNCONSTRAINED: "true", REQUIRED: RACK_LABEL}, {}, [UNCONSTRAINED, REQUIRED]),
    ({REQUIRED: RACK_LABEL, SLICE_REQUIRED: HOSTNAME_LABEL}, {}, [SLICE_REQUIRED, f"needs annotation {SLICE_SIZE}"]),
    ({REQUIRED: RACK_LABEL, SLICE_SIZE: "2"}, {}, [SLICE_SIZE, f"needs annotation {SLICE_REQUIRED}"]),
    ({SLICE_REQUIRED: HOSTNAME_LABEL, SLICE_SIZE: "1"}, {}, [SLICE_REQUIRED, f"needs {REQUIRED}"]),
    ({REQUIRED: RACK_LABEL, SLICE_REQUIRED: HOSTNAME_LABEL, SLICE_SIZE: "0"}, {}, [SLICE_SIZE, "'0'", "integer"]),
    ({REQUIRED: RACK_LABEL, SLICE_REQUIRED: HOSTNAME_LABEL, SLICE_SIZE: "3", GROUP_TOTAL: "4"}, GROUP,
     [SLICE_SIZE, "3", f"must divide {GROUP_TOTAL} (4)"]),
    ({REQUIRED: RACK_LABEL, SLICE_REQUIRED: BLOCK_LABEL, SLICE_SIZE: "2", GROUP_TOTAL: "4"}, GROUP,
     [SLICE_REQUIRED, repr(BLOCK_LABEL), "finer"]),
    ({REQUIRED: RACK_LABEL}, GROUP, [GROUP_NAME, f"needs annotation {GROUP_TOTAL}"]),
    ({REQUIRED: RACK_LABEL, GROUP_TOTAL: "many"}, GROUP, [GROUP_TOTAL, "'many'", "integer"]),
    ({REQUIRED: "example.com/row"}, {}, [REQUIRED, "'example.com/row'", "not a level of any topology", "dc"]),
    ({REQUIRED: RACK_LABEL, TOPOLOGY_NAME: "other"}, {}, [TOPOLOGY_NAME, "'other'", "not a topology"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "annotations", "labels", "words"), [(i, *bad) for i, bad in enumerate(BAD)])
def test_bad_annotations_refuse_the_pod_naming_annotation_value_and_rule(
    loose: KubeScheduler, case: int, annotations: dict[str, str], labels: dict[str, str], words: list[str]
) -> None:
    body = loose.filter(pod(f"bad-{case}", annotations, labels=labels))
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    reasons = set(body["FailedAndUnresolvableNodes"].values())
    assert len(reasons) == 1
    (reason,) = reasons
    assert reason.startswith("invalid pod: ")
    for word in words:
        assert word in reason, (word, reason)


def test_unconstrained_and_groupless_pods(loose: KubeScheduler) -> None:
    assert loose.filter(pod("free", {UNCONSTRAINED: "true"}))["NodeNames"] == ["a1", "a2", "loose"]
    # no group label: placed alone; a required level keeps it to nodes that carry the label
    body = loose.filter(pod("alone", {REQUIRED: RACK_LABEL}))
    assert body["NodeNames"] == ["a1", "a2"] and RACK_LABEL in body["FailedNodes"]["loose"]
    assert loose.filter(pod("alone-p", {PREFERRED: RACK_LABEL}))["NodeNames"] == ["a1", "a2", "loose"]


# Kueue's Topology objects from the API server -----------------------------------------------------------------
def kueue_topology(name: str, *labels: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": label} for label in labels]}}  # fmt: skip


@pytest.fixture
def fake() -> Iterator[FakeAPI]:
    with FakeAPI() as api:
        for name, rack in (("gpu-node-a", "r1"), ("gpu-node-b", "r2"), ("gpu-node-c", "r2")):
            doc = k8s_node(name)
            doc["metadata"]["labels"]["cloud.provider.com/topology-rack"] = rack
            api.put("nodes", doc)
            api.put("devices", device_cr(name))
            api.put("noderesourcetopologies", nrt(name))
        yield api


def start_sync(fake: FakeAPI) -> tuple[Any, ClusterSync]:
    configuration = client.Configuration()
    configuration.host = fake.url
    api = KubeAPI(client.ApiClient(configuration), request_timeout=5)
    extender = build_extender(binder=api, assume_ttl=30)
    sync = ClusterSync(extender, api)
    extender.pod_source = sync.pod
    sync.sync_all()
    return extender, sync


def test_kueue_topology_objects_are_read_watched_and_pick_the_topology_of_the_level(fake: FakeAPI) -> None:
    rack = "cloud.provider.com/topology-rack"
    fake.put("topologies", kueue_topology("zz-racks", rack, HOSTNAME_LABEL))
    fake.put("topologies", kueue_topology("aa-racks", rack))
    fake.put("topologies", kueue_topology("broken", "Not A Label!"))
    extender, sync = start_sync(fake)
    assert sorted(extender.scheduler.topologies) == ["aa-racks", "zz-racks"]
    assert list(sync.topology_problems) == ["broken"] and "levels.0.nodeLabel" in sync.topology_problems["broken"]
    names = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]
    share = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}

    def gang_member(i: int, asks: dict[str, str], prefix: str = "k") -> dict[str, Any]:
        doc = pod(f"{prefix}-{i}", {GROUP_TOTAL: "4", **asks}, labels={GROUP_NAME: "k", GROUP_INDEX: str(i)})
        doc["spec"]["containers"][0]["resources"] = {"requests": share, "limits": share}
        return doc

    # the first topology by name that has the level: aa-racks; with the hostname slice: zz-racks
    workload, _ = extender.workload_and_ask(gang_member(0, {REQUIRED: rack}))
    assert workload.gang is not None and workload.gang.topology is not None
    assert workload.gang.topology.name == "aa-racks" and workload.gang.min_member == 4
    sliced = {REQUIRED: rack, SLICE_REQUIRED: HOSTNAME_LABEL, SLICE_SIZE: "2"}
    workload, _ = extender.workload_and_ask(gang_member(0, sliced, prefix="s"))
    assert workload.gang is not None and workload.gang.topology is not None
    assert workload.gang.topology.name == "zz-racks"
    # four half-GPU members: gpu-node-a (rack r1, 2 cards) holds 4, r2 holds 8; both fit
    result = extender.filter(wire.extender_args({"Pod": gang_member(0, {REQUIRED: rack}), "NodeNames": names}))
    assert result["NodeNames"] and result["Error"] == ""
    # the objects are watched: deleting the topologies makes the level unknown
    fake.delete("topologies", "aa-racks")
    fake.delete("topologies", "zz-racks")
    sync.watch_once("topologies", timeout_seconds=1)
    assert extender.scheduler.topologies == {}
    result = extender.filter(wire.extender_args({"Pod": gang_member(1, {REQUIRED: rack}), "NodeNames": names}))
    assert result["NodeNames"] == []
    assert all("not a level of any topology" in r for r in result["FailedAndUnresolvableNodes"].values())


def test_an_absent_kueue_crd_is_no_error(fake: FakeAPI) -> None:
    fake.missing.add("topologies")
    extender, sync = start_sync(fake)
    assert extender.scheduler.topologies == {} and sync.topology_problems == {}
    assert sorted(extender.state.names) == ["gpu-node-a", "gpu-node-b", "gpu-node-c"]


def test_manifest_topologies_win_a_name_kueue_also_uses(fake: FakeAPI) -> None:
    fake.put("topologies", kueue_topology("dc", "cloud.provider.com/topology-rack"))
    extender, _ = start_sync(fake)
    assert extender.scheduler.topologies["dc"].labels == ("cloud.provider.com/topology-rack",)
    from finesched.model.topology import Topology

    mine = Topology.model_validate(TOPOLOGY["spec"] | {"name": "dc"})
    extender.set_topologies("manifests", [mine])
    assert extender.scheduler.topologies["dc"] == mine
    assert json.dumps(sorted(extender.scheduler.topologies)) == '["dc"]'
