"""Resource offers (seed S4.5): best fit by the dominant resource, held for the TTL, accepted as a gang."""

from __future__ import annotations

from manifests import node, workload
from server_harness import Api, wait_until


def test_offer_picks_the_best_fit_node_and_holds_the_demand(api: Api) -> None:
    # Free cpu after registration: big 16, mid 6, small 2. Demand cpu 4 (dominant: cpu, 4/24 vs
    # memory 1Gi/96Gi) -> S4.2 best fit is "mid", the node whose remainder is closest to 4.
    for name, cpu in (("big", "16"), ("mid", "6"), ("small", "2")):
        api.admin.post("/v1/nodes", json=node(name, cpu=cpu))
    offer = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "4", "memory": "1Gi"}})
    assert offer.status_code == 201, offer.text
    body = offer.json()
    assert body["node"] == "mid" and body["remaining"]["cpu"] == "6" and body["state"] == "Open"
    # The hold counts for the tenant (DRF) and keeps others off: a 3-cpu workload cannot use mid.
    assert api.admin.get("/v1/tenants/team-a/usage").json()["usage"]["cpu"] == 4000
    api.admin.post("/v1/workloads", json=workload("other", namespace="team-b", cpu="3"))
    assert api.wait_phase("team-b/other", ("Bound",))["status"]["node"] == "big"
    # Accept: the workloads land on the offered node, all or none.
    accepted = api.admin.post(
        f"/v1/offers/{body['id']}/accept", json={"workloads": [workload("a", cpu="2"), workload("b", cpu="3")]}
    )
    assert accepted.status_code == 201, accepted.text
    assert {b["node"] for b in accepted.json()["bindings"].values()} == {"mid"}
    for key in ("team-a/a", "team-a/b"):
        assert api.admin.get(f"/v1/workloads/{key}").json()["status"]["phase"] == "Bound"
    assert api.admin.get(f"/v1/offers/{body['id']}").json()["state"] == "Accepted"
    assert api.admin.get("/v1/tenants/team-a/usage").json()["usage"]["cpu"] == 5000  # hold gone, a + b held


def test_accept_that_does_not_fit_keeps_the_offer_open(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    offer = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "2"}}).json()
    too_big = api.admin.post(f"/v1/offers/{offer['id']}/accept", json={"workloads": [workload("huge", cpu="8")]})
    assert too_big.status_code == 409
    assert api.admin.get(f"/v1/offers/{offer['id']}").json()["state"] == "Open"
    assert api.admin.get("/v1/tenants/team-a/usage").json()["usage"]["cpu"] == 2000  # still held
    assert api.admin.get("/v1/workloads").json()["items"] == []
    other_tenant = api.admin.post(
        f"/v1/offers/{offer['id']}/accept", json={"workloads": [workload("x", namespace="team-b")]}
    )
    assert other_tenant.status_code == 403


def test_decline_releases_the_hold(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    offer = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "4"}}).json()
    api.admin.post("/v1/workloads", json=workload("w", namespace="team-b", cpu="4"))
    assert api.admin.get("/v1/workloads/team-b/w").json()["status"]["phase"] == "Pending"
    team_b = api.client(api.token("tenant", tenant="team-b"))
    # another tenant's offer is answered like an unknown id: the id does not tell whose it is
    assert team_b.post(f"/v1/offers/{offer['id']}/decline").status_code == 404
    assert team_b.get(f"/v1/offers/{offer['id']}").status_code == 404
    assert api.admin.post(f"/v1/offers/{offer['id']}/decline").json()["state"] == "Declined"
    api.wait_phase("team-b/w", ("Bound",))
    nothing = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "1"}})
    assert nothing.status_code == 409 and "no node can hold" in nothing.json()["detail"]


def test_an_offers_hold_is_never_preempted(api: Api) -> None:
    """What an offer promised stays promised: a higher-priority workload of another tenant waits
    instead of evicting the hold (which never reached the bindings table, so nothing would say so)."""
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    offer = api.admin.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "4"}}).json()
    api.admin.post("/v1/workloads", json=workload("urgent", namespace="team-b", cpu="4", priority=1_000_000))
    urgent = lambda: api.admin.get("/v1/workloads/team-b/urgent").json()  # noqa: E731
    wait_until(lambda: urgent()["status"]["reason"] != "", what="the scheduler to try the urgent workload")
    waiting = urgent()
    assert waiting["status"]["phase"] == "Pending" and waiting["status"]["reason"], waiting
    assert api.admin.get(f"/v1/offers/{offer['id']}").json()["state"] == "Open"
    assert api.admin.get("/v1/tenants/team-a/usage").json()["usage"]["cpu"] == 4000  # still held
    accepted = api.admin.post(f"/v1/offers/{offer['id']}/accept", json={"workloads": [workload("mine", cpu="4")]})
    assert accepted.status_code == 201, accepted.text
