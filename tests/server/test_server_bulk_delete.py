"""Bulk delete (`DELETE /v1/workloads?namespace=&labelSelector=`): what it deletes, who may, what the
scheduling loop forgets, and the CLI's `delete workloads --all | -l`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from manifests import node, workload
from server_harness import FINESCHED, Api

from finesched.errors import ValidationError
from finesched.model.manifest import read_documents
from finesched.model.selector import parse_selector
from finesched.model.tenant import Tenant
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.queue import SchedulingQueue

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def labelled(name: str, namespace: str = "team-a", cpu: str = "1", **labels: str) -> dict[str, Any]:
    doc = workload(name, namespace, cpu=cpu)
    doc["metadata"]["labels"] = labels
    return doc


def names(api: Api, namespace: str) -> set[str]:
    items = api.admin.get("/v1/workloads", params={"namespace": namespace}).json()["items"]
    return {i["metadata"]["name"] for i in items}


def test_delete_by_selector_releases_bindings_and_the_loop_forgets(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    docs = [labelled("web-1", app="web"), labelled("web-2", app="web", tier="front"), labelled("db", app="db"),
            labelled("huge-web", cpu="1000", app="web"), labelled("other", "team-b", app="web")]  # fmt: skip
    assert api.admin.post("/v1/workloads", json=docs).status_code == 201
    for key in ("team-a/web-1", "team-a/web-2", "team-a/db"):
        api.wait_phase(key, ("Bound",))
    answer = api.admin.delete("/v1/workloads", params={"namespace": "team-a", "labelSelector": "app in (web)"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"deleted": 3, "released": 2, "namespace": "team-a", "labelSelector": "app in (web)"}
    assert names(api, "team-a") == {"db"} and names(api, "team-b") == {"other"}
    loop = api.app.state.ctx.loop
    with loop.lock:
        assert "team-a/huge-web" not in loop.queued
        assert not loop.scheduler.queue.holds("team-a/huge-web")  # not parked for ever
        assert set(loop.scheduler.state.bindings) == {"team-a/db", "team-b/other"}
    deleted = api.admin.get("/v1/events", params={"kind": "Workload", "object": "team-a/web-1"}).json()["items"]
    assert deleted[-1]["reason"] == "Deleted"
    assert api.admin.post("/v1/workloads", json=labelled("web-1", app="web")).status_code == 201  # the name is free
    api.wait_phase("team-a/web-1", ("Bound",))  # and capacity was given back
    everything = api.admin.delete("/v1/workloads", params={"namespace": "team-a"})
    assert everything.json()["deleted"] == 2 and names(api, "team-a") == set()


def test_who_may_bulk_delete(api: Api) -> None:
    api.admin.post("/v1/workloads", json=[labelled("a", cpu="1000"), labelled("b", "team-b", cpu="1000")])
    tenant = api.client(api.token("tenant", tenant="team-a"))
    assert tenant.delete("/v1/workloads", params={"namespace": "team-b"}).status_code == 403
    missing = tenant.delete("/v1/workloads")
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["query", "namespace"]
    agent = api.client(api.token("agent", node="n1"))
    assert agent.delete("/v1/workloads", params={"namespace": "team-a"}).status_code == 403
    bad = tenant.delete("/v1/workloads", params={"namespace": "team-a", "labelSelector": "app in ()"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "labelSelector"]
    assert names(api, "team-a") == {"a"} and names(api, "team-b") == {"b"}  # nothing deleted by a refusal
    assert tenant.delete("/v1/workloads", params={"namespace": "team-a"}).json()["deleted"] == 1
    assert names(api, "team-b") == {"b"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_jobs_slots_are_left_to_their_job(api: Api) -> None:
    (job,) = read_documents(EXAMPLES / "streaming-etl.yaml")
    api.admin.put("/v1/tenants/analytics", json={"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant",
                                                 "metadata": {"name": "analytics"}})  # fmt: skip
    assert api.admin.post("/v1/jobs", json=job).status_code == 201
    api.admin.post("/v1/workloads", json=labelled("loose", "analytics", cpu="1000"))
    assert api.admin.delete("/v1/workloads", params={"namespace": "analytics"}).json()["deleted"] == 1
    assert len(names(api, "analytics")) == 4


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_deletes_workloads_by_namespace(api: Api) -> None:
    docs = [labelled(f"w{i}", cpu="1000", app="web" if i % 2 else "db") for i in range(6)]
    api.admin.post("/v1/workloads", json=docs)
    common = ("--server", api.base, "--token", api.token("admin"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60)

    done = run("delete", "workloads", "-n", "team-a", "-l", "app=web", *common)
    assert done.returncode == 0 and "3 workload(s) deleted" in done.stdout, done.stderr
    assert names(api, "team-a") == {"w0", "w2", "w4"}
    assert run("delete", "workloads", "-n", "team-a", *common).returncode == 2  # neither a name, --all nor -l
    assert run("delete", "workloads", "w0", "--all", "-n", "team-a", *common).returncode == 2
    assert run("delete", "workloads", "-n", "team-a", "--all", *common).returncode == 0
    assert names(api, "team-a") == set()


SELECTORS = [
    ("", {}, True),
    ("app=web", {"app": "web"}, True),
    ("app==web", {"app": "db"}, False),
    ("app!=web", {}, True),
    ("app!=web", {"app": "web"}, False),
    ("app in (web, db)", {"app": "db"}, True),
    ("app notin (web,db)", {"app": "db"}, False),
    ("app notin (web,db)", {}, True),
    ("tier", {"tier": ""}, True),
    ("!tier", {"tier": "x"}, False),
    ("example.com/team=a,!legacy, env in (prod)", {"example.com/team": "a", "env": "prod"}, True),
    ("a=b,a=c", {"a": "b"}, False),
    ("a=", {"a": ""}, True),
]


@pytest.mark.parametrize(("text", "labels", "matches"), SELECTORS)
def test_selector_table(text: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_selector(text).matches(labels) is matches


BAD = ["app in ()", "app=web,", "=web", "app in (a b)", "app > 3", "a=b=c", "-x=y", "x" * 5000]


@pytest.mark.parametrize("text", BAD)
def test_bad_selectors_name_the_requirement(text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_selector(text)
    assert caught.value.errors[0].path == "labelSelector"


LABEL = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)


@given(st.dictionaries(LABEL, LABEL, max_size=4), st.dictionaries(LABEL, LABEL, max_size=4))
def test_equality_selectors_select_what_they_say(wanted: dict[str, str], labels: dict[str, str]) -> None:
    text = ",".join(f"{k}={v}" for k, v in wanted.items())
    assert parse_selector(text).matches(labels) == all(labels.get(k) == v for k, v in wanted.items())
    negated = ",".join(f"{k}!={v}" for k, v in wanted.items())
    assert parse_selector(negated).matches(labels) == all(labels.get(k) != v for k, v in wanted.items())


def test_queue_forgets_deleted_workloads_wherever_they_wait() -> None:
    queue = SchedulingQueue([Tenant(name="t")])

    def w(name: str, gang: str | None = None, size: int = 1) -> Workload:
        doc: dict[str, Any] = {"name": name, "namespace": "t", "tenant": "t", "requests": {"cpu": 1}}
        if gang:
            doc["gang"] = {"name": gang, "min_member": size}
        return Workload.model_validate(doc)

    for name in ("a", "b", "c"):
        queue.push(w(name))
    queue.push(w("g1", "g", 3))  # an incomplete gang
    queue.push(w("g2", "g", 3))
    parked = queue.pop()
    assert parked is not None
    queue.park(parked, FitError(parked.workloads[0].key, 1, {"no room": 1}))
    assert queue.forget(["t/a", "t/b", "t/g1", "t/nope"]) == 3
    assert len(queue) == 2 and not queue.holds("t/a") and queue.holds("t/g2")
    queue.cluster_changed()
    queue.flush_backoff()
    popped = [queue.pop() for _ in range(3)]
    assert [u.workloads[0].key for u in popped if u is not None] == ["t/c"]
