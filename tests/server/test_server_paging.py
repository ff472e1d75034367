"""List endpoints page as Kubernetes does: `limit`, `continue`, `metadata.continue` and
`remainingItemCount`; tokens are checked; tenants see only their namespaces, in one query; the
agent's bindings read is unchanged; the CLI follows the pages."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from manifests import API, node, workload
from server_harness import FINESCHED, Api, wait_until
from sqlalchemy import event

from finesched.server.api.paging import DEFAULT_PAGE, MAX_PAGE, encode


def pages(client: httpx.Client, path: str, limit: int, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a list, each checked: full until the last, remainingItemCount right."""
    out: list[list[dict[str, Any]]] = []
    query: dict[str, Any] = {**params, "limit": limit}
    while True:
        answer = client.get(path, params=query)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        out.append(body["items"])
        token = body["metadata"].get("continue")
        if token is None:
            assert "remainingItemCount" not in body["metadata"]
            return out
        assert len(body["items"]) == limit
        remaining = body["metadata"]["remainingItemCount"]
        query["continue"] = token
        assert remaining > 0
        following = client.get(path, params={**params, "limit": MAX_PAGE, "continue": token}).json()
        assert len(following["items"]) == remaining


def keys(items: list[dict[str, Any]]) -> list[str]:
    return [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items]


def grant(api: Api, tenant: str, *namespaces: str) -> None:
    doc = {"apiVersion": API, "kind": "Tenant", "metadata": {"name": tenant}, "spec": {"namespaces": list(namespaces)}}
    assert api.admin.put(f"/v1/tenants/{tenant}", json=doc).status_code == 200


def test_workload_pages_follow_submission_order_and_keep_a_tenant_to_its_namespaces(api: Api) -> None:
    grant(api, "team-a", "a-extra")
    submitted = []
    for i in range(7):  # interleaved namespaces and tenants: the ids order them
        for namespace in ("team-a", "team-b", "a-extra"):
            doc = workload(f"w{i}", namespace, cpu="1000")
            assert api.admin.post("/v1/workloads", json=doc).status_code == 201
            submitted.append(f"{namespace}/w{i}")
    got = pages(api.admin, "/v1/workloads", 4)
    assert [k for page in got for k in keys(page)] == submitted
    assert [len(p) for p in got] == [4, 4, 4, 4, 4, 1]
    tenant = api.client(api.token("tenant", tenant="team-a"))
    mine = [k for k in submitted if not k.startswith("team-b/")]
    assert [k for page in pages(tenant, "/v1/workloads", 3) for k in keys(page)] == mine
    only = pages(tenant, "/v1/workloads", 5, namespace="a-extra")
    assert [k for page in only for k in keys(page)] == [k for k in submitted if k.startswith("a-extra/")]
    assert tenant.get("/v1/workloads", params={"namespace": "team-b", "limit": 1}).status_code == 403
    # without a limit: the default page
    assert len(api.admin.get("/v1/workloads").json()["items"]) == min(len(submitted), DEFAULT_PAGE)


def test_tenant_listing_is_one_query_whatever_its_namespaces(api: Api) -> None:
    grant(api, "team-a", *(f"ns-{i}" for i in range(20)))
    for i in range(20):
        api.admin.post("/v1/workloads", json=workload("w", f"ns-{i}", cpu="1000"))
    tenant = api.client(api.token("tenant", tenant="team-a"))
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM workloads" in statement:
            seen.append(statement)

    engine = api.store.engines.reader
    event.listen(engine, "before_cursor_execute", count)
    try:
        items = tenant.get("/v1/workloads", params={"limit": 100}).json()["items"]
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(items) == 20 and len(seen) == 1


def test_bad_continue_tokens_are_422_naming_continue(api: Api) -> None:
    for i in range(3):
        api.admin.post("/v1/workloads", json=workload(f"w{i}", cpu="1000"))
    first = api.admin.get("/v1/workloads", params={"limit": 1, "phase": "Pending"}).json()
    token = first["metadata"]["continue"]
    forged_int = base64.urlsafe_b64encode(json.dumps({"k": "x", "q": "0"}).encode()).decode().rstrip("=")
    cases = [
        ("/v1/workloads", {"continue": "not a token!"}, "should match pattern"),
        ("/v1/workloads", {"continue": "bm90IGpzb24"}, "is not a continue token"),  # base64 of "not json"
        ("/v1/workloads", {"continue": base64.urlsafe_b64encode(b"[1,2]").decode().rstrip("=")}, "is not a continue"),
        ("/v1/workloads", {"continue": forged_int}, "is not a continue token of this list"),
        ("/v1/workloads", {"continue": token}, "another query"),  # without the first page's phase filter
        ("/v1/workloads", {"continue": token, "phase": "Bound"}, "another query"),
        ("/v1/jobs", {"continue": token}, "another query"),
        ("/v1/workloads", {"continue": "x" * 2000}, "at most"),
        ("/v1/workloads", {"limit": 0}, "greater than or equal to 1"),
        ("/v1/workloads", {"limit": MAX_PAGE + 1}, "less than or equal to"),
    ]
    for path, params, message in cases:
        answer = api.admin.get(path, params=params)
        assert answer.status_code == 422, (params, answer.text)
        (detail,) = answer.json()["detail"]
        assert detail["loc"][0] == "query" and detail["loc"][1] in ("continue", "limit"), detail
        assert message in detail["msg"], (params, detail)
    following = api.admin.get("/v1/workloads", params={"limit": 5, "phase": "Pending", "continue": token}).json()
    assert keys(following["items"]) == ["team-a/w1", "team-a/w2"]


def test_every_list_pages(api: Api) -> None:
    for i in range(5):
        assert api.admin.post("/v1/nodes", json=node(f"n{i}", cpu="64")).status_code == 201
    names = [i["metadata"]["name"] for page in pages(api.admin, "/v1/nodes", 2) for i in page]
    assert names == [f"n{i}" for i in range(5)]
    for name in ("t1", "t2", "t3"):
        api.admin.put(f"/v1/tenants/{name}", json={"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}})
    tenants = [i["metadata"]["name"] for page in pages(api.admin, "/v1/tenants", 2) for i in page]
    assert tenants == sorted(tenants) and {"t1", "t2", "t3", "team-a", "team-b"} <= set(tenants)
    for i in range(6):
        api.admin.post("/v1/workloads", json=workload(f"b{i}"))
    for i in range(6):
        api.wait_phase(f"team-a/b{i}", ("Bound",))
    bindings = [b["workload"] for page in pages(api.admin, "/v1/bindings", 4) for b in page]
    assert bindings == [f"team-a/b{i}" for i in range(6)]
    events = [e["id"] for page in pages(api.admin, "/v1/events", 7) for e in page]
    assert events == sorted(events) and len(events) >= 5 + 3 + 12
    kinds = {e["kind"] for page in pages(api.admin, "/v1/events", 3, kind="Node") for e in page}
    assert kinds == {"Node"}
    since = events[10]
    after = [e["id"] for page in pages(api.admin, "/v1/events", 4, since=since) for e in page]
    assert after == [e for e in events if e > since]


def test_agent_reads_all_of_its_nodes_bindings_without_a_limit(api: Api) -> None:
    doc = node("n1", cpu="2000", memory="4000Gi")
    doc["spec"]["allocatable"]["pods"] = 1000
    assert api.admin.post("/v1/nodes", json=doc).status_code == 201
    many = DEFAULT_PAGE + 20
    for start in range(0, many, 500):
        batch = [workload(f"w{i}", cpu="1", memory="1Mi") for i in range(start, min(many, start + 500))]
        assert api.admin.post("/v1/workloads", json=batch).status_code == 201
    agent = api.client(api.token("agent", node="n1"))

    def bound() -> int:
        return len(agent.get("/v1/bindings", params={"node": "n1"}).json()["items"])

    wait_until(lambda: bound() == many, timeout=60, what="every binding, in one answer")
    assert len(api.admin.get("/v1/bindings").json()["items"]) == DEFAULT_PAGE  # no node: the default page
    paged = agent.get("/v1/bindings", params={"node": "n1", "limit": 10}).json()
    assert len(paged["items"]) == 10 and paged["metadata"]["remainingItemCount"] == many - 10


def test_a_tenant_sees_its_own_events_in_full_pages(api: Api) -> None:
    for i in range(4):
        api.admin.post("/v1/workloads", json=workload(f"a{i}", "team-a", cpu="1000"))
        api.admin.post("/v1/workloads", json=workload(f"b{i}", "team-b", cpu="1000"))
    tenant = api.client(api.token("tenant", tenant="team-a"))
    got = pages(tenant, "/v1/events", 2, kind="Workload")
    objects = [e["object"] for page in got for e in page]
    assert objects and all(o.startswith("team-a/") for o in objects)
    assert {f"team-a/a{i}" for i in range(4)} <= set(objects)
    agent = api.client(api.token("agent", node="n9"))
    assert agent.get("/v1/events", params={"limit": 10}).json()["items"] == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_follows_pages(api: Api) -> None:
    import subprocess

    batch = [workload(f"w{i:02d}", cpu="1000") for i in range(12)]
    assert api.admin.post("/v1/workloads", json=batch).status_code == 201
    common = ("--server", api.base, "--token", api.token("admin"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60)

    listed = run("get", "workloads", "--chunk-size", "5", "-o", "json", *common)
    assert listed.returncode == 0, listed.stderr
    assert [i["metadata"]["name"] for i in json.loads(listed.stdout)] == [f"w{i:02d}" for i in range(12)]
    events = run("get", "events", "--kind", "Workload", "--chunk-size", "4", "-o", "json", *common)
    submitted = [e["object"] for e in json.loads(events.stdout) if e["reason"] == "Submitted"]
    assert submitted == [f"team-a/w{i:02d}" for i in range(12)]
    table = run("get", "events", "--object", "team-a/w03", *common)
    assert table.returncode == 0 and " event(s)" in table.stdout and "team-b" not in table.stdout


def test_tokens_are_opaque_and_bound_to_their_query() -> None:
    one = encode("workloads", {"phase": "Pending", "node": None}, 5)
    assert one == encode("workloads", {"node": None, "phase": "Pending"}, 5)  # None filters and order do not matter
    assert one != encode("workloads", {"phase": "Bound"}, 5) and one != encode("jobs", {"phase": "Pending"}, 5)
