"""One lock order for the store's writer and the scheduling loop: offers, declines, expiries and
submissions running at once never freeze a write nor answer 5xx, and a path that would take the
loop's lock inside a write transaction is refused at once (LockOrderError), not left to deadlock."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
from manifests import node, workload
from server_harness import Api, wait_until

from finesched.server.loop.loop import SchedulerLoop
from finesched.server.offers import open_offers
from finesched.server.store.locking import LockOrderError
from finesched.server.store.store import Store

ROUNDS_S = 3.0  # how long the three kinds of clients run together


def _offer_client(api: Api, seen: Counter[int], errors: list[str], stop: threading.Event, who: int) -> None:
    """Make short offers; decline every other one, accept a few, let the rest expire in the loop."""
    with api.client(api.token("admin")) as http:
        http.timeout = httpx.Timeout(10.0)  # the freeze this guards against lasted 30 s
        i = 0
        while not stop.is_set():
            i += 1
            try:
                made = http.post("/v1/offers", json={"tenant": "team-a", "demand": {"cpu": "1"}, "ttlSeconds": 0.3})
                seen[made.status_code] += 1
                if made.status_code != 201:
                    continue
                offer = made.json()["id"]
                if i % 2 == 0:
                    seen[http.post(f"/v1/offers/{offer}/decline").status_code] += 1
                elif i % 5 == 1:
                    name = f"acc-{who}-{i}"
                    body = {"workloads": [workload(name, cpu="100m", memory="1Mi")]}
                    seen[http.post(f"/v1/offers/{offer}/accept", json=body).status_code] += 1
                # else: left open; the loop expires it (once a second)
            except httpx.HTTPError as exc:
                errors.append(f"offer client {who}: {exc!r}")
                return


def _submitter(api: Api, keys: list[str], seen: Counter[int], errors: list[str], stop: threading.Event) -> None:
    with api.client(api.token("admin")) as http:
        http.timeout = httpx.Timeout(10.0)
        i = 0
        while not stop.is_set():
            batch = [workload(f"s{i + k}", "team-b", cpu="100m", memory="1Mi") for k in range(5)]
            try:
                answer = http.post("/v1/workloads", json=batch)
            except httpx.HTTPError as exc:
                errors.append(f"submitter: {exc!r}")
                return
            seen[answer.status_code] += 1
            if answer.status_code == 201:
                keys += [f"team-b/s{i + k}" for k in range(5)]
            i += 5


def test_offers_declines_expiries_and_submissions_run_together(api: Api) -> None:
    for n in range(3):
        doc = node(f"n{n}", cpu="256", memory="64Gi")
        doc["spec"]["allocatable"]["pods"] = "5000"
        assert api.admin.post("/v1/nodes", json=doc).status_code == 201
    seen: Counter[int] = Counter()
    errors: list[str] = []
    keys: list[str] = []
    stop = threading.Event()
    threads = [threading.Thread(target=_offer_client, args=(api, seen, errors, stop, w)) for w in range(2)]
    threads.append(threading.Thread(target=_submitter, args=(api, keys, seen, errors, stop)))
    for thread in threads:
        thread.start()
    time.sleep(ROUNDS_S)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert all(code < 500 for code in seen), seen
    assert seen[201] > 10 and keys
    # Every offer that was left open is expired by the loop; every submission is bound.
    wait_until(lambda: not open_offers(api.store), timeout=10, what="open offers to expire")
    for key in keys:
        api.wait_phase(key, ("Bound",))
    assert api.admin.get("/readyz").json()["leader"]  # the leader kept its lease throughout
    usage = api.admin.get("/v1/tenants/team-a/usage").json()["usage"]
    assert usage.get("cpu", 0) == 100 * _accepted(api)  # no hold of a closed offer is left behind


def _accepted(api: Api) -> int:
    items = api.admin.get("/v1/workloads", params={"tenant": "team-a"}).json()["items"]
    return sum(1 for w in items if w["status"]["phase"] == "Bound")


def test_taking_the_loop_lock_inside_a_write_transaction_is_refused(store: Store) -> None:
    loop = SchedulerLoop(store)
    with store.write(), pytest.raises(LockOrderError, match="inside a write transaction"), loop.lock:
        pass
    with loop.lock, store.write(), loop.lock:  # the documented order; re-entered by its holder
        pass
