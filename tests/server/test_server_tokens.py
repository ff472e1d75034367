"""Tokens: lifetimes, listing without secrets, revocation seen by every replica within a second, a
tenant that does not exist refused; failed authentications logged without the token and slowed per
source (429 with Retry-After) while valid tokens and other sources go on."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from manifests import tenant
from server_harness import FINESCHED, Api, ServerProcess, inprocess_server, store_tenants, wait_until
from sqlalchemy import delete

from finesched.errors import ValidationError
from finesched.server.api.auth import MAX_TTL_S, TokenCache, digest, issue_token, parse_ttl, revoke_tokens
from finesched.server.api.auth_limit import BURST, WINDOW_S, FailedAuthLimiter
from finesched.server.loop.loop import LoopConfig
from finesched.server.store import schema as t
from finesched.server.store.store import Store

LISTED = {"id", "role", "tenant", "node", "created", "expires", "revoked", "description", "state"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FINESCHED, *args], capture_output=True, text=True, timeout=60)


def refused_within(client: httpx.Client, reason: str, path: str = "/v1/tenants") -> None:
    """Poll until `client`'s token is refused (401) for `reason`; no timing is asserted."""
    answers: list[httpx.Response] = []

    def refused() -> bool:
        answers.append(client.get(path))
        return answers[-1].status_code == 401

    wait_until(refused, timeout=15, what=f"the token to be refused ({reason})")
    assert answers[-1].json()["detail"] == reason


# Lifetimes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("12h", 43200), ("30d", 2592000), ("3600", 3600), ("1", 1), (" 2h ", 7200),
     ("3650d", MAX_TTL_S), ("0", None), ("0s", None), ("3651d", None), ("5x", None), ("", None), ("-5", None),
     ("1.5h", None), ("1w", None), ("h", None), ("10 years", None), ("1e3", None)],
)  # fmt: skip
def test_ttl_forms(text: str, seconds: int | None) -> None:
    if seconds is not None:
        assert parse_ttl(text) == seconds
        return
    with pytest.raises(ValueError, match=r"90s, 15m, 12h, 30d\), from 1s to 3650d") as refused:
        parse_ttl(text)
    assert repr(text) in str(refused.value)


@given(st.integers(0, 4000 * 86400), st.sampled_from(["", "s", "m", "h", "d"]))
def test_a_ttl_is_taken_exactly_when_in_range(number: int, unit: str) -> None:
    seconds = number * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if 1 <= seconds <= MAX_TTL_S:
        assert parse_ttl(f"{number}{unit}") == seconds
    else:
        with pytest.raises(ValueError, match="out of range"):
            parse_ttl(f"{number}{unit}")


@pytest.mark.parametrize(
    ("role", "tenant", "node", "ttl", "description", "problems"),
    [
        ("admin", None, None, None, "", set()),
        ("tenant", "team-a", None, 60, "ci", set()),
        ("tenant", "default", None, None, "", set()),  # the default tenant always exists
        ("agent", None, "n1", MAX_TTL_S, "", set()),
        ("root", None, None, None, "", {"role"}),
        ("tenant", None, None, None, "", {"tenant"}),
        ("tenant", "ghost", None, None, "", {"tenant"}),
        ("tenant", "Team_A", None, None, "", {"tenant"}),
        ("agent", None, None, None, "", {"node"}),
        ("agent", None, "N1", None, "", {"node"}),
        ("admin", "team-a", "n1", None, "", {"tenant", "node"}),
        ("admin", None, None, 0, "", {"ttlSeconds"}),
        ("admin", None, None, MAX_TTL_S + 1, "", {"ttlSeconds"}),
        ("admin", None, None, None, "x" * 254, {"description"}),
        ("admin", None, None, None, "line\nbreak", {"description"}),
    ],
)  # fmt: skip
def test_token_rules(store: Store, role: str, tenant: str | None, node: str | None, ttl: int | None,
                     description: str, problems: set[str]) -> None:  # fmt: skip
    store_tenants(store)
    before = store_rows(store)
    if not problems:
        issued = issue_token(store, role, tenant, node, ttl_s=ttl, description=description)
        assert set(issued.info) == LISTED and issued.info["state"] == "Active"
        assert (issued.info["expires"] is None) == (ttl is None)
        return
    with pytest.raises(ValidationError) as refused:
        issue_token(store, role, tenant, node, ttl_s=ttl, description=description)
    assert {e.path for e in refused.value.errors} == problems
    assert store_rows(store) == before  # nothing written


def store_rows(store: Store) -> list[Any]:
    with store.read() as conn:
        return list(conn.execute(t.tokens.select()))


def test_a_token_expires(api: Api) -> None:
    answer = api.admin.post("/v1/tokens", json={"role": "tenant", "tenant": "team-a", "ttlSeconds": 1})
    assert answer.status_code == 201, answer.text
    expires = datetime.fromisoformat(answer.json()["expires"])
    client = api.client(answer.json()["token"])
    first = client.get("/v1/tenants")
    if time.time() < expires.timestamp():  # answered before it expired (a busy machine may be later)
        assert first.status_code == 200
    refused_within(client, "expired token")
    (listed,) = [i for i in api.admin.get("/v1/tokens").json()["items"] if i["id"] == answer.json()["id"]]
    assert listed["state"] == "Expired"


def test_a_cached_token_costs_no_store_read_until_it_is_stale(store: Store) -> None:
    token = issue_token(store, "admin", ttl_s=1).token
    cache = TokenCache(store, fresh_s=3600)
    for _ in range(1000):
        if cache.verify(token)[0] is None:
            break
    assert cache.reads == 1
    wait_until(lambda: cache.verify(token) == (None, "expired token"), what="expiry")  # seen without a read
    assert cache.reads == 1
    fresh = TokenCache(store, fresh_s=0.0)
    other = issue_token(store, "admin").token
    assert fresh.identify(other) is not None
    revoke_tokens(store, [fresh_id(store, other)])
    assert fresh.verify(other) == (None, "revoked token") and fresh.reads == 2
    assert fresh.verify("fs_unknown") == (None, "unknown token")


def fresh_id(store: Store, token: str) -> int:
    with store.read() as conn:
        return int(conn.execute(t.tokens.select().where(t.tokens.c.digest == digest(token))).one().id)


# The admin API ---------------------------------------------------------------------------------------------
def test_the_token_api_is_for_admins(api: Api) -> None:
    made = api.admin.post("/v1/tokens", json={"role": "tenant", "tenant": "team-a", "description": "ci"})
    assert made.status_code == 201, made.text
    secret, token_id = made.json()["token"], made.json()["id"]
    assert set(made.json()) == LISTED | {"token"} and made.json()["expires"] is None
    tenant = api.client(secret)
    assert tenant.get("/v1/tenants/team-a").status_code == 200
    agent = api.client(api.token("agent", node="n1"))
    for caller in (tenant, agent):
        assert caller.post("/v1/tokens", json={"role": "admin"}).status_code == 403
        assert caller.post("/v1/tokens", json={"role": "bogus", "ttlSeconds": -1}).status_code == 403
        assert caller.get("/v1/tokens").status_code == 403
        assert caller.delete(f"/v1/tokens/{token_id}").status_code == 403
        assert caller.delete("/v1/tokens/not-a-number").status_code == 403
    listing = api.admin.get("/v1/tokens")
    assert secret not in listing.text and digest(secret) not in listing.text
    assert all(set(item) == LISTED for item in listing.json()["items"])
    (mine,) = [i for i in listing.json()["items"] if i["id"] == token_id]
    assert mine["tenant"] == "team-a" and mine["description"] == "ci" and mine["state"] == "Active"
    problems = {
        ("body", "tenant"): {"role": "tenant", "tenant": "ghost"},
        ("body", "role"): {"role": "root"},
        ("body", "ttlSeconds"): {"role": "admin", "ttlSeconds": 0},
        ("body", "node"): {"role": "agent", "node": "N1"},
        ("body", "description"): {"role": "admin", "description": "x" * 254},
    }
    for loc, body in problems.items():
        refused = api.admin.post("/v1/tokens", json=body)
        assert refused.status_code == 422 and tuple(refused.json()["detail"][0]["loc"]) == loc, refused.text
    assert len(api.admin.get("/v1/tokens").json()["items"]) == len(listing.json()["items"])  # none made
    assert api.admin.delete("/v1/tokens/999999").status_code == 404
    revoked = api.admin.delete(f"/v1/tokens/{token_id}")
    assert revoked.status_code == 200 and revoked.json()["state"] == "Revoked"
    again = api.admin.delete(f"/v1/tokens/{token_id}")
    assert again.json()["revoked"] == revoked.json()["revoked"]  # the first time is kept
    refused_within(tenant, "revoked token")


def test_a_deleted_tenants_tokens_are_not_inherited(api: Api) -> None:
    assert api.admin.post("/v1/tenants", json=tenant("t9")).status_code == 201
    token = api.token("tenant", tenant="t9")
    assert api.client(token).get("/v1/tenants/t9").status_code == 200
    assert api.admin.delete("/v1/tenants/t9").status_code == 200
    assert api.admin.post("/v1/tenants", json=tenant("t9")).status_code == 201  # the same name again
    refused_within(api.client(token), "revoked token", "/v1/tenants/t9")


@pytest.fixture
def replicas(db_url: str, tmp_path: Path) -> Iterator[tuple[Api, ServerProcess]]:
    """The in-process leader and a `finesched serve` process on the same database."""
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05, lease_ttl_s=5.0)) as api:
        other = ServerProcess(db_url, None, log=tmp_path / "replica.log").start()
        try:
            yield api, other
        finally:
            other.stop()


def test_revoked_and_deleted_tokens_are_refused_by_every_replica(replicas: tuple[Api, ServerProcess]) -> None:
    api, other = replicas
    for how in ("api", "cli", "row deleted"):
        made = api.admin.post("/v1/tokens", json={"role": "tenant", "tenant": "team-b", "description": how}).json()
        on_other = httpx.Client(base_url=other.base, headers={"Authorization": f"Bearer {made['token']}"})
        assert on_other.get("/v1/tenants/team-b").status_code == 200  # known to the other replica now
        if how == "api":
            assert api.admin.delete(f"/v1/tokens/{made['id']}").status_code == 200
        elif how == "cli":
            done = run("token", "revoke", "--db", api.db, str(made["id"]))
            assert done.returncode == 0 and f"token {made['id']} (tenant team-b) revoked" in done.stdout
        else:
            with api.store.write() as conn:
                conn.execute(delete(t.tokens).where(t.tokens.c.id == made["id"]))
        refused_within(on_other, "unknown token" if how == "row deleted" else "revoked token", "/v1/tenants/team-b")
        refused_within(api.client(made["token"]), "unknown token" if how == "row deleted" else "revoked token")


# The command line ------------------------------------------------------------------------------------------
def test_token_commands_on_the_database(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    admin = run("token", "create", "--db", db, "--role", "admin", "--ttl", "12h", "--description", "ops laptop")
    assert admin.returncode == 0 and admin.stdout.count("\n") == 1, admin.stderr
    assert "token 1: admin, expires" in admin.stderr
    agent = run("token", "create", "--db", db, "--role", "agent", "--node", "n1")
    secrets = [admin.stdout.strip(), agent.stdout.strip()]
    ghost = run("token", "create", "--db", db, "--role", "tenant", "--tenant", "ghost")
    assert ghost.returncode == 1 and '--tenant: "ghost" tenant ghost does not exist' in ghost.stderr
    bad_ttl = run("token", "create", "--db", db, "--role", "admin", "--ttl", "5x")
    assert bad_ttl.returncode == 2 and "--ttl" in bad_ttl.stderr and "'5x'" in bad_ttl.stderr
    assert "90s, 15m, 12h, 30d" in bad_ttl.stderr
    listed = json.loads(run("token", "list", "--db", db, "-o", "json").stdout)
    assert [(i["id"], i["role"], i["node"], i["description"]) for i in listed] == [
        (1, "admin", None, "ops laptop"), (2, "agent", "n1", "")]  # fmt: skip
    assert listed[0]["expires"] is not None and listed[1]["expires"] is None
    table = run("token", "list", "--db", db, "-o", "wide")
    assert "ops laptop" in table.stdout and "n1" in table.stdout
    for shown in (json.dumps(listed), table.stdout, run("token", "list", "--db", db, "-o", "yaml").stdout):
        assert not any(s in shown or digest(s) in shown for s in secrets)
    unknown = run("token", "revoke", "--db", db, "2", "7")
    assert unknown.returncode == 1 and "no token with id 7; nothing was revoked" in unknown.stderr
    assert [i["state"] for i in json.loads(run("token", "list", "--db", db, "-o", "json").stdout)] == ["Active"] * 2
    assert run("token", "revoke", "--db", db, "2").returncode == 0
    assert [i["state"] for i in json.loads(run("token", "list", "--db", db, "-o", "json").stdout)] == [
        "Active", "Revoked"]  # fmt: skip
    both = run("token", "list", "--db", db, "--server", "http://127.0.0.1:1")
    assert both.returncode == 2 and "not both" in both.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_token_commands_through_the_server(api: Api) -> None:
    common = ("--server", api.base, "--token", api.token("admin"))
    made = run("token", "create", "--role", "tenant", "--tenant", "team-a", "--ttl", "1h", "-o", "json", *common)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert api.client(created["token"]).get("/v1/tenants/team-a").status_code == 200
    ghost = run("token", "create", "--role", "tenant", "--tenant", "ghost", *common)
    assert ghost.returncode == 1 and "tenant ghost does not exist" in ghost.stderr
    listed = run("token", "list", "-o", "json", *common)
    assert created["token"] not in listed.stdout
    assert created["id"] in [i["id"] for i in json.loads(listed.stdout)]
    assert run("token", "revoke", str(created["id"]), "999", *common).returncode == 1
    assert run("token", "revoke", str(created["id"]), *common).returncode == 0
    refused_within(api.client(created["token"]), "revoked token")
    tenant = run("token", "list", "--server", api.base, "--token", created["token"])
    assert tenant.returncode == 1 and "401" in tenant.stderr


# Failed authentications --------------------------------------------------------------------------------------
class Clock:
    """A monotonic clock the test moves by hand (the limiter's windows without waiting for them)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_failed_authentications_are_logged_and_slowed_per_source(db_url: str, caplog: pytest.LogCaptureFixture
                                                                 ) -> None:  # fmt: skip
    clock = Clock()
    caplog.set_level(logging.WARNING, logger="finesched.server.auth")
    with inprocess_server(db_url, auth_limiter=FailedAuthLimiter(clock=clock)) as api:
        wrong = "fs_" + "Q" * 43  # the shape of a real token
        guesser = api.client(wrong)
        for i in range(BURST):
            path = "/v1/tenants" if i % 2 else "/v1/workloads"
            assert guesser.get(path).status_code == 401
        refused = guesser.get("/v1/nodes")
        assert refused.status_code == 429 and refused.headers["retry-after"] == str(int(WINDOW_S))
        assert api.client(None).get("/v1/nodes").status_code == 429  # no token either
        assert api.admin.get("/v1/nodes").status_code == 200  # a valid token from the same address
        elsewhere = httpx.Client(base_url=api.base, headers={"Authorization": f"Bearer {wrong}"},
                                 transport=httpx.HTTPTransport(local_address="127.0.0.2"))  # fmt: skip
        assert elsewhere.get("/v1/nodes").status_code == 401  # another source is not slowed
        clock.now += WINDOW_S / 2
        assert guesser.get("/v1/nodes").headers["retry-after"] == str(math.ceil(WINDOW_S / 2))
        clock.now += WINDOW_S  # the burst left the window
        assert guesser.get("/v1/nodes").status_code == 401
    records = [r for r in caplog.records if r.name == "finesched.server.auth"]
    failures = [r.getMessage() for r in records if r.getMessage().startswith("authentication failed")]
    assert len(failures) == BURST + 2  # each failure until the limit, the other source's, the one after it
    assert "unknown token from 127.0.0.1" in failures[0] and "GET '/v1/workloads'" in failures[0]
    assert "GET '/v1/tenants'" in failures[1] and "from 127.0.0.2" in failures[BURST]
    assert datetime.fromisoformat(failures[0].split(" at ")[1].split(" on ")[0])  # when
    limited = [r.getMessage() for r in records if "refused with 429" in r.getMessage()]
    assert len(limited) == 1 and "from 127.0.0.1" in limited[0]  # not one line per refusal
    assert all(r.levelno == logging.WARNING for r in records)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert wrong not in text and wrong[:12] not in text and "Q" * 8 not in text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 4)), max_size=80), st.integers(1, 5))
def test_the_limit_follows_its_rule(failures: list[tuple[str, float]], burst: int) -> None:
    """A failure is refused (429) exactly when the source failed `burst` times within the window
    before it; Retry-After is when the oldest of those leaves the window."""
    clock = Clock()
    limiter = FailedAuthLimiter(burst=burst, window_s=WINDOW_S, clock=clock)
    seen: dict[str, list[float]] = {}
    for source, step in failures:
        clock.now += step
        earlier = seen.setdefault(source, [])
        recent = [s for s in earlier if s + WINDOW_S - clock.now > 0]
        expected = math.ceil(earlier[-burst] + WINDOW_S - clock.now) if len(recent) >= burst else None
        assert limiter.failed(source).retry_after == (max(1, expected) if expected is not None else None)
        earlier.append(clock.now)


@given(st.lists(st.integers(0, 50), max_size=300))
def test_the_limiter_tracks_a_bounded_number_of_sources(sources: list[int]) -> None:
    clock = Clock()
    limiter = FailedAuthLimiter(max_sources=8, clock=clock)
    for source in sources:
        clock.now += 0.01
        limiter.failed(f"10.0.0.{source}")
        assert len(limiter) <= 8
    clock.now += WINDOW_S + 1
    limiter.failed("10.0.1.1")
    assert len(limiter) == 1  # the silent ones are forgotten


def test_serve_does_not_take_x_forwarded_for_as_the_source(tmp_path: Path) -> None:
    server = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    try:
        with httpx.Client(base_url=server.base, headers={"Authorization": "Bearer fs_wrong"}) as client:
            answers = [client.get("/v1/nodes", headers={"X-Forwarded-For": f"10.1.0.{i}"}).status_code
                       for i in range(BURST + 1)]  # fmt: skip
    finally:
        server.stop()
    assert answers == [401] * BURST + [429]  # 11 requests within the window: one source, 127.0.0.1
