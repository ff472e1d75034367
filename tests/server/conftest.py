"""Fixtures of the control-plane tests: each runs on SQLite and on a real PostgreSQL server.

PostgreSQL comes from FINESCHED_TEST_PG_URL (scripts/with-postgres.sh starts one; `.ci/run` uses
it). Without it the PostgreSQL cases are skipped, unless FINESCHED_REQUIRE_PG=1 (CI), where a
missing server is a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_harness import PG_URL, REQUIRE_PG, Api, fresh_database, inprocess_server

from finesched.server.loop.loop import LoopConfig
from finesched.server.store.store import Store


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres" and not PG_URL:
        if REQUIRE_PG:
            pytest.fail("FINESCHED_REQUIRE_PG=1 but FINESCHED_TEST_PG_URL is not set")
        pytest.skip("no PostgreSQL server (set FINESCHED_TEST_PG_URL, see scripts/with-postgres.sh)")
    with fresh_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    yield s
    s.close()


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with inprocess_server(db_url, LoopConfig(idle_wait_s=0.05, lease_ttl_s=5.0)) as running:
        yield running
