"""The control-plane page's curl example (docs/concepts/control-plane.md), sent as written to a real
server, answers what the page shows."""

from __future__ import annotations

import json
import re

import pytest
from server_harness import inprocess_server

from docs_pages import page_text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_documented_curl_example(db_url: str) -> None:
    text = page_text("concepts/control-plane.md")
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, flags=re.S) if "curl -s -X POST" in b)
    calls = re.findall(r"curl -s -X POST localhost:8080(\S+) .*?-d '(.*?)'", block, flags=re.S)
    assert [path for path, _ in calls] == ["/v1/tenants", "/v1/nodes", "/v1/workloads"]
    with inprocess_server(db_url, tenants=()) as api:  # a new server: the example creates its tenant
        for path, body in calls:
            assert api.admin.post(path, json=json.loads(body)).status_code == 201
        shown = api.wait_phase("team-a/infer", ("Bound",))["status"]["binding"]
    assert shown["node"] == "g1" and shown["cpuset"] == "0,8"
    assert shown["devices"] == {"gpu": [{"minor": 0, "resources": {"gpu-core": "30", "gpu-memory-ratio": "30",
                                                                     "gpu-memory": "5153960755"}}]}  # fmt: skip
    assert shown["numa"] == [{"numa": 0, "resources": {"cpu": "2"}}]
    documented = re.search(r'"cpuset": "([^"]*)"', block)
    assert documented and documented.group(1) == shown["cpuset"]
