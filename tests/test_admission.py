"""Admission (finesched.admission): the rules every door applies, checked without a server.

The HTTP side (the same rules through the API, 403 for namespaces, poison isolation) is in
tests/server/test_server_admission.py; here are the rules themselves, names included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finesched.admission import (
    MAX_JOB_SLOTS,
    MAX_SAFE_INTEGER,
    NotAllowed,
    World,
    admit_job,
    admit_manifests,
    admit_node,
    admit_tenant,
    admit_workload,
    sound_tenants,
)
from finesched.cli import app
from finesched.errors import ValidationError
from finesched.model import Job, Node, Tenant, Workload, load_manifests, parse_manifest
from finesched.model.names import is_label, is_subdomain

API = "finesched.io/v1alpha1"
WORLD = World({"alpha": Tenant(name="alpha"), "beta": Tenant(name="beta", namespaces=("shared",))})
runner = CliRunner(env={"COLUMNS": "250"})


def paths(exc: pytest.ExceptionInfo[ValidationError]) -> dict[str, str]:
    return {e.path: e.message for e in exc.value.errors}


def workload(**fields: object) -> Workload:
    return Workload.model_validate({"name": "w", "namespace": "alpha", **fields})


# Names ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a", "web-1", "a.b.c", "0x", "x" * 253])
def test_valid_object_names(name: str) -> None:
    assert is_subdomain(name)
    assert Workload.model_validate({"name": name}).name == name


@pytest.mark.parametrize("name", ["", "A", "a/b", "a_b", "-a", "a-", "a..b", "x" * 254, "a b", "ü"])
def test_invalid_object_names_are_refused_by_every_model(name: str) -> None:
    assert not is_subdomain(name)
    job = {"tasks": [{"id": "t", "operators": [{"id": "o"}]}]}
    for kind, extra in (("Workload", {}), ("Node", {}), ("Tenant", {}), ("Job", job)):
        doc = {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": extra}
        with pytest.raises(ValidationError) as exc:
            parse_manifest(doc)
        assert "metadata.name" in paths(exc), kind


def test_namespaces_are_labels_and_messages_are_kubernetes() -> None:
    assert is_label("team-a") and not is_label("a.b") and not is_label("x" * 64) and is_label("x" * 63)
    with pytest.raises(ValidationError) as exc:
        parse_manifest({"apiVersion": API, "kind": "Workload", "metadata": {"name": "w", "namespace": "Team_A"}})
    assert (
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters"
        in paths(exc)["metadata.namespace"]
    )
    with pytest.raises(ValidationError) as exc:
        parse_manifest({"apiVersion": API, "kind": "Workload", "metadata": {"name": "w" * 300}})
    assert paths(exc)["metadata.name"].startswith("must be no more than 253 characters")


def test_a_slot_sharing_group_becomes_part_of_names_so_it_is_a_label() -> None:
    with pytest.raises(ValidationError) as exc:
        parse_manifest(
            {"apiVersion": API, "kind": "Job", "metadata": {"name": "j"},
             "spec": {"tasks": [{"id": "t", "slotSharingGroup": "Ingest_A", "operators": [{"id": "o"}]}]}}
        )  # fmt: skip
    assert "spec.tasks[0].slotSharingGroup" in paths(exc)


# Workloads --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "requests, message",
    [
        ({"koordinator.sh/gpu-core": 50}, "invalid resource device requests: [koordinator.sh/gpu-core]"),
        ({"gpu-core": 150, "gpu-memory-ratio": 150}, "invalid resource unit koordinator.sh/gpu-"),  # either name
        ({"rdma": 150}, "invalid resource unit koordinator.sh/rdma: 150"),
        ({"nvidia.com/gpu": 1, "gpu-core": 100}, "invalid resource device requests"),
    ],
)
def test_device_requests_follow_the_schedulers_own_rules(requests: dict, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        admit_workload(workload(requests=requests), WORLD)
    assert message in paths(exc)["spec.requests"]


def test_a_device_type_a_node_defines_gets_the_percentage_rule() -> None:
    asks = workload(requests={"npu": 150})
    assert admit_workload(asks, WORLD).requests["npu"] == 150  # no node defines "npu": a plain scalar
    with pytest.raises(ValidationError, match="invalid resource unit"):
        admit_workload(asks, World(WORLD.tenants, frozenset({"npu"})))


def test_the_tenant_is_the_namespaces_owner() -> None:
    assert admit_workload(workload(), WORLD).tenant == "alpha"
    assert admit_workload(workload(namespace="shared"), WORLD).tenant == "beta"  # granted to beta
    assert admit_workload(workload(namespace="default"), WORLD).tenant == "default"  # always exists
    with pytest.raises(ValidationError) as exc:
        admit_workload(workload(tenant="beta"), WORLD)
    assert "belongs to tenant alpha" in paths(exc)["spec.tenant"]
    with pytest.raises(ValidationError) as exc:
        admit_workload(workload(namespace="nowhere"), WORLD)
    assert "belongs to no tenant" in paths(exc)["metadata.namespace"]
    with pytest.raises(ValidationError) as exc:
        admit_workload(workload(namespace="finesched-offers"), WORLD)
    assert "reserved" in paths(exc)["metadata.namespace"]


def test_numbers_are_finite_and_within_2_53() -> None:
    fine = workload(requests={"memory": str(MAX_SAFE_INTEGER)})
    assert admit_workload(fine, WORLD).requests["memory"] == MAX_SAFE_INTEGER
    with pytest.raises(ValidationError) as exc:
        admit_workload(workload(requests={"memory": str(MAX_SAFE_INTEGER + 1)}), WORLD)
    assert "2^53 - 1" in paths(exc)["spec.requests.memory"]
    node = Node.model_validate({"name": "n", "allocatable": {"cpu": "9e15"}})
    with pytest.raises(ValidationError) as exc:
        admit_node(node, WORLD)
    assert "spec.allocatable.cpu" in paths(exc)
    for weight in (float("inf"), float("nan"), 0.0, 2e6):
        with pytest.raises(Exception):  # noqa: B017 - pydantic's own error: the model bounds it
            Tenant(name="t", weight=weight)
    with pytest.raises(Exception):  # noqa: B017
        workload(priority=2**31)


# Tenants ----------------------------------------------------------------------------------------------
def test_parents_exist_and_make_no_cycle() -> None:
    with pytest.raises(ValidationError) as exc:
        admit_tenant(Tenant(name="c", parent="nobody"), WORLD)
    assert paths(exc) == {"spec.parent": "tenant nobody does not exist"}
    tree = WORLD.with_tenant(Tenant(name="alpha", parent="beta"))
    with pytest.raises(ValidationError) as exc:
        admit_tenant(Tenant(name="beta", parent="alpha"), tree)
    assert "makes a cycle (beta -> alpha -> beta)" in paths(exc)["spec.parent"]
    assert admit_tenant(Tenant(name="gamma", parent="alpha"), tree).parent == "alpha"


def test_a_namespace_belongs_to_one_tenant() -> None:
    with pytest.raises(ValidationError) as exc:
        admit_tenant(Tenant(name="gamma", namespaces=("alpha", "shared")), WORLD)
    assert paths(exc) == {
        "spec.namespaces[0]": "belongs to tenant alpha",
        "spec.namespaces[1]": "belongs to tenant beta",
    }
    with pytest.raises(ValidationError) as exc:
        admit_tenant(Tenant(name="shared"), WORLD)  # its own namespace is beta's already
    assert "granted to tenant beta" in paths(exc)["metadata.name"]
    with pytest.raises(ValidationError):
        admit_tenant(Tenant(name="finesched-offers"), WORLD)


def test_sound_tenants_leaves_out_what_the_scheduler_cannot_use() -> None:
    tenants = [Tenant(name="a", parent="b"), Tenant(name="b", parent="a"), Tenant(name="c"),
               Tenant(name="d", parent="gone"), Tenant(name="e", parent="d")]  # fmt: skip
    good, refused = sound_tenants(tenants)
    assert [t.name for t in good] == ["c"]
    assert set(refused) == {"a", "b", "d", "e"} and "cycle" in refused["a"] and "names no tenant" in refused["d"]


# Jobs -------------------------------------------------------------------------------------------------
def _job(name: str = "etl", parallelism: int = 2, namespace: str = "alpha") -> Job:
    task = {"id": "t", "parallelism": parallelism, "operators": [{"id": "o"}]}
    return Job.model_validate({"name": name, "namespace": namespace, "tasks": [task]})


def test_a_jobs_slots_are_admitted_as_workloads() -> None:
    _, slots = admit_job(_job(), WORLD)
    assert [w.key for w in slots] == ["alpha/etl-region-0-0", "alpha/etl-region-0-1"]
    assert {w.tenant for w in slots} == {"alpha"}
    with pytest.raises(ValidationError) as exc:
        admit_job(_job(namespace="nowhere"), WORLD)
    assert "metadata.namespace" in paths(exc)
    with pytest.raises(ValidationError) as exc:
        admit_job(_job(name="j" * 250), WORLD)
    assert "too long for its slot workloads' names" in paths(exc)["metadata.name"]
    with pytest.raises(ValidationError) as exc:
        admit_job(_job(parallelism=MAX_JOB_SLOTS + 1), WORLD)
    assert "spec.tasks" in paths(exc)


# One function for `finesched validate` and the server ------------------------------------------------
def test_validate_reports_what_the_server_refuses_and_warns_of_what_it_cannot_see(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: g50, namespace: alpha}}\n"
        "spec: {requests: {koordinator.sh/gpu-core: 50}}\n---\n"
        f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: {'x' * 300}, namespace: alpha}}\n---\n"
        f"apiVersion: {API}\nkind: Tenant\nmetadata: {{name: alpha}}\nspec: {{parent: nobody, weight: .inf}}\n"
    )
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "doc 1, line 4: spec.requests" in result.stderr and "invalid resource device requests" in result.stderr
    assert "doc 2, line 8: metadata.name" in result.stderr and "doc 3, line 13: spec.weight" in result.stderr
    good = tmp_path / "good.yaml"
    good.write_text(f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: w, namespace: team-x}}\n")
    result = runner.invoke(app, ["validate", str(good)])
    assert (
        result.exit_code == 0
        and "warning:" in result.stderr
        and "namespace team-x belongs to no tenant" in result.stderr
    )


def test_admit_manifests_resolves_tenants_from_the_files() -> None:
    examples = Path(__file__).resolve().parents[1] / "examples"
    admitted, warnings = admit_manifests(load_manifests(examples / "workloads.yaml"))
    assert {w.tenant for w in admitted.workloads} == {"team-a", "team-b"} and warnings == []


@pytest.mark.parametrize(
    ("tenants", "requests", "refusal"),
    [
        ({"tb": {"max": {"cpu": "4"}}}, {"cpu": "8"}, "exceeded quota: tenant tb, requested: cpu=8, max: cpu=4"),
        ({"tb": {"max": {"cpu": "4"}}}, {"cpu": "4"}, None),  # fits when nothing else is held: admitted
        ({"tb": {"quota": {"memory": "1Gi"}}}, {"memory": "2Gi"},
         "exceeded quota: tenant tb, requested: memory=2Gi, quota: memory=1Gi"),
        ({"org": {"max": {"cpu": "6"}}, "tb": {"parent": "org", "max": {"cpu": "8"}}}, {"cpu": "7"},
         "exceeded quota: tenant org (an ancestor of tb), requested: cpu=7, max: cpu=6"),
        ({"tb": {"min": {"cpu": "1"}}}, {"cpu": "64"}, None),  # a guarantee is no cap
    ],
)  # fmt: skip
def test_a_request_over_a_cap_by_itself_is_refused_where_the_tenant_is_known(
    tmp_path: Path, tenants: dict, requests: dict, refusal: str | None
) -> None:
    docs = [
        f"apiVersion: {API}\nkind: Tenant\nmetadata: {{name: {name}}}\nspec: {json.dumps(spec)}\n"
        for name, spec in tenants.items()
    ]
    spec = f"spec: {{requests: {json.dumps(requests)}}}\n"
    docs.append(f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: w, namespace: tb}}\n{spec}")
    manifest = tmp_path / "quota.yaml"
    manifest.write_text("---\n".join(docs))
    result = runner.invoke(app, ["validate", str(manifest)])
    if refusal is None:
        assert result.exit_code == 0, result.stderr
        return
    assert result.exit_code == 1 and refusal in " ".join(result.stderr.split())
    world = World({name: Tenant.model_validate({"name": name, **spec}) for name, spec in tenants.items()})
    with pytest.raises(NotAllowed, match="no release can make room"):
        admit_workload(Workload.model_validate({"name": "w", "namespace": "tb", "requests": requests}), world)
