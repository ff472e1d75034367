"""Two tenants and an admin send any sequence of valid and invalid requests to the real HTTP API
(hypothesis' stateful testing); after every step:

* no answer was a 5xx (and the server counted none);
* no object of one tenant is visible to the other, or changed by it;
* every accepted workload is bound or carries a reason (why it waits, or why it was refused);
* a well-formed workload the other tenant submits is bound within a few loop passes.

One server serves every example (starting one per example would cost more than the test); each
example gets its own two tenants, and deletes what it made when it ends."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from manifests import API, node, tenant, workload
from server_harness import Api, inprocess_server

from finesched.server.loop.loop import LoopConfig

BOUND = ("Bound", "Running")
#: How long "a few loop passes" may take on a busy 2-core machine (the loop wakes on every submit).
FEW_PASSES_S = 3.0
INVALID = {
    "bad name": lambda ns: workload("Bad_Name", namespace=ns),
    "too long": lambda ns: workload("w" * 254, namespace=ns),
    "slash": lambda ns: workload("a/b", namespace=ns),
    "gpu-core alone": lambda ns: workload("g", namespace=ns, **{"requests": {"koordinator.sh/gpu-core": 50}}),
    "gpu-core 150": lambda ns: workload("g", namespace=ns, **{"requests": {"gpu-core": 150, "gpu-memory-ratio": 150}}),
    "priority": lambda ns: workload("p", namespace=ns, priority=2**40),
    "memory 2^60": lambda ns: workload("m", namespace=ns, memory="1Ei"),
    "unknown field": lambda ns: workload("u", namespace=ns, replicas=3),
    "wrong tenant": lambda ns: workload("t", namespace=ns, tenant="someone-else"),
}
RAW_INVALID = [
    '{"apiVersion": "x",',
    '{"kind": "Workload", "metadata": {"namespace": "OWN"}, "spec": {"priority": NaN}}',
    "[]",
    "\xff",
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    db = f"sqlite:///{tmp_path_factory.mktemp('stateful') / 'fs.db'}"
    with inprocess_server(db, LoopConfig(idle_wait_s=0.02), tenants=()) as api:
        assert api.admin.post("/v1/nodes", json=node("big", cpu="64", memory="256Gi", gpus=2)).status_code == 201
        yield api


class TwoTenants(RuleBasedStateMachine):
    api: Api

    @initialize()
    def create_tenants(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.names = [f"a-{tag}", f"b-{tag}"]
        for name in self.names:
            assert self.api.admin.post("/v1/tenants", json=tenant(name)).status_code == 201
        self.clients = [self.api.client(self.api.token("tenant", tenant=n)) for n in self.names]
        self.accepted: dict[str, tuple[int, dict[str, Any]]] = {}  # key -> (tenant index, spec sent)
        self.seq = 0
        self.last_actor = 0
        self.poison: list[tuple[str, str]] = []

    def teardown(self) -> None:
        for key in list(getattr(self, "accepted", {})):
            self.api.admin.delete(f"/v1/workloads/{key}")
        for name in getattr(self, "names", ()):
            self.api.admin.delete(f"/v1/tenants/{name}")
        for kind, name in getattr(self, "poison", ()):  # set aside, and an admin can still delete it
            assert self.api.admin.delete(f"/v1/{kind}s/{name}").status_code == 200
        for client in getattr(self, "clients", ()):
            client.close()

    # Helpers ----------------------------------------------------------------------------------------
    def answer(self, response: httpx.Response) -> httpx.Response:
        assert response.status_code < 500, f"{response.request.method} {response.request.url}: {response.text}"
        return response

    def fresh_name(self) -> str:
        self.seq += 1
        return f"w{self.seq}"

    def visible(self, who: int) -> set[str]:
        items = self.answer(self.clients[who].get("/v1/workloads")).json()["items"]
        return {f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items}

    # Rules -------------------------------------------------------------------------------------------
    @rule(who=st.integers(0, 1), cpu=st.sampled_from(["100m", "250m", "1"]), gpu=st.booleans())
    def submit_valid(self, who: int, cpu: str, gpu: bool) -> None:
        requests: dict[str, Any] = {"cpu": cpu, "memory": "64Mi"}
        if gpu:
            requests.update({"gpu-core": 10, "gpu-memory-ratio": 10})
        doc = workload(self.fresh_name(), namespace=self.names[who], requests=requests)
        answer = self.answer(self.clients[who].post("/v1/workloads", json=doc))
        assert answer.status_code == 201, answer.text
        self.accepted[f"{self.names[who]}/{doc['metadata']['name']}"] = (who, answer.json()["items"][0]["spec"])
        self.last_actor = who

    @rule(who=st.integers(0, 1))
    def submit_too_big_to_fit(self, who: int) -> None:
        doc = workload(self.fresh_name(), namespace=self.names[who], cpu="1000")
        answer = self.answer(self.clients[who].post("/v1/workloads", json=doc))
        assert answer.status_code == 201
        self.accepted[f"{self.names[who]}/{doc['metadata']['name']}"] = (who, answer.json()["items"][0]["spec"])
        self.last_actor = who

    @rule(who=st.integers(0, 1), how=st.sampled_from(sorted(INVALID)), into_other=st.booleans())
    def submit_invalid(self, who: int, how: str, into_other: bool) -> None:
        namespace = self.names[1 - who] if into_other else self.names[who]
        before = self.visible(who)
        answer = self.answer(self.clients[who].post("/v1/workloads", json=INVALID[how](namespace)))
        assert answer.status_code in ((403,) if into_other else (422,)), (how, answer.text)
        assert self.visible(who) == before

    @rule(who=st.integers(0, 1), raw=st.sampled_from(RAW_INVALID))
    def submit_garbage(self, who: int, raw: str) -> None:
        headers = {"content-type": "application/json"}
        raw = raw.replace("OWN", self.names[who])  # its own namespace: a manifest for another's is a 403
        answer = self.answer(self.clients[who].post("/v1/workloads", content=raw.encode("latin-1"), headers=headers))
        assert answer.status_code == 422

    @rule(who=st.integers(0, 1), data=st.data())
    def reach_into_the_other(self, who: int, data: st.DataObject) -> None:
        """Read, delete or status-report another tenant's workload: 403, whether it exists or not."""
        theirs = [k for k, (owner, _) in self.accepted.items() if owner != who] + [f"{self.names[1 - who]}/ghost"]
        key = data.draw(st.sampled_from(theirs))
        client = self.clients[who]
        refusal = {"detail": f"namespace {self.names[1 - who]} does not belong to tenant {self.names[who]}"}
        for response in (client.get(f"/v1/workloads/{key}"), client.delete(f"/v1/workloads/{key}"),
                         client.post(f"/v1/workloads/{key}/status", json={"phase": "Failed"})):  # fmt: skip
            assert self.answer(response).status_code == 403
            assert response.json() == refusal

    @rule(data=st.data())
    def delete_own(self, data: st.DataObject) -> None:
        if not self.accepted:
            return
        key = data.draw(st.sampled_from(sorted(self.accepted)))
        who, _ = self.accepted.pop(key)
        assert self.answer(self.clients[who].delete(f"/v1/workloads/{key}")).status_code == 200

    @rule(who=st.integers(0, 1), demand=st.sampled_from([{"cpu": "1"}, {"cpu": "-1"}, {"x": False}, {"gpu-core": 30}]))
    def offer_and_decline(self, who: int, demand: dict[str, Any]) -> None:
        answer = self.answer(self.clients[who].post("/v1/offers", json={"tenant": self.names[who], "demand": demand}))
        assert answer.status_code in (201, 409, 422), answer.text
        if answer.status_code == 201:
            offer = answer.json()["id"]
            assert self.answer(self.clients[1 - who].post(f"/v1/offers/{offer}/decline")).status_code == 404
            assert self.answer(self.clients[who].post(f"/v1/offers/{offer}/decline")).status_code == 200
        foreign = self.clients[who].post("/v1/offers", json={"tenant": self.names[1 - who], "demand": {"cpu": "1"}})
        assert self.answer(foreign).status_code == 403

    @rule(who=st.integers(0, 1), weight=st.sampled_from(["2", "0", "-1", "1e400", "NaN", "1e6", '"heavy"']))
    def admin_reweighs(self, who: int, weight: str) -> None:
        raw = json.dumps(tenant(self.names[who])).replace('"spec": {"weight": 1.0}', f'"spec": {{"weight": {weight}}}')
        answer = self.answer(self.api.admin.put(f"/v1/tenants/{self.names[who]}", content=raw,
                                                headers={"content-type": "application/json"}))  # fmt: skip
        assert answer.status_code == (200 if weight in ("2", "1e6") else 422), (weight, answer.text)

    @rule(who=st.integers(0, 1))
    def tenant_writes_tenants(self, who: int) -> None:
        mine = self.names[who]
        assert self.answer(self.clients[who].put(f"/v1/tenants/{mine}", json=tenant(mine))).status_code == 403
        child = tenant(f"{self.names[who]}-x") | {"spec": {"parent": f"gone-{self.names[who]}"}}
        assert self.answer(self.api.admin.post("/v1/tenants", json=child)).status_code == 422

    @rule(kind=st.sampled_from(["tenant", "node"]))
    def an_older_version_stored_poison(self, kind: str) -> None:
        """Straight into the store, as a version without today's rules would have: a tenant whose
        parent does not exist, a node whose name is refused now. Nothing else may notice."""
        name = f"poison-{self.fresh_name()}"
        if kind == "tenant":
            self.api.store.put_tenant(name, 1.0, tenant(name) | {"spec": {"parent": "gone"}}, create_only=True)
        else:
            bad = name.upper().replace("-", "_")
            self.api.store.put_node(bad, node(bad) | {"metadata": {"name": bad}}, create_only=True)
            name = bad
        self.poison.append((kind, name))

    # Invariants ------------------------------------------------------------------------------------------
    @invariant()
    def nothing_crosses_between_tenants(self) -> None:
        if not hasattr(self, "names"):
            return
        for who in (0, 1):
            seen = self.visible(who)
            assert all(key.startswith(f"{self.names[who]}/") for key in seen), seen
            events = self.answer(self.clients[who].get("/v1/events")).json()["items"]
            assert all(not e["object"].startswith(f"{self.names[1 - who]}/") for e in events)
        for key, (_, spec) in self.accepted.items():
            stored = self.answer(self.api.admin.get(f"/v1/workloads/{key}")).json()
            assert stored["spec"] == spec, key  # nobody changed it

    @invariant()
    def every_accepted_workload_is_bound_or_says_why(self) -> None:
        deadline = time.monotonic() + FEW_PASSES_S
        waiting = dict(getattr(self, "accepted", {}))
        while waiting:
            for key in list(waiting):
                status = self.answer(self.api.admin.get(f"/v1/workloads/{key}")).json()["status"]
                if status["phase"] in BOUND or status["reason"]:
                    del waiting[key]
            if waiting and time.monotonic() > deadline:
                raise AssertionError(f"neither bound nor explained after {FEW_PASSES_S}s: {sorted(waiting)}")
            time.sleep(0.05 if waiting else 0)

    @invariant()
    def the_other_tenants_work_is_bound(self) -> None:
        if not hasattr(self, "names"):
            return
        other = 1 - self.last_actor
        doc = workload(f"probe-{self.fresh_name()}", namespace=self.names[other], cpu="100m", memory="16Mi")
        assert self.answer(self.clients[other].post("/v1/workloads", json=doc)).status_code == 201
        key = f"{self.names[other]}/{doc['metadata']['name']}"
        deadline = time.monotonic() + FEW_PASSES_S
        while self.api.admin.get(f"/v1/workloads/{key}").json()["status"]["phase"] not in BOUND:
            assert time.monotonic() < deadline, f"{key} not bound within {FEW_PASSES_S}s"
            time.sleep(0.02)
        assert self.answer(self.clients[other].delete(f"/v1/workloads/{key}")).status_code == 200


def test_two_tenants_and_an_admin(server: Api, tmp_path: Path) -> None:
    TwoTenants.api = server
    machine = TwoTenants.TestCase
    machine.settings = settings(
        max_examples=12, stateful_step_count=12, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )  # fmt: skip
    machine().runTest()
    metrics = server.client(None).get("/metrics").text
    assert 'status="5' not in metrics, [line for line in metrics.splitlines() if 'status="5' in line]
    assert API  # the manifests' API version the requests above carry
