"""The control plane's HTTP API against a real uvicorn server, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import threading

import httpx
from manifests import node, tenant, workload
from server_harness import Api, inprocess_server, wait_until

from finesched.codec import encode
from finesched.cpuset import CPUSet
from finesched.server.loop.loop import LoopConfig


def test_submit_is_bound_and_shows_the_pinned_shape(api: Api) -> None:
    assert api.admin.post("/v1/nodes", json=node("n1", cores=4)).status_code == 201
    exclusive = workload("db", cpu="2", memory="1Gi", limits={"cpu": "2", "memory": "1Gi"}, qos="LSR")
    answer = api.admin.post("/v1/workloads", json=exclusive)
    assert answer.status_code == 201, answer.text
    assert answer.json()["items"][0]["status"]["phase"] == "Pending"
    body = api.wait_phase("team-a/db", ("Bound",))
    assert set(body) == {"metadata", "spec", "status"}
    binding = body["status"]["binding"]
    assert set(binding) >= {"node", "cpuset", "devices", "numa"}
    assert binding["node"] == "n1"
    assert len(CPUSet.parse(binding["cpuset"])) == 2  # two exclusive logical CPUs
    assert api.admin.get("/v1/nodes/n1").json()["status"]["allocation"]["workloads"] == ["team-a/db"]


def test_gpu_share_binding_and_list_filters(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("g1", gpus=2))
    shares = [workload(f"infer-{i}", **{"requests": {"cpu": "1", "gpu-core": 50, "gpu-memory-ratio": 50}})
              for i in range(4)]  # fmt: skip
    assert api.admin.post("/v1/workloads", json=shares).status_code == 201
    for i in range(4):
        api.wait_phase(f"team-a/infer-{i}", ("Bound",))
    per_gpu: dict[int, int] = {}
    for item in api.admin.get("/v1/workloads", params={"phase": "Bound", "node": "g1"}).json()["items"]:
        (grant,) = item["status"]["binding"]["devices"]["gpu"]
        per_gpu[grant["minor"]] = per_gpu.get(grant["minor"], 0) + int(grant["resources"]["gpu-core"])
    assert per_gpu == {0: 100, 1: 100}  # four halves fill two GPUs exactly
    fifth = workload("infer-4", **{"requests": {"cpu": "1", "gpu-core": 50, "gpu-memory-ratio": 50}})
    api.admin.post("/v1/workloads", json=fifth)
    wait_until(lambda: api.admin.get("/v1/workloads", params={"phase": "Pending"}).json()["items"], what="pending")
    assert api.admin.get("/v1/workloads/team-a/infer-4").json()["status"]["phase"] == "Pending"


def test_delete_releases_and_waiting_work_is_bound(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="2"))
    api.admin.post("/v1/workloads", json=[workload("a", cpu="2"), workload("b", cpu="2")])
    api.wait_phase("team-a/a", ("Bound",))
    assert api.admin.get("/v1/workloads/team-a/b").json()["status"]["phase"] == "Pending"
    answer = api.admin.delete("/v1/workloads/team-a/a")
    assert answer.status_code == 200 and answer.json()["released"] is True
    assert api.admin.get("/v1/workloads/team-a/a").status_code == 404
    api.wait_phase("team-a/b", ("Bound",))


def test_auth_roles(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1"))
    anonymous = api.client(None)
    assert anonymous.get("/v1/nodes").status_code == 401
    assert api.client("fs_not-a-token").get("/v1/nodes").status_code == 401
    team_a = api.client(api.token("tenant", tenant="team-a"))
    team_b = api.client(api.token("tenant", tenant="team-b"))
    agent = api.client(api.token("agent", node="n1"))
    assert team_a.get("/v1/nodes").status_code == 403
    assert team_a.post("/v1/nodes", json=node("n2")).status_code == 403
    assert team_a.post("/v1/workloads", json=workload("w", namespace="team-b")).status_code == 403
    assert team_a.post("/v1/workloads", json=workload("w")).status_code == 201
    assert team_b.get("/v1/workloads/team-a/w").status_code == 403
    assert team_b.delete("/v1/workloads/team-a/w").status_code == 403  # another tenant's workload
    assert api.admin.get("/v1/workloads/team-a/w").status_code == 200  # still there
    assert team_b.get("/v1/workloads").json()["items"] == []
    assert agent.post("/v1/workloads", json=workload("x")).status_code == 403
    assert agent.put("/v1/nodes/n2", json=node("n2")).status_code == 403  # another node
    assert agent.put("/v1/nodes/n1", json=node("n1", cpu="16")).status_code == 200  # its own
    assert team_a.get("/v1/tenants/team-b/usage").status_code == 403
    assert team_a.delete("/v1/workloads/team-a/w").status_code == 200


def test_agent_ack_reject_and_status(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1"))
    agent = api.client(api.token("agent", node="n1"))
    api.admin.post("/v1/workloads", json=[workload("job")])
    api.wait_phase("team-a/job", ("Bound",))
    (item,) = agent.get("/v1/bindings", params={"node": "n1"}).json()["items"]
    assert item["workload"] == "team-a/job" and item["acked"] is False
    assert agent.get("/v1/bindings", params={"node": "n9"}).status_code == 403
    # Rejected: released and requeued with the agent's reason (then bound again).
    answer = agent.post("/v1/bindings/team-a/job/reject", json={"reason": "gpu 0 unhealthy"})
    assert answer.status_code == 200
    events = api.admin.get("/v1/events", params={"object": "team-a/job"}).json()["items"]
    assert any(e["reason"] == "Requeued" and "gpu 0 unhealthy" in e["message"] for e in events)
    api.wait_phase("team-a/job", ("Bound",))
    assert agent.post("/v1/bindings/team-a/job/ack").json()["acked"] is True
    running = {"phase": "Running", "info": {"pid": 42, "affinity": "applied"}}
    assert agent.post("/v1/workloads/team-a/job/status", json=running).status_code == 200
    assert api.admin.get("/v1/workloads/team-a/job").json()["status"]["info"]["pid"] == 42
    done = agent.post("/v1/workloads/team-a/job/status", json={"phase": "Succeeded", "exitCode": 0})
    assert done.status_code == 200
    body = api.admin.get("/v1/workloads/team-a/job").json()
    assert body["status"]["phase"] == "Succeeded" and body["status"]["binding"] is None
    assert body["status"]["info"]["exitCode"] == 0
    wait_until(lambda: not api.admin.get("/v1/nodes/n1").json()["status"]["allocation"]["workloads"], what="release")


def test_cordon_keeps_new_work_off_the_node(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1"))
    assert api.admin.post("/v1/nodes/n1/cordon").json()["status"]["cordoned"] is True
    api.admin.post("/v1/workloads", json=workload("w"))
    events = lambda: api.admin.get("/v1/workloads/team-a/w").json()["status"]["phase"]  # noqa: E731
    assert events() == "Pending"
    api.admin.post("/v1/nodes/n1/uncordon")
    api.wait_phase("team-a/w", ("Bound",))


def test_node_reports_encoded_devices_and_health(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("g1", gpus=2))
    agent = api.client(api.token("agent", node="g1"))
    # GPU 0 is 60 % used by something outside finesched; GPU 1 is unhealthy.
    report = {"devices": {"gpu": {"gpu-core": {"k": encode([40, 100], 7), "count": 2, "bits": 7}}},
              "health": {"gpu": {"1": False}}}  # fmt: skip
    assert agent.post("/v1/nodes/g1/report", json=report).status_code == 200
    api.admin.post(
        "/v1/workloads", json=workload("half", **{"requests": {"cpu": "1", "gpu-core": 50, "gpu-memory-ratio": 50}})
    )
    api.admin.post(
        "/v1/workloads", json=workload("small", **{"requests": {"cpu": "1", "gpu-core": 30, "gpu-memory-ratio": 30}})
    )
    small = api.wait_phase("team-a/small", ("Bound",))
    assert small["status"]["binding"]["devices"]["gpu"][0]["minor"] == 0  # the only healthy GPU
    assert api.admin.get("/v1/workloads/team-a/half").json()["status"]["phase"] == "Pending"  # 40 free < 50
    assert api.admin.get("/v1/nodes/g1").json()["status"]["heartbeat"] is not None


def test_tenants_usage_and_quota(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="8", memory="8Gi"))
    assert api.admin.put("/v1/tenants/team-a", json=tenant("team-a", 2.0, {"cpu": "2"})).status_code == 200
    assert api.admin.post("/v1/tenants", json=tenant("team-a")).status_code == 409  # the harness created it
    api.admin.post("/v1/workloads", json=[workload("a", cpu="2"), workload("b", cpu="2")])
    api.wait_phase("team-a/a", ("Bound",))
    usage = api.admin.get("/v1/tenants/team-a/usage").json()
    assert usage["usage"]["cpu"] == 2000 and usage["dominantShare"] == 0.25 and usage["weightedShare"] == 0.125
    assert usage["pending"]["workloads"] == 1  # b waits for quota, and says so
    wait_until(lambda: "quota" in api.admin.get("/v1/workloads/team-a/b").json()["status"]["reason"], what="reason")
    patched = api.admin.patch("/v1/tenants/team-a", json={"quota": {"cpu": "4"}})
    assert patched.status_code == 200 and patched.json()["spec"]["quota"] == {"cpu": "4"}
    api.wait_phase("team-a/b", ("Bound",))
    bad = api.admin.patch("/v1/tenants/team-a", json={"weight": -1})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "weight"


def test_events_list_and_sse_watch_resume(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1"))
    first = api.admin.get("/v1/events").json()["items"]
    assert [e["reason"] for e in first if e["kind"] != "Tenant"] == ["Registered"]
    received: list[dict] = []

    def watch() -> None:
        with api.admin.stream("GET", "/v1/events/watch", params={"since": first[-1]["id"]}, timeout=30) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    received.append(json.loads(line[6:]))
                    if len(received) >= 2:
                        return

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    api.admin.post("/v1/workloads", json=workload("w"))
    reader.join(timeout=20)
    assert [(e["object"], e["reason"]) for e in received] == [("team-a/w", "Submitted"), ("team-a/w", "Bound")]
    # Resume with Last-Event-ID: only what came after it.
    headers = {"Last-Event-ID": str(received[0]["id"])}
    with api.admin.stream("GET", "/v1/events/watch", headers=headers, timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                assert json.loads(line[6:])["id"] == received[1]["id"]
                break


def test_health_readiness_metrics_openapi(api: Api) -> None:
    plain = httpx.Client(base_url=api.base)
    assert plain.get("/healthz").json() == {"status": "ok"}
    assert plain.get("/readyz").json()["leader"] is True
    api.admin.post("/v1/nodes", json=node("g1", gpus=1))
    api.admin.post(
        "/v1/workloads", json=workload("w", **{"requests": {"cpu": "1", "gpu-core": 25, "gpu-memory-ratio": 25}})
    )
    api.wait_phase("team-a/w", ("Bound",))
    # The binding is durable before the loop drops the workload from its queue: wait for that.
    wait_until(lambda: "finesched_queue_depth 0.0" in plain.get("/metrics").text, what="empty queue")
    text = plain.get("/metrics").text
    assert 'finesched_decisions_total{result="bound"} 1.0' in text
    assert "finesched_submit_to_bound_seconds_bucket" in text
    assert 'finesched_allocated{resource="cpu"} 1000.0' in text
    assert 'finesched_allocated{resource="gpu-core"} 25.0' in text  # a device dimension, summed over cards
    assert 'finesched_device_used_ratio{dimension="gpu-core",minor="0",node="g1",type="gpu"} 0.25' in text
    spec = plain.get("/openapi.json").json()
    assert {"/v1/nodes", "/v1/workloads", "/v1/workloads/{namespace}/{name}", "/v1/offers"} <= set(spec["paths"])


def test_missed_heartbeats_make_a_node_not_ready_then_requeue_its_work(db_url: str) -> None:
    config = LoopConfig(idle_wait_s=0.05, heartbeat_s=0.2, missed_heartbeats=2, requeue_after_s=1.0)
    with inprocess_server(db_url, config) as api:
        api.admin.post("/v1/nodes", json=node("n1"))
        api.admin.post("/v1/nodes", json=node("n2"))  # registered by hand: no agent, never NotReady
        agent = api.client(api.token("agent", node="n1"))
        api.admin.put("/v1/nodes/n1", json=node("n1", pool="x"))
        api.admin.post("/v1/workloads", json=workload("w", nodeSelector={"pool": "x"}))

        def bound_while_reporting() -> bool:  # the agent reports until the workload is bound
            assert agent.post("/v1/nodes/n1/report", json={}).status_code == 200
            return api.admin.get("/v1/workloads/team-a/w").json()["status"]["phase"] == "Bound"

        wait_until(bound_while_reporting, what="the binding")
        # The agent goes silent: NotReady after 2 missed reports (0.4 s), requeued 1 s later.
        wait_until(lambda: not api.admin.get("/v1/nodes/n1").json()["status"]["ready"], what="NotReady")
        assert api.admin.get("/v1/nodes/n2").json()["status"]["ready"] is True

        def reasons() -> list[str]:
            return [e["reason"] for e in api.admin.get("/v1/events", params={"object": "team-a/w"}).json()["items"]]

        wait_until(lambda: "Requeued" in reasons(), what="the workload to be requeued")
        assert api.admin.get("/v1/workloads/team-a/w").json()["status"]["phase"] == "Pending"  # n1 takes no work
        # The agent comes back: Ready again, and the workload is bound there again.
        assert agent.post("/v1/nodes/n1/report", json={}).status_code == 200
        assert api.admin.get("/v1/nodes/n1").json()["status"]["ready"] is True
        wait_until(bound_while_reporting, what="the binding after the agent came back")


def test_waiting_reason_is_written(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="2"))
    api.admin.post("/v1/workloads", json=workload("big", cpu="4"))
    wait_until(lambda: "insufficient cpu" in api.admin.get("/v1/workloads/team-a/big").json()["status"]["reason"],
               what="the waiting reason")  # fmt: skip

    # The API reads the reason from the queue at once; the leader writes it (and its event) within a second.
    def written() -> list[str]:
        return [e["reason"] for e in api.admin.get("/v1/events", params={"object": "team-a/big"}).json()["items"]]

    wait_until(lambda: written() == ["Submitted", "Waiting"], what="the Waiting event")
    assert "insufficient cpu" in api.store.get_workload("team-a", "big")["reason"]


def test_preemption_releases_victims_through_the_store(api: Api) -> None:
    api.admin.post("/v1/nodes", json=node("n1", cpu="4"))
    agent = api.client(api.token("agent", node="n1"))
    api.admin.post("/v1/workloads", json=[workload("low", namespace="team-b", cpu="3", priority=1)])
    api.wait_phase("team-b/low", ("Bound",))
    agent.post("/v1/workloads/team-b/low/status", json={"phase": "Running"})
    api.admin.post("/v1/workloads", json=[workload("high", cpu="3", priority=10)])
    high = api.wait_phase("team-a/high", ("Bound",))
    assert high["status"]["binding"]["node"] == "n1"
    low = api.admin.get("/v1/workloads/team-b/low").json()
    assert low["status"]["phase"] == "Pending" and low["status"]["binding"] is None
    assert [b["workload"] for b in agent.get("/v1/bindings").json()["items"]] == ["team-a/high"]  # the agent stops low
    events = api.admin.get("/v1/events", params={"object": "team-b/low"}).json()["items"]
    (preempted,) = [e for e in events if e["reason"] == "Preempted"]  # its status reason may say why it waits now
    # team-b is not told the name of team-a's workload (tests/server/test_priority_api.py: the whole rule)
    assert preempted["message"] == "preempted by a higher-priority workload on n1: priority 1 < 10"
    assert 'finesched_decisions_total{result="preempted"} 1.0' in api.admin.get("/metrics").text
