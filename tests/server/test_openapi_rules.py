"""The OpenAPI document states every rule a schema can state, and the API keeps the same ones: each
rule below is checked in the document and against the server (the schema-valid form accepted, the
other refused with 422 naming the field)."""

from __future__ import annotations

import re

import pytest
from manifests import node, workload
from server_harness import Api


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_rules_the_document_states_are_the_apis(api: Api) -> None:
    schemas = api.admin.get("/openapi.json").json()["components"]["schemas"]

    keys = schemas["NodeSpec"]["properties"]["gpuPartitions"]["propertyNames"]["pattern"]
    assert [k for k in ("1", "2", "16", "0", "01", "x", " 2", "+2") if re.match(keys, k)] == ["1", "2", "16"]
    gpus = node("g1", gpus=2)
    gpus["spec"]["gpuPartitions"] = {"2": [{"minors": [0, 1]}]}
    assert api.admin.post("/v1/nodes", json=gpus).status_code == 201
    gpus["metadata"]["name"] = "g2"
    gpus["spec"]["gpuPartitions"] = {"02": [{"minors": [0, 1]}]}
    refused = api.admin.post("/v1/nodes", json=gpus)
    problem = refused.json()["detail"][0]
    assert refused.status_code == 422 and problem["loc"][:3] == ["body", "spec", "gpuPartitions"]
    assert "'02'" in problem["msg"]

    branches = schemas["NodeAffinityTerm"]["oneOf"]
    assert {"In", "NotIn"} == set(branches[0]["properties"]["operator"]["enum"])
    assert branches[0]["properties"]["values"]["minItems"] == 1 and branches[0]["required"] == ["values"]
    assert branches[1]["properties"]["values"]["maxItems"] == 0
    for operator, values, status in (("In", ["a"], 201), ("NotIn", [], 422), ("Exists", ["a"], 422)):
        term = {"key": "zone", "operator": operator, "values": values}
        sent = api.admin.post("/v1/workloads", json=workload(f"w-{operator.lower()}", nodeAffinity=[term]))
        assert sent.status_code == status, sent.text

    root = schemas["RunAs"]["anyOf"]
    assert root[0]["properties"]["uid"]["minimum"] == 1 and root[1]["properties"]["allowRoot"]["const"] is True
    for run_as, status in (({"uid": 1000, "gid": 1000}, 200), ({"uid": 0, "gid": 1000}, 422),
                           ({"uid": 0, "gid": 0, "allowRoot": True}, 200)):  # fmt: skip
        doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t"},
               "spec": {"runAs": run_as}}  # fmt: skip
        assert api.admin.put("/v1/tenants/t", json=doc).status_code == status

    empty = schemas["DeviceHint"]["properties"]["vfSelector"]["anyOf"][1]["properties"]
    assert empty["matchLabels"]["maxProperties"] == 0 and empty["matchExpressions"]["maxItems"] == 0
