"""MIG through the control plane: a grant is the profile and count asked for (the reported case: after
a 7g was deleted, two 1g.10gb got one 7g), and the what-if plan shows a MIG grant as the binding does."""

from __future__ import annotations

from typing import Any

from manifests import API, workload
from server_harness import Api


def mig_node(name: str) -> dict[str, Any]:
    device = {"type": "gpu", "minor": 0, "uuid": f"GPU-{name}", "mig": {"product": "H100-80GB", "mode": "dynamic"}}
    spec = {"allocatable": {"cpu": "32", "memory": "64Gi"}, "devices": [device]}
    return {"apiVersion": API, "kind": "Node", "metadata": {"name": name}, "spec": spec}


def mig_workload(name: str, profile: str, count: int) -> dict[str, Any]:
    return workload(name, requests={"cpu": "1", f"nvidia.com/mig-{profile}": count})


def mig_grants(devices: dict[str, Any]) -> list[tuple[int, str, int]]:
    return [(g["minor"], g["mig"]["profile"], g["mig"]["start"]) for g in devices["gpu"]]


def test_after_a_7g_is_deleted_two_1g_get_two_1g(api: Api) -> None:
    assert api.admin.post("/v1/nodes", json=mig_node("h1")).status_code == 201
    assert api.admin.post("/v1/workloads", json=mig_workload("big", "7g.80gb", 1)).status_code == 201
    big = api.wait_phase("team-a/big", ("Bound",))["status"]["binding"]
    assert mig_grants(big["devices"]) == [(0, "7g.80gb", 0)]
    assert api.admin.delete("/v1/workloads/team-a/big").json()["released"] is True
    assert api.admin.post("/v1/workloads", json=mig_workload("pair", "1g.10gb", 2)).status_code == 201
    pair = api.wait_phase("team-a/pair", ("Bound",))["status"]["binding"]
    assert mig_grants(pair["devices"]) == [(0, "1g.10gb", 4), (0, "1g.10gb", 6)]
    # the card now holds the two 1g: a 7g waits, a third 1g.10gb takes a slice of its own
    api.admin.post("/v1/workloads", json=[mig_workload("big2", "7g.80gb", 1), mig_workload("one", "1g.10gb", 1)])
    one = api.wait_phase("team-a/one", ("Bound",))["status"]["binding"]
    assert mig_grants(one["devices"]) == [(0, "1g.10gb", 5)]
    assert api.admin.get("/v1/workloads/team-a/big2").json()["status"]["phase"] == "Pending"


def test_the_plan_shows_the_mig_grant_as_the_binding_does(api: Api) -> None:
    assert api.admin.post("/v1/nodes", json=mig_node("h1")).status_code == 201
    answer = api.admin.post("/v1/plan", json=[mig_workload("small", "1g.20gb", 1)])
    assert answer.status_code == 200, answer.text
    (record,) = answer.json()["results"]
    grant = {"minor": 0, "resources": {}, "mig": {"profile": "1g.20gb", "start": 6, "uuid": None}}
    assert record["devices"] == {"gpu": [grant]}
    api.admin.post("/v1/workloads", json=mig_workload("small", "1g.20gb", 1))
    bound = api.wait_phase("team-a/small", ("Bound",))["status"]["binding"]
    assert bound["devices"] == record["devices"]  # one serializer for both
