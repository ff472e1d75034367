"""Manifests: the examples load, dump round-trips, and every kind of bad input is reported exactly."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from finesched import load_manifests, parse_manifest
from finesched.errors import ValidationError
from finesched.model.manifest import dump, to_manifest
from finesched.model.node import Node
from finesched.model.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [ROOT / "examples" / "cluster.yaml", ROOT / "examples" / "workloads.yaml"]


def node_doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "finesched.io/v1alpha1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "spec": {"allocatable": {"cpu": "8", "memory": "16Gi"}, **spec},
    }


def workload_doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "finesched.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "w1", "namespace": "team-a"},
        "spec": {"requests": {"cpu": "1", "memory": "1Gi"}, **spec},
    }


def test_examples_load_with_every_shape() -> None:
    m = load_manifests(*EXAMPLES)
    assert len(m.nodes) >= 4 and len(m.workloads) >= 15 and len(m.tenants) == 2
    a100 = next(n for n in m.nodes if n.name == "a100-0")
    assert len(a100.cpu_topology.cpus) == 128  # 2 sockets x 32 cores x 2 threads
    assert len(a100.devices_of("gpu")) == 8 and len(a100.devices_of("rdma")) == 2
    assert a100.allocatable["memory"] == 2**40
    cpu_node = next(n for n in m.nodes if n.name == "cpu-0")
    assert cpu_node.allocatable["cpu"] == 64_000  # derived from the topology: 64 logical CPUs
    infer = next(w for w in m.workloads if w.name == "infer-ratio")
    assert infer.requests == {"cpu": 4000, "memory": 8 * 2**30, "gpu-core": 50, "gpu-memory-ratio": 50}
    assert next(w for w in m.workloads if w.name == "crawler").qos == "BE"
    assert next(w for w in m.workloads if w.name == "guaranteed-2cpu").k8s_qos == "Guaranteed"


def test_dump_round_trips_every_example() -> None:
    m = load_manifests(*EXAMPLES)
    for obj in m:
        assert parse_manifest(to_manifest(obj)) == obj
    again = [parse_manifest(doc) for doc in yaml.safe_load_all(dump(m))]
    assert again == list(m)


def test_builder_topology_numbers_threads_like_linux() -> None:
    node = parse_manifest(node_doc(cpuTopology={"sockets": 2, "coresPerNuma": 2, "threadsPerCore": 2}))
    # cores 0,1 on socket 0; 2,3 on socket 1; thread 2 of core c is CPU 4 + c
    assert [(c.id, c.core, c.socket, c.numa) for c in node.cpu_topology.cpus] == [
        (0, 0, 0, 0),
        (1, 1, 0, 0),
        (2, 2, 1, 1),
        (3, 3, 1, 1),
        (4, 0, 0, 0),
        (5, 1, 0, 0),
        (6, 2, 1, 1),
        (7, 3, 1, 1),
    ]


def test_workload_defaults_request_from_limit_and_tenant_from_namespace() -> None:
    w = parse_manifest(workload_doc(requests={}, limits={"cpu": "2", "memory": "1Gi"}))
    assert isinstance(w, Workload)
    assert w.requests == {"cpu": 2000, "memory": 2**30}
    assert (w.tenant, w.k8s_qos, w.qos) == ("team-a", "Guaranteed", "LS")


def test_aliases_fold_to_one_name() -> None:
    w = parse_manifest(workload_doc(requests={"kubernetes.io/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": "50"}))
    assert w.requests == {"gpu-core": 50, "gpu-memory-ratio": 50}


BAD_DOCS = [
    pytest.param({**node_doc(), "kind": "Pod"}, "kind", "must be one of", id="unknown-kind"),
    pytest.param(
        {**node_doc(), "apiVersion": "v1"}, "apiVersion", "must be finesched.io/v1alpha1", id="unknown-apiVersion"
    ),
    pytest.param(
        node_doc(colour="red"), "spec.colour", "unknown field; allowed: ['allocatable'", id="unknown-spec-field"
    ),
    pytest.param(
        node_doc(devices=[{"type": "gpu", "minor": 0, "healt": True}]),
        "spec.devices[0].healt",
        "unknown field; allowed: ['type', 'minor'",
        id="unknown-nested-field",
    ),
    pytest.param(
        node_doc(allocatable={"cpu": "abc"}),
        "spec.allocatable.cpu",
        '"abc" is not a quantity',
        id="non-numeric-quantity",
    ),
    pytest.param(
        node_doc(allocatable={"memory": "-1Gi"}),
        "spec.allocatable.memory",
        "must not be negative",
        id="negative-quantity",
    ),
    pytest.param(
        workload_doc(limits={"cpu": "500m"}), "spec.limits.cpu", "is below the request (1)", id="limit-below-request"
    ),
    pytest.param(
        workload_doc(qos="LSE", requests={"cpu": "1500m"}, limits={"cpu": "1500m"}),
        "spec.requests.cpu",
        "LSE needs whole CPUs",
        id="lse-fractional-cpu",
    ),
    pytest.param(
        workload_doc(qos="LSR", requests={"cpu": "2"}, limits={"cpu": "4"}),
        "spec.limits.cpu",
        "LSR needs limit == request (2)",
        id="lsr-request-not-limit",
    ),
    pytest.param(workload_doc(qos="LSX"), "spec.qos", "input should be 'LSE', 'LSR', 'LS' or 'BE'", id="unknown-qos"),
    pytest.param(
        node_doc(devices=[{"type": "gpu", "minor": 0}, {"type": "gpu", "minor": 0}]),
        "spec.devices[1].minor",
        "duplicate gpu minor",
        id="duplicate-device-minor",
    ),
    pytest.param(
        node_doc(cpuTopology={"sockets": 1, "coresPerNuma": 2}, devices=[{"type": "gpu", "minor": 0, "numa": 3}]),
        "spec.devices[0].numa",
        "is not a NUMA node of this node [0]",
        id="device-numa-not-in-topology",
    ),
    pytest.param(
        node_doc(
            cpuTopology={
                "cpus": [{"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 0, "core": 1, "socket": 0, "numa": 0}]
            }
        ),
        "spec.cpuTopology.cpus[1].id",
        "duplicate CPU id",
        id="topology-duplicate-cpu-id",
    ),
    pytest.param(
        node_doc(links=[{"type": "gpu", "a": 0, "b": 1}], devices=[{"type": "gpu", "minor": 0}]),
        "spec.links[0].b",
        "no gpu device has this minor",
        id="link-to-missing-device",
    ),
    pytest.param(
        node_doc(kubelet={"cpuManagerPolicy": "static", "options": {"full-pcpu-only": "true"}}),
        "spec.kubelet.options",
        "unknown kubelet CPU manager option",
        id="unknown-kubelet-option",
    ),
    pytest.param(
        workload_doc(requests={"bad name!": 1}),
        "spec.requests.bad name!",
        "is not a valid resource name",
        id="bad-resource-name",
    ),
    pytest.param(
        workload_doc(requests={"gpu-core": 10, "koordinator.sh/gpu-core": 10}),
        "spec.requests.koordinator.sh/gpu-core",
        "names the same resource as another key (gpu-core)",
        id="alias-given-twice",
    ),
    pytest.param({**workload_doc(), "metadata": {"namespace": "x"}}, "metadata.name", "is required", id="missing-name"),
    pytest.param(workload_doc(name="x"), "spec.name", "belongs in metadata", id="metadata-field-in-spec"),
]


@pytest.mark.parametrize(("doc", "path", "message"), BAD_DOCS)
def test_bad_documents_name_the_field_and_rule(doc: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc, where="bad.yaml doc 1")
    matching = [e for e in info.value.errors if e.path == path]
    assert matching, f"no error at {path}: {info.value}"
    assert any(message in str(e) for e in matching), str(info.value)
    assert all(str(e).startswith("bad.yaml doc 1: ") for e in info.value.errors)


def test_error_line_shows_file_doc_path_value_and_rule(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    good = yaml.safe_dump(workload_doc())
    bad_doc = workload_doc(requests={"cpu": "abc"})
    bad_doc["metadata"]["name"] = "w2"  # its own name (a repeated one would be a second error)
    bad = yaml.safe_dump(bad_doc)
    path.write_text(good + "---\n" + bad)
    with pytest.raises(ValidationError) as info:
        load_manifests(path)
    line = 1 + path.read_text().splitlines().index("    cpu: abc")  # the field's own line, not the document's
    assert str(info.value) == (
        f'{path} doc 2, line {line}: spec.requests.cpu: "abc" is not a quantity: expected a number with an optional '
        "suffix (n, u, m, k, M, G, T, P, E, Ki..Ei or an exponent like e3)"
    )


def test_every_error_is_reported_and_nothing_is_loaded(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    second = tmp_path / "b.json"
    first.write_text(yaml.safe_dump_all([node_doc(), {**node_doc(), "kind": "Nope"}]))
    bad_workload = workload_doc(requests={"cpu": "-2", "memory": "lots"})
    second.write_text(json.dumps([bad_workload, node_doc()]))  # the Node repeats n1: a duplicate
    with pytest.raises(ValidationError) as info:
        load_manifests(first, second)
    paths = sorted((e.where, e.path) for e in info.value.errors)
    kind_line = 1 + first.read_text().splitlines().index("kind: Nope")
    assert paths == [  # the JSON file is one line
        (f"{first} doc 2, line {kind_line}", "kind"),
        (f"{second} doc 1, line 1", "spec.requests.cpu"),
        (f"{second} doc 1, line 1", "spec.requests.memory"),
        (f"{second} doc 2, line 1", "metadata.name"),
    ]


def test_duplicate_node_names_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump_all([node_doc(), node_doc()]))
    with pytest.raises(ValidationError, match=r"doc 2, line [0-9]+: metadata.name: \"n1\" duplicate Node"):
        load_manifests(path)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    with pytest.raises(ValidationError, match="is not valid YAML: line 2 column 1"):
        load_manifests(broken)
    with pytest.raises(ValidationError, match="cannot read"):
        load_manifests(tmp_path / "missing.yaml")


def test_a_manifest_must_be_a_mapping() -> None:
    with pytest.raises(ValidationError, match="a manifest is a mapping, got list"):
        parse_manifest([1, 2])


def test_job_structure_is_checked() -> None:
    job = {
        "apiVersion": "finesched.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "etl"},
        "spec": {
            "tasks": [
                {"id": "a", "operators": [{"id": "op1", "resources": {"cpu": "0.5", "taskHeap": "512Mi"}}]},
                {"id": "b", "parallelism": 2, "operators": [{"id": "op2"}]},
            ],
            "edges": [{"from": "a", "to": "b"}],
        },
    }
    parsed = parse_manifest(job)
    assert parsed.tasks[0].operators[0].resources.task_heap == 512 * 2**20
    assert parsed.all_sources_in_same_region is True  # streaming default (S2.2)
    cyclic = copy.deepcopy(job)
    cyclic["spec"]["edges"].append({"from": "b", "to": "a"})
    with pytest.raises(ValidationError, match="has a cycle"):
        parse_manifest(cyclic)
    dangling = copy.deepcopy(job)
    dangling["spec"]["edges"] = [{"from": "a", "to": "zz"}]
    with pytest.raises(ValidationError, match=r"spec.edges\[0\].to: \"zz\" no task has this id"):
        parse_manifest(dangling)
    bad_quantity = copy.deepcopy(job)
    bad_quantity["spec"]["tasks"][0]["operators"][0]["resources"]["taskHeap"] = "lots"
    with pytest.raises(ValidationError, match=r"spec.tasks\[0\].operators\[0\].resources.taskHeap"):
        parse_manifest(bad_quantity)


def test_node_defaults_pods_and_device_resources() -> None:
    node = parse_manifest(node_doc(devices=[{"type": "gpu", "minor": 0}, {"type": "rdma", "minor": 0}]))
    assert isinstance(node, Node)
    assert node.allocatable["pods"] == 110  # the kubelet's default maxPods
    assert node.devices[0].resources == {"gpu-core": 100, "gpu-memory-ratio": 100}
    assert node.devices[1].resources == {"rdma": 100}


def test_repeated_keys_are_errors_in_yaml_and_json(tmp_path: Path) -> None:
    doubled = tmp_path / "doubled.yaml"
    doubled.write_text(
        "apiVersion: finesched.io/v1alpha1\nkind: Workload\nmetadata: {name: w}\nspec:\n  requests: {cpu: 1, cpu: 64}\n"
    )
    with pytest.raises(ValidationError, match=r"line 5 column \d+: duplicate key 'cpu'"):
        load_manifests(doubled)
    as_json = tmp_path / "doubled.json"
    tenant = '"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant"'
    as_json.write_text("{" + tenant + ', "metadata": {"name": "a", "name": "b"}}')
    with pytest.raises(ValidationError, match="duplicate key 'name'"):
        load_manifests(as_json)


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(
        "apiVersion: finesched.io/v1alpha1\nkind: Workload\nmetadata: {name: w}\n"
        "spec:\n  requests: &r {cpu: 1}\n  limits:\n    <<: *r\n    memory: 1Gi\n"
    )
    assert load_manifests(path).workloads[0].limits["memory"] == 2**30


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValidationError, match=r"binary.yaml: is not UTF-8 text \(byte 0xff at offset 0\)"):
        load_manifests(path)


@pytest.mark.parametrize("kind", [["Node"], {"a": 1}, 3])
def test_a_kind_that_is_not_a_string_is_an_error(kind: object) -> None:
    with pytest.raises(ValidationError, match=r"kind: .* must be one of"):
        parse_manifest({"apiVersion": "finesched.io/v1alpha1", "kind": kind, "metadata": {"name": "n"}})


def test_envelope_and_spec_problems_are_reported_together() -> None:
    doc = node_doc(allocatable={"cpu": "zz", "memory": "1Gi"})
    doc["extra"] = 1
    doc["metadata"]["labelz"] = {}
    with pytest.raises(ValidationError) as caught:
        parse_manifest(doc)
    paths = [e.path for e in caught.value.errors]
    assert paths == ["extra", "metadata.labelz", "spec.allocatable.cpu"]


def test_metadata_must_be_a_mapping() -> None:
    doc = node_doc()
    doc["metadata"] = [1]
    with pytest.raises(ValidationError, match="metadata: \\[1\\] must be a mapping"):
        parse_manifest(doc)


def test_cpu_ids_and_builder_shapes_are_bounded() -> None:
    listed = node_doc(cpuTopology={"cpus": [{"id": 99999999, "core": 0, "socket": 0, "numa": 0}]})
    with pytest.raises(ValidationError, match=r"spec.cpuTopology.cpus\[0\].id: 99999999 .*65535"):
        parse_manifest(listed)
    huge = node_doc(cpuTopology={"sockets": 100000, "coresPerNuma": 100000, "threadsPerCore": 100})
    with pytest.raises(ValidationError, match="1000000000000 logical CPUs; at most 65536"):
        parse_manifest(huge)


@pytest.mark.parametrize(
    ("key", "text", "path", "message"),
    [
        (
            "scheduling.koordinator.sh/resource-spec",
            '{"preferredCPUBindPolicy": "Foo", "other": 1}',
            "metadata.annotations.scheduling.koordinator.sh/resource-spec.preferredCPUBindPolicy",
            "is not one of Default, FullPCPUs, SpreadByPCPUs, ConstrainedBurst",
        ),
        (
            "scheduling.koordinator.sh/numa-topology-spec",
            '{"numaTopologyPolicy": "single"}',
            "metadata.annotations.scheduling.koordinator.sh/numa-topology-spec.numaTopologyPolicy",
            "is not one of None, BestEffort, Restricted, SingleNUMANode",
        ),
        (
            "scheduling.koordinator.sh/resource-spec",
            "{not json",
            "metadata.annotations.scheduling.koordinator.sh/resource-spec",
            "is not JSON",
        ),
        ("scheduling.koordinator.sh/numa-topology-spec", "[1]", "", "must be a JSON object"),
    ],
)
def test_koordinator_annotations_are_checked_when_loaded(key: str, text: str, path: str, message: str) -> None:
    doc = workload_doc()
    doc["metadata"]["annotations"] = {key: text}
    with pytest.raises(ValidationError) as caught:
        parse_manifest(doc)
    (error,) = caught.value.errors
    assert message in error.message and (not path or error.path == path)


def gpu_node_doc(foreign: list[dict[str, Any]], memory: str | None = "80Gi", **spec: Any) -> dict[str, Any]:
    """One GPU (minor 0, an 80Gi card unless `memory` is None) and one rdma device, with `foreign` use."""
    gpu = {"type": "gpu", "minor": 0, **({"resources": {"gpu-memory": memory}} if memory else {})}
    return node_doc(devices=[gpu, {"type": "rdma", "minor": 0}], foreignAllocations=foreign, **spec)


def foreign(kind: str = "gpu", minor: int = 0, **resources: Any) -> dict[str, Any]:
    return {"type": kind, "minor": minor, "resources": {k.replace("_", "-"): v for k, v in resources.items()}}


BAD_DEVICE_NODES = [
    pytest.param(
        gpu_node_doc([foreign("rdma", gpu_core=10)]),
        "spec.foreignAllocations[0].resources.gpu-core",
        "10 rdma 0 has no gpu-core (its dimensions: ['rdma'])",
        id="foreign-dimension-the-device-lacks",
    ),
    pytest.param(
        gpu_node_doc([foreign(gpu_memory="8Gi")], memory=None),
        "spec.foreignAllocations[0].resources.gpu-memory",
        '"8Gi" gpu 0 has no gpu-memory',
        id="foreign-bytes-on-a-card-without-memory-figure",
    ),
    pytest.param(
        gpu_node_doc([foreign(gpu_core=60, gpu_memory_ratio=10), foreign(gpu_core=50, gpu_memory_ratio=10)]),
        "spec.foreignAllocations[1].resources.gpu-core",
        "50 foreign gpu-core on gpu 0 adds up to 110, above the device's total 100",
        id="foreign-sum-above-total",
    ),
    pytest.param(
        gpu_node_doc([foreign("rdma", rdma=101)]),
        "spec.foreignAllocations[0].resources.rdma",
        "foreign rdma on rdma 0 adds up to 101, above the device's total 100",
        id="foreign-single-entry-above-total",
    ),
    # ratio 60 on the 80Gi card is 48Gi; 40Gi more is 88Gi (and ratio 60 + 50 = 110): over, blamed once
    pytest.param(
        gpu_node_doc([foreign(gpu_memory_ratio=60), foreign(gpu_memory="40Gi")]),
        "spec.foreignAllocations[1].resources.gpu-memory",
        '"40Gi" foreign gpu-memory on gpu 0 adds up to 88Gi, above the device\'s total 80Gi',
        id="foreign-ratio-and-bytes-count-against-each-other",
    ),
    pytest.param(
        node_doc(devices=[{"type": "gpu", "minor": 0, "resources": {"gpu-core": 150, "gpu-memory-ratio": 100}}]),
        "spec.devices[0].resources.gpu-core",
        "150 a GPU has at most 100 gpu-core (100 = one whole GPU)",
        id="gpu-core-total-above-100",
    ),
    pytest.param(
        node_doc(devices=[{"type": "gpu", "minor": 0, "resources": {"koordinator.sh/gpu-memory-ratio": 200}}]),
        "spec.devices[0].resources.gpu-memory-ratio",
        "200 a GPU has at most 100 gpu-memory-ratio",
        id="gpu-ratio-total-above-100",
    ),
    pytest.param(
        {**node_doc(), "metadata": {"name": "n1", "labels": {"finesched.io/device-allocate-strategy": "Binpack"}}},
        "metadata.labels.finesched.io/device-allocate-strategy",
        "\"Binpack\" unknown device allocate strategy; allowed: ['LeastAllocated', 'MostAllocated']",
        id="bad-device-strategy-label",
    ),
]


@pytest.mark.parametrize(("doc", "path", "message"), BAD_DEVICE_NODES)
def test_bad_device_nodes_name_the_field_value_and_rule(doc: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc, where="bad.yaml doc 1")
    assert [e.path for e in info.value.errors] == [path], str(info.value)
    assert message in str(info.value.errors[0]), str(info.value)


def test_foreign_allocations_that_fit_exactly_are_accepted() -> None:
    doc = gpu_node_doc([foreign(gpu_core=60, gpu_memory_ratio=50), foreign(gpu_core=40, gpu_memory="40Gi")])
    node = parse_manifest(doc, where="ok.yaml")
    assert isinstance(node, Node) and len(node.foreign_allocations) == 2


@pytest.mark.parametrize(
    ("label", "value", "valid"),
    [
        ("node.koordinator.sh/cpu-bind-policy", "FullPCPUs", "None, FullPCPUsOnly, SpreadByPCPUs"),
        ("node.koordinator.sh/numa-allocate-strategy", "Most", "MostAllocated, LeastAllocated, DistributeEvenly"),
        ("node.koordinator.sh/numa-topology-policy", "single", "None, BestEffort, Restricted, SingleNUMANode"),
    ],
)
def test_koordinator_node_policy_labels_are_checked(label: str, value: str, valid: str) -> None:
    doc = node_doc()
    doc["metadata"]["labels"] = {label: value}
    with pytest.raises(ValidationError) as caught:
        parse_manifest(doc)
    (error,) = caught.value.errors
    assert error.path == f"metadata.labels.{label}" and error.message == f"is not one of {valid}"
    doc["metadata"]["labels"] = {"node.koordinator.sh/numa-topology-policy": "SingleNUMANodePodLevel"}
    assert parse_manifest(doc).labels["node.koordinator.sh/numa-topology-policy"] == "SingleNUMANodePodLevel"


def test_read_only_mappings_dump_as_yaml_and_empty_policies_mean_unset() -> None:
    doc = workload_doc()
    doc["metadata"]["labels"] = {"app": "web"}
    doc["metadata"]["annotations"] = {"scheduling.koordinator.sh/numa-topology-spec": '{"numaTopologyPolicy": ""}'}
    w = parse_manifest(doc)
    assert yaml.safe_load(yaml.safe_dump(w.labels)) == {"app": "web"}
    with pytest.raises(TypeError, match="read-only"):
        w.labels["app"] = "db"  # type: ignore[index]


def test_duplicates_are_reported_even_when_a_copy_is_invalid(tmp_path: Path) -> None:
    bad = node_doc(allocatable={"cpu": "zz"})
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump_all([bad, node_doc()]))
    with pytest.raises(ValidationError) as caught:
        load_manifests(path)
    assert [e.path for e in caught.value.errors] == ["spec.allocatable.cpu", "metadata.name"]
    assert "duplicate Node" in caught.value.errors[1].message


def test_an_unknown_topology_field_lists_both_forms() -> None:
    doc = node_doc(cpuTopology={"sockets": 1, "coresPerNuma": 4, "threadPerCore": 2})
    with pytest.raises(ValidationError, match=r"allowed: .*'cpus', 'sockets', 'numaPerSocket', 'coresPerNuma'"):
        parse_manifest(doc)
