"""One tenant floods, the other works on (hypothesis' stateful testing against the real HTTP API).

Tenant A, in any order and any number of times: submits batches of workloads that fit nowhere until
its object quota refuses them, opens SSE watches until its per-token cap refuses them, opens
connections that never finish their request headers, sends wrong tokens until its address is
slowed, and bulk-deletes its namespace. Tenant B, meanwhile, reads its workloads, submits work that
fits and watches its own events. After every step:

* A's refusals are the documented ones (403 "exceeded quota", 429 with Retry-After) and a refused
  submission stored nothing;
* B's reads are answered (200, never 429 or 5xx) with exactly B's workloads;
* every workload B submitted is bound within a few seconds, and B's watch saw it bound;
* the server answered no request with a 5xx.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from manifests import API, node, workload
from server_harness import Api, inprocess_server, wait_until

from finesched.server.api.http_server import Timeouts
from finesched.server.api.watch_hub import WatchLimits
from finesched.server.loop.loop import LoopConfig

#: A's object quota: a few floods reach it.
LIMITS = {"workloads": 2500, "pending": 2000}
WATCHES_PER_TOKEN = 8
#: How long B's work may take to be bound while A floods, on a busy 2-core machine.
BOUND_WITHIN_S = 15.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    db = f"sqlite:///{tmp_path_factory.mktemp('flood') / 'fs.db'}"
    timeouts = Timeouts(header_timeout_s=2.0, body_timeout_s=2.0)
    watch = WatchLimits(per_token=WATCHES_PER_TOKEN, total=200)
    with inprocess_server(db, LoopConfig(idle_wait_s=0.02), tenants=(), timeouts=timeouts, watch=watch) as api:
        assert api.admin.post("/v1/nodes", json=node("big", cpu="64", memory="256Gi")).status_code == 201
        yield api


class Watch:
    """One SSE watch in a thread: its answer's status and the events it received."""

    def __init__(self, api: Api, token: str) -> None:
        self.client = api.client(token)
        self.status = 0
        self.retry_after: str | None = None
        self.events: list[dict[str, Any]] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.started.wait(30)

    def _run(self) -> None:
        try:
            with self.client.stream("GET", "/v1/events/watch", timeout=None) as response:
                self.status, self.retry_after = response.status_code, response.headers.get("retry-after")
                self.started.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line[6:]))
        except httpx.HTTPError:
            pass
        finally:
            self.started.set()

    def close(self) -> None:
        self.client.close()


def slow_connection(api: Api) -> socket.socket:
    """A connection that sends half a request line and then nothing (slowloris)."""
    host, port = api.base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"GET /v1/workl")
    return sock


class OneTenantFloods(RuleBasedStateMachine):
    api: Api

    @initialize()
    def tenants(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.a, self.b = f"flood-{tag}", f"calm-{tag}"
        spec_a = {"limits": LIMITS}
        for name, spec in ((self.a, spec_a), (self.b, {})):
            doc = {"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}, "spec": spec}
            assert self.api.admin.post("/v1/tenants", json=doc).status_code == 201
        self.token_a = self.api.token("tenant", tenant=self.a)
        self.client_a = self.api.client(self.token_a)
        token_b = self.api.token("tenant", tenant=self.b)
        self.client_b = self.api.client(token_b)
        self.watch_b = Watch(self.api, token_b)
        assert self.watch_b.status == 200
        self.watches: list[Watch] = []
        self.sockets: list[socket.socket] = []
        self.stored_a = 0  # A's workloads stored (every one fits nowhere: all Pending)
        self.b_submitted: list[str] = []
        self.seq = 0

    def teardown(self) -> None:
        for watch in getattr(self, "watches", []) + ([self.watch_b] if hasattr(self, "watch_b") else []):
            watch.close()
        for sock in getattr(self, "sockets", []):
            sock.close()
        for name in (getattr(self, "a", None), getattr(self, "b", None)):
            if name is not None:
                self.api.admin.delete("/v1/workloads", params={"namespace": name}, timeout=120)
                self.api.admin.delete(f"/v1/tenants/{name}")

    # Tenant A -------------------------------------------------------------------------------------------
    @rule(size=st.sampled_from([300, 1000]))
    def a_floods_objects(self, size: int) -> None:
        self.seq += 1
        batch = [workload(f"f{self.seq}-{i}", namespace=self.a, cpu="1000") for i in range(size)]
        answer = self.client_a.post("/v1/workloads", json=batch, timeout=120)
        over = self.stored_a + size > min(LIMITS.values())
        if answer.status_code == 403:
            assert over and "exceeded quota" in answer.json()["detail"], answer.text
        else:
            assert answer.status_code == 201 and not over, answer.text
            self.stored_a += size
        listed = self.api.admin.get("/v1/workloads", params={"namespace": self.a, "limit": 1}).json()
        assert len(listed["items"]) + listed["metadata"].get("remainingItemCount", 0) == self.stored_a

    @rule(count=st.integers(1, 6))
    def a_opens_watches(self, count: int) -> None:
        for _ in range(count):
            watch = Watch(self.api, self.token_a)
            held = sum(w.status == 200 for w in self.watches)
            if held < WATCHES_PER_TOKEN:
                assert watch.status == 200
                self.watches.append(watch)
            else:
                assert watch.status == 429 and watch.retry_after, watch.status
                watch.close()

    @rule(count=st.integers(1, 20))
    def a_opens_connections_it_never_finishes(self, count: int) -> None:
        self.sockets += [slow_connection(self.api) for _ in range(count)]

    @rule(count=st.integers(5, 30))
    def a_guesses_tokens(self, count: int) -> None:
        statuses = []
        for _ in range(count):
            answer = self.api.client(f"fs_{uuid.uuid4().hex}").get("/v1/workloads")
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                assert int(answer.headers["retry-after"]) >= 1
        assert set(statuses) <= {401, 429} and statuses[-1] in (401, 429)

    @precondition(lambda self: self.stored_a > 0)
    @rule()
    def a_deletes_its_flood(self) -> None:
        answer = self.client_a.delete("/v1/workloads", params={"namespace": self.a}, timeout=120)
        assert answer.status_code == 200 and answer.json()["deleted"] == self.stored_a, answer.text
        self.stored_a = 0

    # Tenant B -------------------------------------------------------------------------------------------
    @rule()
    def b_submits_work_that_fits(self) -> None:
        self.seq += 1
        name = f"b{self.seq}"
        answer = self.client_b.post("/v1/workloads", json=workload(name, namespace=self.b, cpu="100m"))
        assert answer.status_code == 201, answer.text
        self.b_submitted.append(f"{self.b}/{name}")

    # After every step ------------------------------------------------------------------------------------
    @invariant()
    def b_reads_exactly_its_own(self) -> None:
        if not hasattr(self, "client_b"):
            return
        answer = self.client_b.get("/v1/workloads")
        assert answer.status_code == 200, answer.text
        keys = [f"{w['metadata']['namespace']}/{w['metadata']['name']}" for w in answer.json()["items"]]
        assert keys == self.b_submitted

    @invariant()
    def b_work_is_bound_and_its_watch_saw_it(self) -> None:
        if not getattr(self, "b_submitted", None):
            return
        deadline = time.monotonic() + BOUND_WITHIN_S
        for key in self.b_submitted:
            try:
                wait_until(lambda key=key: self.phase(key) in ("Bound", "Running"), timeout=deadline - time.monotonic(),
                           what=f"{key} bound while {self.a} floods")  # fmt: skip
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{self.where_it_waits(key)}") from None
        seen = lambda: {e["object"] for e in self.watch_b.events if e["reason"] == "Bound"}  # noqa: E731
        wait_until(lambda: set(self.b_submitted) <= seen(), timeout=BOUND_WITHIN_S, what="B's watch to see it")
        assert {e["object"].split("/")[0] for e in self.watch_b.events if e["kind"] == "Workload"} <= {self.b}

    def where_it_waits(self, key: str) -> str:
        """What the server is doing while `key` waits: where the loop's queue holds it, and the stacks of
        the threads in finesched's code (a timing failure says its cause)."""
        loop = self.api.app.state.ctx.loop
        names = {t.ident: t.name for t in threading.enumerate()}
        stacks = [f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame)[-12:])
                  for ident, frame in sys._current_frames().items()
                  if "finesched" in "".join(traceback.format_stack(frame))]  # fmt: skip
        return (f"leader {loop.is_leader}, queued here {key in loop.queued}, deferred {key in loop.deferred}, "
                f"reason {loop.reasons([key], wait=False)}; the server's threads:\n" + "\n".join(stacks))  # fmt: skip

    def phase(self, key: str) -> str:
        return str(self.client_b.get(f"/v1/workloads/{key}").json()["status"]["phase"])

    @invariant()
    def no_answer_was_a_server_error(self) -> None:
        if not hasattr(self, "client_b"):
            return
        text = self.api.admin.get("/metrics").text
        errors = [ln for ln in text.splitlines() if ln.startswith("finesched_http_requests_total") and '"5' in ln]
        assert all(ln.rstrip().endswith(" 0.0") for ln in errors), errors


def test_one_tenant_floods_and_the_other_works_on(server: Api) -> None:
    OneTenantFloods.api = server
    machine = OneTenantFloods.TestCase
    machine.settings = settings(
        max_examples=8,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    machine().runTest()
