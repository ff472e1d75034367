"""Authorization before validation: every write route answers a caller it does not serve 401 or 403
whatever the body (valid, schema-invalid, with a NaN, not JSON at all), never a 422 that describes
what the route accepts; and a refused request changes nothing.

The callers: no token; a tenant token of team-b writing where team-a's objects are (or to an
admin-only route); the agent token of another node. Every write route of the OpenAPI document has a
row (a new route without one fails the test). Exceptions, by design: another tenant's offer is
"not found" (404), like an unknown id (an offer id names no tenant); any agent may verify a log
grant (the grant says which node it is for), so agents are not in that row; where the caller's
right depends on what the body names (the namespace of a tenant's workload, the node an agent
registers), a body that is not JSON names nothing and is answered the 422 saying so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from manifests import node, priority_class, tenant, workload
from manifests import topology as topology_doc
from server_harness import Api, inprocess_server

from finesched.server.api.auth_limit import FailedAuthLimiter
from finesched.server.loop.loop import LoopConfig

TENANT, AGENT, ANONYMOUS = "tenant team-b", "agent of node other", "no token"
EVERYONE = (TENANT, AGENT, ANONYMOUS)
JOB = {"apiVersion": "finesched.io/v1alpha1", "kind": "Job", "metadata": {"name": "j", "namespace": "team-a"},
       "spec": {"tasks": [{"id": "t", "parallelism": 1, "operators": [{"id": "o"}], "command": ["true"]}]}}  # fmt: skip
BAD_NODE = node("n9") | {"spec": {"allocatable": {"cpu": "lots"}}}
BAD_WORKLOAD = workload("w9", cpu="lots")


def topology(name: str) -> dict[str, Any]:
    return topology_doc(name, "topology.finesched.io/rack")


#: (method, path as the OpenAPI document names it, the path sent, a valid body, an invalid body,
#: the callers refused, the status for a tenant when not 403, the callers whose right depends on what
#: the body names: a body that is not JSON names nothing, and is a 422 for them)
ROUTES: list[tuple[str, str, str, Any, Any, tuple[str, ...], int, tuple[str, ...]]] = [
    ("post", "/v1/nodes", "/v1/nodes", node("n9"), BAD_NODE, EVERYONE, 403, (AGENT,)),
    ("put", "/v1/nodes/{name}", "/v1/nodes/n1", node("n1"), node("n1") | {"spec": {"cpu": -1}}, EVERYONE, 403, ()),
    ("delete", "/v1/nodes/{name}", "/v1/nodes/n1", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/nodes/{name}/report", "/v1/nodes/n1/report", {}, {"devices": 5}, EVERYONE, 403, ()),
    ("post", "/v1/nodes/{name}/cordon", "/v1/nodes/n1/cordon", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/nodes/{name}/uncordon", "/v1/nodes/n1/uncordon", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/tenants", "/v1/tenants", tenant("t9"), tenant("t9", weight=-1), EVERYONE, 403, ()),
    ("put", "/v1/tenants/{name}", "/v1/tenants/team-a", tenant("team-a", 2), [], EVERYONE, 403, ()),
    ("patch", "/v1/tenants/{name}", "/v1/tenants/team-a", {"weight": 2}, {"weight": "x"}, EVERYONE, 403, ()),
    ("delete", "/v1/tenants/{name}", "/v1/tenants/team-a", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/workloads", "/v1/workloads", workload("w9"), BAD_WORKLOAD, EVERYONE, 403, (TENANT,)),
    ("delete", "/v1/workloads/{namespace}/{name}", "/v1/workloads/team-a/w1", None, {"x": 1}, EVERYONE, 403, ()),
    ("delete", "/v1/workloads", "/v1/workloads?namespace=team-a", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/workloads/{namespace}/{name}/status", "/v1/workloads/team-a/w1/status", {"phase": "Running"},
     {"phase": "Exploded"}, EVERYONE, 403, ()),
    ("post", "/v1/bindings/{namespace}/{name}/ack", "/v1/bindings/team-a/w1/ack", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/bindings/{namespace}/{name}/reject", "/v1/bindings/team-a/w1/reject", {"reason": "no"},
     {"reason": ""}, EVERYONE, 403, ()),
    ("post", "/v1/jobs", "/v1/jobs", JOB, JOB | {"spec": {"tasks": 5}}, EVERYONE, 403, (TENANT,)),
    ("delete", "/v1/jobs/{namespace}/{name}", "/v1/jobs/team-a/j", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/offers", "/v1/offers", {"tenant": "team-a", "demand": {"cpu": "1"}},
     {"tenant": "team-a", "demand": {}}, EVERYONE, 403, (TENANT,)),
    ("post", "/v1/offers/{offer_id}/accept", "/v1/offers/OFFER/accept", {"workloads": [workload("w8")]},
     {"workloads": []}, EVERYONE, 404, ()),
    ("post", "/v1/offers/{offer_id}/decline", "/v1/offers/OFFER/decline", None, {"x": 1}, EVERYONE, 404, ()),
    ("post", "/v1/plan", "/v1/plan", [workload("w9")], [BAD_WORKLOAD], EVERYONE, 403, (TENANT,)),
    ("post", "/v1/log-grants/verify", "/v1/log-grants/verify", {"grant": "g" * 16}, {"grant": 5},
     (TENANT, ANONYMOUS), 403, ()),
    ("post", "/v1/tokens", "/v1/tokens", {"role": "admin"}, {"role": "root", "ttlSeconds": 0}, EVERYONE, 403, ()),
    ("delete", "/v1/tokens/{token_id}", "/v1/tokens/1", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/priorityclasses", "/v1/priorityclasses", priority_class("p9", 9), priority_class("p9", "high"),
     EVERYONE, 403, ()),
    ("put", "/v1/priorityclasses/{name}", "/v1/priorityclasses/p1", priority_class("p1", 2), [], EVERYONE, 403, ()),
    ("delete", "/v1/priorityclasses/{name}", "/v1/priorityclasses/p1", None, {"x": 1}, EVERYONE, 403, ()),
    ("post", "/v1/topologies", "/v1/topologies", topology("t9"), {**topology("t9"), "spec": {"levels": []}},
     EVERYONE, 403, ()),
    ("put", "/v1/topologies/{name}", "/v1/topologies/t1", topology("t1"), [], EVERYONE, 403, ()),
    ("delete", "/v1/topologies/{name}", "/v1/topologies/t1", None, {"x": 1}, EVERYONE, 403, ()),
]  # fmt: skip
#: Routes outside the document: objects stored under names refused today (views.LegacyName).
LEGACY = [
    ("delete", "/v1/nodes/Old_Node"),
    ("delete", "/v1/tenants/Old_Tenant"),
    ("delete", "/v1/workloads/team-a/a_b"),
]


def bodies(valid: Any, invalid: Any) -> dict[str, bytes]:
    """The bodies every caller sends: as the route wants it, invalid, with a NaN, and not JSON."""
    nan = {**valid, "extra": "NAN"} if isinstance(valid, dict) else [*valid, "NAN"]
    return {
        "valid": json.dumps(valid).encode(),
        "invalid": json.dumps(invalid).encode(),
        "NaN": json.dumps(nan).replace('"NAN"', "NaN").encode(),
        "not JSON": b'{"metadata": {"name": ',
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, dict[str, httpx.Client], str]]:
    """A server with a bound workload team-a/w1 on n1 and an open offer of team-a, and a client per
    caller; the limit of failed authentications is raised out of the way (tested on its own)."""
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('authz')) / 'db.sqlite'}"
    unlimited = FailedAuthLimiter(burst=10**9)
    with inprocess_server(db, LoopConfig(idle_wait_s=0.05), auth_limiter=unlimited) as api:
        assert api.admin.post("/v1/nodes", json=node("n1")).status_code == 201
        assert api.admin.post("/v1/workloads", json=workload("w1")).status_code == 201
        assert api.admin.post("/v1/priorityclasses", json=priority_class("p1", 1)).status_code == 201
        assert api.admin.post("/v1/topologies", json=topology("t1")).status_code == 201
        api.wait_phase("team-a/w1", ("Bound",))
        offer = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "1"}, "ttlSeconds": 3600})
        assert offer.status_code == 201, offer.text
        callers = {TENANT: api.client(api.token("tenant", tenant="team-b")),
                   AGENT: api.client(api.token("agent", node="other")), ANONYMOUS: api.client(None)}  # fmt: skip
        yield api, callers, offer.json()["id"]


def state(api: Api, offer: str) -> list[Any]:
    """What a refused request must not change."""
    paths = (
        "/v1/nodes",
        "/v1/tenants",
        "/v1/workloads",
        "/v1/tokens",
        "/v1/priorityclasses",
        "/v1/topologies",
        "/v1/jobs",
        "/v1/bindings",
        f"/v1/offers/{offer}",
    )
    return [api.admin.get(p).json() for p in paths]


def test_every_write_route_has_a_row(cluster: tuple[Api, dict[str, httpx.Client], str]) -> None:
    api, _, _ = cluster
    paths = api.admin.get("/openapi.json").json()["paths"]
    writes = {(m, p) for p, item in paths.items() for m in item if m in ("post", "put", "patch", "delete")}
    assert writes == {(method, path) for method, path, *_ in ROUTES}


@pytest.mark.parametrize(("method", "documented", "path", "valid", "invalid", "refused", "tenant_status", "named"),
                         ROUTES, ids=[f"{m.upper()} {p}" for m, p, *_ in ROUTES])  # fmt: skip
def test_a_caller_not_served_is_refused_whatever_the_body(
    cluster: tuple[Api, dict[str, httpx.Client], str], method: str, documented: str, path: str, valid: Any,
    invalid: Any, refused: tuple[str, ...], tenant_status: int, named: tuple[str, ...],
) -> None:  # fmt: skip
    api, callers, offer = cluster
    before = state(api, offer)
    path = path.replace("OFFER", offer)
    sent = bodies(valid or {}, invalid)
    answers = {}
    for caller in refused:
        for kind, body in sent.items():
            answer = callers[caller].request(method, path, content=body, headers={"content-type": "application/json"})
            answers[caller, kind] = (answer.status_code, answer.text)
    expected = {ANONYMOUS: 401, AGENT: 403, TENANT: tenant_status}
    unread = {k: v for k, v in answers.items() if k[0] in named and k[1] == "not JSON"}
    wrong = {k: v for k, v in answers.items() if k not in unread and v[0] != expected[k[0]]}
    assert not wrong, wrong
    for status, text in unread.values():  # that the body cannot be read, nothing of the route
        assert status == 422 and [d["type"] for d in json.loads(text)["detail"]] == ["json_invalid"], text
    assert state(api, offer) == before


@pytest.mark.parametrize(("method", "path"), LEGACY)
def test_legacy_routes_too(cluster: tuple[Api, dict[str, httpx.Client], str], method: str, path: str) -> None:
    _, callers, _ = cluster
    for caller, status in ((ANONYMOUS, 401), (AGENT, 403), (TENANT, 403)):
        answer = callers[caller].request(method, path, content=b"{", headers={"content-type": "application/json"})
        assert answer.status_code == status, (caller, answer.text)


def test_a_caller_served_still_gets_the_problems(cluster: tuple[Api, dict[str, httpx.Client], str]) -> None:
    """The same bodies from a caller a route serves: 422 naming the field (after authorization)."""
    api, callers, _ = cluster
    assert _locs(api.admin.post("/v1/nodes", json=BAD_NODE)) == [["body", "spec", "allocatable", "cpu"]]
    nan = b'{"kind": "Tenant", "metadata": {"name": "t9"}, "spec": {"weight": NaN}}'
    answer = api.admin.post("/v1/tenants", content=nan, headers={"content-type": "application/json"})
    assert _locs(answer) == [["body", "spec", "weight"]] and "NaN" in answer.text
    broken = api.admin.put("/v1/nodes/n1", content=b"{", headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"
    own = workload("w9", namespace="team-b", cpu="lots")
    assert _locs(callers[TENANT].post("/v1/workloads", json=own)) == [["body", "spec", "requests", "cpu"]]
    agent = api.client(api.token("agent", node="n1"))
    assert _locs(agent.post("/v1/nodes/n1/report", json={"devices": 5}))[0][:2] == ["body", "devices"]
    assert _locs(agent.post("/v1/workloads/team-a/w1/status", json={"phase": "Exploded"})) == [["body", "phase"]]
    plan = api.admin.post("/v1/plan", content=b'[{"kind": NaN}]', headers={"content-type": "application/json"})
    assert _locs(plan) == [["body", 0, "kind"]]


def _locs(answer: httpx.Response) -> list[list[Any]]:
    assert answer.status_code == 422, answer.text
    return [d["loc"] for d in answer.json()["detail"]]
