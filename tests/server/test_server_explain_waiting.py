"""`Store.explain_waiting` (one executemany for all reasons) writes what one UPDATE ... RETURNING per
workload wrote: the same reasons on the same Pending rows, nothing on others, the same events in
the same order, no version bumped."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from manifests import workload
from sqlalchemy import select, update

from finesched.server.store import schema as t
from finesched.server.store.store import PENDING, Event, Store

NAMESPACES = ("team-a", "team-b", "team-c")
KEYS = [f"{ns}/w{i}" for ns in NAMESPACES for i in range(4)]


def explain_one_by_one(store: Store, reasons: Mapping[str, str]) -> list[int]:
    """The former `explain_waiting`: one UPDATE ... RETURNING per workload (the reference)."""
    events = []
    with store.write() as conn:
        for key, reason in reasons.items():
            namespace, name = key.split("/", 1)
            uid = conn.execute(
                update(t.workloads)
                .where(t.workloads.c.namespace == namespace, t.workloads.c.name == name,
                       t.workloads.c.phase == PENDING)
                .values(reason=reason)
                .returning(t.workloads.c.uid)
            ).scalar()  # fmt: skip
            if uid is not None:
                events.append(Event("Workload", key, "Waiting", reason, uid))
        return store.log(conn, events)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store]]:
    pair = []
    for side in ("reference", "new"):
        store = Store.open(f"sqlite:///{tmp_path_factory.mktemp(side) / 'fs.db'}")
        items = []
        for key in KEYS:
            namespace, name = key.split("/", 1)
            items.append((namespace, name, "tenant", workload(name, namespace)))
        store.submit(items, uids=[f"uid-{key}" for key in KEYS])
        pair.append(store)
    yield pair[0], pair[1]
    for store in pair:
        store.close()


def state(store: Store, after: int) -> tuple[list[Any], list[Any]]:
    with store.read() as conn:
        rows = conn.execute(
            select(t.workloads.c.namespace, t.workloads.c.name, t.workloads.c.phase, t.workloads.c.reason,
                   t.workloads.c.version).order_by(t.workloads.c.id)
        ).all()  # fmt: skip
        events = conn.execute(
            select(t.events.c.kind, t.events.c.object, t.events.c.reason, t.events.c.message, t.events.c.uid,
                   t.events.c.count).where(t.events.c.id > after).order_by(t.events.c.id)
        ).all()  # fmt: skip
    return [tuple(r) for r in rows], [tuple(e) for e in events]


@settings(max_examples=40, deadline=None)
@given(
    bound=st.sets(st.sampled_from(KEYS)),
    reasons=st.lists(
        st.tuples(
            st.sampled_from([*KEYS, "team-a/gone", "team-d/w0", "team-a/w0/x"]), st.sampled_from(["", "r1", "r2"])
        ),
        unique_by=lambda kv: kv[0],
        max_size=16,
    ),
)
def test_one_statement_writes_what_one_per_workload_wrote(
    stores: tuple[Store, Store], bound: set[str], reasons: list[tuple[str, str]]
) -> None:
    reference, new = stores
    marks = []
    for store in stores:
        with store.write() as conn:  # this example's phases: some workloads are no longer Pending
            for key in KEYS:
                namespace, name = key.split("/", 1)
                phase = "Bound" if key in bound else PENDING
                conn.execute(
                    update(t.workloads)
                    .where(t.workloads.c.namespace == namespace, t.workloads.c.name == name)
                    .values(phase=phase)
                )
        marks.append(store.last_event_id())
    written = explain_one_by_one(reference, dict(reasons))
    ids = new.explain_waiting(dict(reasons))
    assert len(ids) == len(written)
    assert state(new, marks[1]) == state(reference, marks[0])


def test_nothing_to_explain_writes_nothing(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'fs.db'}")
    try:
        before = store.last_event_id()
        assert store.explain_waiting({}) == []
        assert store.explain_waiting({"team-a/none": "r"}) == []
        assert store.last_event_id() == before
    finally:
        store.close()
