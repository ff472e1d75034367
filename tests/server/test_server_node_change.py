"""A change on the node: when a node's manifest (its agent's registration) loses what a binding
holds, the change is applied, that binding alone is requeued with the reason, and every other
binding on the node stays as it was (never a node the scheduler believes has a card that is gone)."""

from __future__ import annotations

from typing import Any

from manifests import node, workload
from server_harness import Api, wait_until

from finesched.server.loop.loop import SchedulerLoop
from finesched.server.store.store import Store

SHARE = {"gpu-core": 60, "gpu-memory-ratio": 60}


def events(api: Api, kind: str, name: str) -> list[dict[str, Any]]:
    return api.admin.get("/v1/events", params={"kind": kind, "object": name}).json()["items"]


def requeued(api: Api, key: str) -> list[str]:
    return [e["message"] for e in events(api, "Workload", key) if e["reason"] == "Requeued"]


def test_a_card_gone_from_the_node_requeues_only_the_workload_on_it(api: Api) -> None:
    assert api.admin.post("/v1/nodes", json=node("n1", gpus=2)).status_code == 201
    assert api.admin.post("/v1/workloads", json=[workload(n, requests={"cpu": "1", "memory": "1Gi", **SHARE})
                                                 for n in ("s0", "s1")]).status_code == 201  # fmt: skip
    cards = {}
    for key in ("team-a/s0", "team-a/s1"):
        status = api.wait_phase(key, ("Bound",))["status"]
        cards[status["binding"]["devices"]["gpu"][0]["minor"]] = key
    assert sorted(cards) == [0, 1]  # 60 % each: one per card

    assert api.admin.put("/v1/nodes/n1", json=node("n1", gpus=1)).status_code == 200  # card 1 is gone
    api.wait_phase(cards[1], ("Pending",))
    # Why it was requeued is its event; its status says why it waits now (tried again at once: no card)
    (why,) = requeued(api, cards[1])
    assert why.startswith("node n1 changed and no longer holds its binding") and "no gpu with minor 1" in why
    assert api.admin.get(f"/v1/workloads/{cards[0]}").json()["status"]["phase"] == "Bound"
    assert len(api.admin.get("/v1/nodes/n1").json()["spec"]["devices"]) == 1
    assert "UpdateRefused" not in [e["reason"] for e in events(api, "Node", "n1")]
    assert "Requeued" in [e["reason"] for e in events(api, "Workload", cards[1])]

    assert api.admin.put("/v1/nodes/n1", json=node("n1", gpus=2)).status_code == 200  # the card is back
    again = api.wait_phase(cards[1], ("Bound",))["status"]
    assert again["binding"]["devices"]["gpu"][0]["minor"] == 1


def test_a_node_change_while_its_binding_is_being_written_requeues_it_without_a_rebuild(
    api: Api, monkeypatch: Any
) -> None:
    """The loop decides a batch under its lock and writes it without: a node update in between can
    let the state forget a binding the store then records. The store follows the state (the workload
    is requeued with the reason), and the loop goes on without rebuilding."""
    rebuilds: list[int] = []
    rebuild = SchedulerLoop.rebuild
    monkeypatch.setattr(SchedulerLoop, "rebuild", lambda self: (rebuilds.append(1), rebuild(self))[1])
    assert api.admin.post("/v1/nodes", json=node("n1", gpus=1)).status_code == 201
    bind, changed = Store.bind, []

    def bind_after_the_card_is_gone(store: Store, decisions: Any, *args: Any, **kwargs: Any) -> Any:
        if not changed and any(key == "team-a/racer" for _, _, key, _, _ in decisions):
            changed.append(1)  # through the API, as an agent registering again would (its own thread)
            with api.client(api.token("admin")) as admin:
                assert admin.put("/v1/nodes/n1", json=node("n1")).status_code == 200
        return bind(store, decisions, *args, **kwargs)

    monkeypatch.setattr(Store, "bind", bind_after_the_card_is_gone)
    racer = workload("racer", requests={"cpu": "1", "memory": "1Gi", **SHARE})
    assert api.admin.post("/v1/workloads", json=racer).status_code == 201
    wait_until(lambda: "node n1 changed while it was being bound" in requeued(api, "team-a/racer"), what="requeue")
    assert api.admin.get("/v1/workloads/team-a/racer").json()["status"]["phase"] == "Pending"
    assert api.admin.post("/v1/workloads", json=workload("after")).status_code == 201
    api.wait_phase("team-a/after", ("Bound",))
    assert changed and rebuilds == []
