"""What a replica that does not schedule knows of the cluster's device types: read from the stored
nodes as their manifests say, at most once per TTL and by one request at a time (a follower under
50 concurrent clients once spent minutes with every request decoding every node)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from manifests import node

from finesched.server.api.context import ServerContext, stored_device_types
from finesched.server.store.cluster_view import node_from_row


def row(doc: dict[str, Any]) -> dict[str, Any]:
    return {"name": doc["metadata"]["name"], "spec": doc, "report": None}


def with_fpga(doc: dict[str, Any]) -> dict[str, Any]:
    doc["spec"].setdefault("devices", []).append({"type": "fpga", "minor": 0, "resources": {"fpga": 100}})
    return doc


def test_the_stored_types_are_the_types_of_the_parsed_nodes() -> None:
    rows = [row(node("a", gpus=2)), row(with_fpga(node("b"))), row(node("c")), {"name": "d", "spec": {}}]
    parsed = {d.type for r in rows[:3] for d in node_from_row(r).devices}
    assert stored_device_types(rows) == parsed == {"gpu", "fpga"}


class SlowStore:
    """A store whose node listing takes a while, counting how often it is read."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows, self.reads = rows, 0

    def list_nodes(self) -> list[dict[str, Any]]:
        self.reads += 1
        time.sleep(1.0)
        return self.rows


def test_a_follower_reads_the_stored_nodes_once_per_ttl_and_serves_the_last_types_meanwhile() -> None:
    store = SlowStore([row(node("a", gpus=1))])
    follower = SimpleNamespace(lock=threading.Lock(), scheduler=None)
    ctx = ServerContext(store=store, loop=follower, metrics=None, tokens=None)  # type: ignore[arg-type]
    assert ctx.device_types() == {"gpu"} and store.reads == 1  # the first read is waited for
    assert ctx.device_types() == {"gpu"} and store.reads == 1  # within the TTL: not read again

    store.rows = [row(with_fpga(node("a", gpus=1)))]
    ctx._device_types = (time.monotonic() - 3600, ctx._device_types[1])  # the TTL has passed
    answers: list[tuple[frozenset[str], float]] = []

    def ask() -> None:
        started = time.monotonic()
        answers.append((ctx.device_types(), time.monotonic() - started))

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.reads == 2  # one refresh for twenty concurrent requests
    assert {"gpu", "fpga"} in [types for types, _ in answers]  # the one that read
    stale = [elapsed for types, elapsed in answers if types == {"gpu"}]
    assert stale and max(stale) < 0.5  # the others answered with the last types, without waiting
    assert ctx.device_types() == {"gpu", "fpga"}
