"""The console's server side: pages and assets from the package, and the /ui/api summaries (overview,
node map, one node to the device and logical CPU) behind the API's own authorization."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from manifests import node, topology, workload
from server_harness import Api, add_topology, wait_until

from finesched.codec import encode
from finesched.cpuset import CPUSet
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL


def share(name: str, core: int, namespace: str = "team-a", **spec: object) -> dict:
    return workload(
        name, namespace=namespace, requests={"cpu": "1", "gpu-core": core, "gpu-memory-ratio": core}, **spec
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_pages_and_assets_come_from_the_package(api: Api) -> None:
    anonymous = api.client(None)
    page = anonymous.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert anonymous.get("/ui/nodes/any/deep").text == page.text  # every page is the one shell
    script = anonymous.get("/ui/static/main.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert anonymous.get("/ui/static/main.js", headers={"If-None-Match": script.headers["etag"]}).status_code == 304
    assert anonymous.get("/ui/static/%2e%2e%2fapp.py").status_code == 404  # only the packaged names
    assert anonymous.get("/ui/static/nope.js").status_code == 404
    assert anonymous.get("/ui/api/overview").status_code == 401  # data needs a token
    assert anonymous.get("/ui/api/nope").status_code == 404
    # Nothing is fetched from elsewhere: no URL in any asset but the SVG namespace.
    root = resources.files("finesched.server.console")
    for entry in [*(root / "static").iterdir(), root / "templates" / "console.html"]:
        text = entry.read_text(encoding="utf-8")
        assert not re.findall(r"https?://(?!www\.w3\.org/2000/svg)", text), entry.name


def test_overview_counts_fragmentation_reasons_and_tenants(api: Api) -> None:
    for name in ("g1", "c1"):
        api.admin.post("/v1/nodes", json=node(name, gpus=2 if name == "g1" else 0))
    api.admin.post("/v1/nodes/c1/cordon")
    # On g1: one GPU taken whole, 70 % of the other. The typical request is learned from these two
    # (a 70 % share and a whole GPU): neither fits the 30 % left, so all of it is fragmented (FGD).
    api.admin.post("/v1/workloads", json=[share("whole", 100), share("most", 70, namespace="team-b")])
    api.wait_phase("team-a/whole", ("Bound",))
    api.wait_phase("team-b/most", ("Bound",))
    api.admin.post("/v1/workloads", json=workload("huge", cpu="64"))
    overview = lambda client: client.get("/ui/api/overview").json()  # noqa: E731
    tried = lambda: any(g["reason"] == "insufficient cpu" for g in overview(api.admin)["pending"]["byReason"])  # noqa: E731
    wait_until(tried, what="the scheduler's reasons (before its first try: not decided yet)")
    data = overview(api.admin)
    assert {k: data["nodes"][k] for k in ("total", "ready", "notReady", "cordoned")} == {
        "total": 2, "ready": 2, "notReady": 0, "cordoned": 1,
    }  # fmt: skip
    assert data["nodes"]["attention"] == [{"name": "c1", "ready": True, "cordoned": True}]
    resources_ = {r["name"]: r for r in data["resources"]}
    assert resources_["gpu-core"]["allocatable"] == 200 and resources_["gpu-core"]["allocated"] == 170
    assert resources_["cpu"]["shown"]["allocated"] == "2"
    frag = data["fragmentation"]
    assert frag["idleGPUs"] == pytest.approx(0.3) and frag["fragmentedGPUs"] == pytest.approx(0.3)
    assert frag["usableGPUs"] == pytest.approx(0.0) and frag["fragmentedShare"] == 1.0 and frag["typicalLearned"]
    # huge waits: g1 has too few CPUs, c1 is cordoned (the scheduler's reasons, with its node counts)
    groups = {g["reason"]: (g["workloads"], g["nodes"], g["examples"]) for g in data["pending"]["byReason"]}
    assert groups.pop("insufficient cpu") == (1, 2, ["team-a/huge"])  # c1 too: every filter's reasons count
    ((reason, counts),) = groups.items()
    assert "cordoned" in reason and counts == (1, 1, ["team-a/huge"])
    assert data["pending"]["total"] == 1
    tenants = {t["name"]: t for t in data["tenants"]}
    assert tenants["team-a"]["dominantShare"] == pytest.approx(0.5)  # gpu-core 100 of 200
    assert tenants["team-b"]["dominantShare"] == pytest.approx(0.35)  # 70 of 200
    # A tenant sees the nodes and the cluster's figures, but only its own waiting work and share.
    team_b = overview(api.client(api.token("tenant", tenant="team-b")))
    assert team_b["nodes"]["total"] == 2 and team_b["pending"] == {"total": 0, "byReason": []}
    assert [t["name"] for t in team_b["tenants"]] == ["team-b"]
    # Nor the shapes or counts of the others' work: its typical request is learned from its own.
    shapes = lambda frag: [(t["gpuMilli"], t["gpuCount"], t["count"]) for t in frag["typical"]]  # noqa: E731
    assert sorted(shapes(frag)) == [(700, 1, 1), (1000, 1, 1)] and frag["typicalFrom"] == "cluster"
    assert shapes(team_b["fragmentation"]) == [(700, 1, 1)] and team_b["fragmentation"]["typicalFrom"] == "tenant"
    team_a = overview(api.client(api.token("tenant", tenant="team-a")))
    assert shapes(team_a["fragmentation"]) == [(1000, 1, 1)]
    agent = api.client(api.token("agent", node="g1"))
    assert agent.get("/ui/api/overview").status_code == 403
    nodes = api.admin.get("/ui/api/nodes").json()
    assert nodes["names"] == ["c1", "g1"] and nodes["cordoned"] == [True, False]
    assert nodes["gpu"] == [-1, 85]  # c1 has no GPU; g1: 170 of 200 gpu-core


def test_node_page_matches_the_node_and_its_bindings(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cores=4, gpus=2))
    agent = api.client(api.token("agent", node="n1"))
    # GPU 1 is 60 % used outside finesched (the agent's S0.2 report); nothing is unhealthy.
    report = {"devices": {"gpu": {"gpu-core": {"k": encode([100, 40], 7), "count": 2, "bits": 7}}}}
    assert agent.post("/v1/nodes/n1/report", json=report).status_code == 200
    amounts = {"cpu": "2", "memory": "1Gi"}
    db = workload("db", requests=amounts, limits=amounts, qos="LSE")
    api.admin.post("/v1/workloads", json=[db, share("infer", 30, namespace="team-b")])
    db_bound = api.wait_phase("team-a/db", ("Bound",))
    api.wait_phase("team-b/infer", ("Bound",))
    page = api.admin.get("/ui/api/nodes/n1").json()
    # Devices: exactly the bindings' grants, the foreign use the agent reported, and what is free.
    bindings = api.admin.get("/v1/bindings", params={"node": "n1"}).json()["items"]
    grants = {(b["workload"], kind, g["minor"]): int(g["resources"]["gpu-core"])
              for b in bindings for kind, gs in b["devices"].items() for g in gs}  # fmt: skip
    drawn = {(h["workload"], d["type"], d["minor"]): h["resources"]["gpu-core"] for d in page["devices"]
             for h in d["holders"]}  # fmt: skip
    assert drawn == grants == {("team-b/infer", "gpu", 0): 30}
    gpu1 = next(d for d in page["devices"] if d["minor"] == 1)
    assert gpu1["foreign"] == {"gpu-core": 60} and gpu1["free"]["gpu-core"] == 40 and gpu1["healthy"]
    # CPUs: the LSE cpuset held by db, in no BE pool; every other CPU shared (LS) and in the BE pool.
    cpuset = CPUSet.parse(db_bound["status"]["binding"]["cpuset"])
    held = {c["id"] for c in page["cpus"] if c["holder"] == "team-a/db"}
    assert held == set(cpuset) and all(c["pool"] == "LSE" and not c["be"] for c in page["cpus"] if c["id"] in held)
    assert all(c["pool"] == "LS" and c["be"] for c in page["cpus"] if c["id"] not in held)
    assert len(page["cpus"]) == 8 and {c["socket"] for c in page["cpus"]} == {0}
    assert page["pools"]["exclusive"] == str(cpuset) and page["pools"]["ls"] == ["team-b/infer"]
    assert page["report"]["sent"]["devices"] == report["devices"]
    assert page["report"]["decoded"] == {"gpu": {"gpu-core": {"0": 100, "1": 40}}}
    # A tenant sees the node, its own workload by name, and another tenant's only as held.
    mine = api.client(api.token("tenant", tenant="team-a")).get("/ui/api/nodes/n1").json()
    assert {c["holder"] for c in mine["cpus"] if c["id"] in held} == {"team-a/db"}
    assert [h["workload"] for d in mine["devices"] for h in d["holders"]] == [None]
    assert mine["pools"]["ls"] == [None] and {w["workload"] for w in mine["workloads"]} == {"team-a/db", None}
    assert api.admin.get("/ui/api/nodes/nope").status_code == 404


def test_a_tenant_reads_no_other_tenants_names_or_the_agents_notes_in_a_node_report(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cores=4))
    agent = api.client(api.token("agent", node="n1"))
    pinned = [{"namespace": ns, "name": name, "cpuset": cpus, "qos": "LSR", "pool": None}
              for ns, name, cpus in (("team-a", "db", "0"), ("team-b", "secret-project", "1"))]  # fmt: skip
    report = {
        "podCPUAllocs": pinned,
        "workloadCPUs": pinned,
        "discovery": {"sources": {"gpu": "not found"}, "agentPid": 4242, "logs": {"url": "http://127.0.0.1:1"},
                      "tenantIsolation": {"isolated": False, "reason": "the agent runs as uid 1000, not root",
                                          "allowTenantSharing": False}},
    }  # fmt: skip
    assert agent.post("/v1/nodes/n1/report", json=report).status_code == 200
    amounts = {"cpu": "1", "memory": "1Gi"}
    api.admin.post("/v1/workloads", json=workload("db", requests=amounts, limits=amounts, qos="LSR"))
    api.wait_phase("team-a/db", ("Bound",))
    sent = api.admin.get("/ui/api/nodes/n1").json()["report"]["sent"]
    assert sent["podCPUAllocs"] == pinned and sent["discovery"]["agentPid"] == 4242  # the admin reads it all
    page = api.client(api.token("tenant", tenant="team-a")).get("/ui/api/nodes/n1").json()
    isolation = page["status"]["isolation"]  # whether the node keeps tenants apart is no secret
    assert isolation["status"] == "False" and "uid 1000" in isolation["message"]
    mine = page["report"]["sent"]
    for part in ("podCPUAllocs", "workloadCPUs"):
        assert [(e["namespace"], e["name"], e["cpuset"]) for e in mine[part]] == [
            ("team-a", "db", "0"), (None, None, "1")
        ]  # fmt: skip
    assert mine["discovery"] == {"sources": {"gpu": "not found"}}
    assert "secret-project" not in str(mine) and "team-b" not in str(mine)


def test_node_map_grouped_by_a_topologys_domains(api: Api) -> None:
    # Rack r1 of block b1: a1 (2 GPUs) and a2; rack r2: b1n; x1 has no rack label: outside every rack.
    place = {"a1": "r1", "a2": "r1", "b1n": "r2"}
    for name, rack in place.items():
        labels = {BLOCK_LABEL: "b1", RACK_LABEL: rack, HOSTNAME_LABEL: name}
        api.admin.post("/v1/nodes", json=node(name, gpus=2 if name == "a1" else 0, **labels))
    api.admin.post("/v1/nodes", json=node("x1", **{BLOCK_LABEL: "b1"}))
    add_topology(api, topology("dc", BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL))
    api.admin.post("/v1/workloads", json=share("infer", 50, nodeSelector={"finesched.io/hostname": "a1"}))
    api.wait_phase("team-a/infer", ("Bound",))
    plain = api.admin.get("/ui/api/nodes").json()
    assert plain["topologies"] == [{"name": "dc", "levels": [BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL]}]
    assert "groups" not in plain
    answer = api.admin.get("/ui/api/nodes", params={"topology": "dc", "level": RACK_LABEL})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["names"] == plain["names"] == ["a1", "a2", "b1n", "x1"]
    groups = data["groups"]
    assert (groups["topology"], groups["level"]) == ("dc", RACK_LABEL)
    named = {d["name"]: d for d in groups["domains"]}
    assert list(named) == ["b1/r1", "b1/r2"]  # domains by their label values, top level down
    assert {k: [data["names"][i] for i in d["members"]] for k, d in named.items()} == {
        "b1/r1": ["a1", "a2"], "b1/r2": ["b1n"],
    }  # fmt: skip
    assert [data["names"][i] for i in groups["outside"]] == ["x1"]
    r1, r2 = named["b1/r1"], named["b1/r2"]
    assert r1["nodes"] == 2 and r2["nodes"] == 1
    gib = 1 << 30
    assert r1["allocatable"] == {"cpu": 16_000, "memory": 64 * gib, "gpu-core": 200}
    assert r1["free"] == {"cpu": 15_000, "memory": 64 * gib, "gpu-core": 150}  # infer: 1 cpu, half a GPU
    assert r2["allocatable"] == r2["free"] == {"cpu": 8_000, "memory": 32 * gib}  # no GPU: none shown
    blocks = api.admin.get("/ui/api/nodes", params={"topology": "dc", "level": BLOCK_LABEL}).json()["groups"]
    assert [(d["name"], d["nodes"], d["free"]["gpu-core"]) for d in blocks["domains"]] == [("b1", 4, 150)]
    assert blocks["outside"] == []
    # A tenant reads the same map: node amounts, which every token reads, and no workload at all.
    tenant = api.client(api.token("tenant", tenant="team-b"))
    assert tenant.get("/ui/api/nodes", params={"topology": "dc", "level": RACK_LABEL}).json() == data


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_node_map_grouping_refuses_an_unknown_topology_or_level(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", **{RACK_LABEL: "r1"}))
    add_topology(api, topology("dc", RACK_LABEL))
    cases = [
        ({"topology": "dc"}, ["query", "level"], "give both"),
        ({"level": RACK_LABEL}, ["query", "topology"], "give both"),
        ({"topology": "nope", "level": RACK_LABEL}, ["query", "topology"], "knows: dc"),
        ({"topology": "dc", "level": BLOCK_LABEL}, ["query", "level"], f"its levels: {RACK_LABEL}"),
    ]
    for params, loc, msg in cases:
        answer = api.admin.get("/ui/api/nodes", params=params)
        assert answer.status_code == 422, (params, answer.text)
        (problem,) = answer.json()["detail"]
        assert problem["loc"] == loc and msg in problem["msg"], (params, problem)
