"""Trace loaders: good files load, every malformed row is rejected with its line number; mapping to finesched."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_traces import NODE_HEADER, POD_HEADER, write

from finesched.sim.trace import (
    GPU_MODEL_LABEL,
    TraceError,
    WorkloadFactory,
    gpu_requests,
    load_nodes,
    load_pods,
    models_of,
    to_nodes,
)


def test_load_nodes_and_pods(tiny_trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny_trace[0]), load_pods(tiny_trace[1])
    assert len(nodes) == 30 and int(nodes.gpus.sum()) == 120
    assert nodes.gpu_capacity_milli == 120_000
    assert nodes.models[0] == "A" and nodes.models[-1] == ""
    assert len(pods) == 150 and pods.has_times
    assert pods.names[0] == "pod-0000"


def test_short_pod_list_without_times(tmp_path: Path) -> None:
    # The multigpu variants have only the first five columns.
    path = write(
        tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", ["p0,1000,512,2,1000", "p1,500,0,0,0"]
    )
    pods = load_pods(path)
    assert not pods.has_times
    assert pods.gpu_spec == ("", "") and pods.qos == ("default", "default")
    assert pods.gpu_request_milli.tolist() == [2000, 0]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        pytest.param("p1,abc,512,1,500,,LS,Running,0,1,0", "cpu_milli must be an integer", id="not-an-int"),
        pytest.param("p1,-5,512,1,500,,LS,Running,0,1,0", "cpu_milli must be >= 0", id="negative"),
        pytest.param("p1,1000,512,1,1200,,LS,Running,0,1,0", "gpu_milli must be in 1..1000", id="over-1000"),
        pytest.param("p1,1000,512,0,300,,LS,Running,0,1,0", "gpu_milli is 300 but num_gpu is 0", id="milli-no-gpu"),
        pytest.param("p1,1000,512,2,500,,LS,Running,0,1,0", "must take whole GPUs", id="multi-share"),
        pytest.param("p1,1000,512,1,455,,LS,Running,0,1,0", "multiple of 10", id="not-percent"),
        pytest.param("p1,1000,512,1,500,A||B,LS,Running,0,1,0", "empty model name", id="bad-spec"),
        pytest.param("p1,1000,512,1,500,,LS,Running,0", "fields, the header has 11", id="short-row"),
        pytest.param("p0,1000,512,1,500,,LS,Running,0,1,0", "duplicate pod 'p0' (first on line 2)", id="duplicate"),
        pytest.param(",1000,512,1,500,,LS,Running,0,1,0", "name is empty", id="no-name"),
    ],
)
def test_malformed_pod_rows_name_their_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path / "pods.csv", POD_HEADER, ["p0,1000,512,1,500,,LS,Running,0,1,0", row])
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    assert f"{path}:3: " in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        pytest.param("n1,64000,1024,2,", "has 2 GPUs but no model", id="gpus-without-model"),
        pytest.param("n1,64000,1024,x,T4", "gpu must be an integer", id="bad-count"),
        pytest.param("n0,64000,1024,2,T4", "duplicate node 'n0'", id="duplicate"),
        pytest.param("n1,64000,1024,2,T4,extra", "6 fields", id="extra-field"),
    ],
)
def test_malformed_node_rows_name_their_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path / "nodes.csv", NODE_HEADER, ["n0,64000,1024,2,T4", row])
    with pytest.raises(TraceError, match=rf"{path}:3: .*{message}"):
        load_nodes(path)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_nodes(tmp_path / "missing.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceError, match=r"empty\.csv:1: empty file"):
        load_pods(empty)
    wrong = write(tmp_path / "wrong.csv", "sn,cpu,gpu", ["n0,1,1"])
    with pytest.raises(TraceError, match=r"wrong\.csv:1: header lacks column\(s\) cpu_milli, memory_mib, model"):
        load_nodes(wrong)
    no_rows = write(tmp_path / "none.csv", NODE_HEADER, [])
    with pytest.raises(TraceError, match="no nodes"):
        load_nodes(no_rows)


def test_nan_model_and_spec_mean_none(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path / "n.csv", NODE_HEADER, ["n0,8000,1024,0,nan"]))
    assert nodes.models == ("",)
    pods = load_pods(write(tmp_path / "p.csv", POD_HEADER, ["p0,1000,512,1,500,nan,LS,Running,0,1,"]))
    assert pods.gpu_spec == ("",)
    assert pods.scheduled.tolist() == [-1]


def test_to_nodes_maps_gpus_and_model_label(tiny_trace: tuple[Path, Path]) -> None:
    node = to_nodes(load_nodes(tiny_trace[0]))[12]  # the first B node: 32 CPUs, 8 GPUs
    assert node.labels == {GPU_MODEL_LABEL: "B"}
    assert node.allocatable["cpu"] == 32000 and node.allocatable["memory"] == 131072 * 2**20
    assert len(node.devices_of("gpu")) == 8
    assert node.devices[0].resources["gpu-core"] == 100 and node.devices[0].resources["gpu-memory-ratio"] == 100


@pytest.mark.parametrize(
    ("k", "d", "want"),
    [
        pytest.param(0, 0, {}, id="cpu-only"),
        pytest.param(1, 460, {"gpu-core": 46, "gpu-memory-ratio": 46}, id="share-460m-is-46pct"),
        pytest.param(1, 1000, {"nvidia.com/gpu": 1}, id="one-whole"),
        pytest.param(8, 1000, {"nvidia.com/gpu": 8}, id="eight-whole"),
    ],
)
def test_gpu_requests(k: int, d: int, want: dict[str, int]) -> None:
    assert gpu_requests(k, d) == want


def test_workload_factory(tmp_path: Path) -> None:
    rows = ["p0,6000,12288,1,460,B|A|A,BE,Running,0,1,0", "p1,2000,0,0,0,A,LS,Running,0,1,0"]
    pods = load_pods(write(tmp_path / "p.csv", POD_HEADER, rows))
    factory = WorkloadFactory()
    share = factory.make(pods, 0)
    assert share.requests == {"cpu": 6000, "memory": 12288 * 2**20, "gpu-core": 46, "gpu-memory-ratio": 46}
    assert share.tenant == "BE" and share.key == "trace/p0"
    assert [(t.key, t.operator, t.values) for t in share.node_affinity] == [(GPU_MODEL_LABEL, "In", ("A", "B"))]
    cpu_only = factory.make(pods, 1, name="p1-tuned-0")
    assert cpu_only.name == "p1-tuned-0" and cpu_only.node_affinity == ()  # a CPU-only pod ignores gpu_spec
    assert models_of("V100M16|V100M32|V100M32") == ("V100M16", "V100M32")


GOOD_POD = "p0,1000,512,1,500,,LS,Running,0,1,0"


def test_unterminated_quote_before_eof_names_its_start_line(tmp_path: Path) -> None:
    # Without the fix the reader ends the row at EOF and reports "p:5: 2 fields, the header has 11".
    rows = [
        GOOD_POD,
        'p1,"1000,512,1,500,,LS,Running,0,1,0',
        "p2,1000,512,1,500,,LS,Running,0,1,0",
        "p3,1000,512,1,500,,LS,Running,0,1,0",
    ]
    path = write(tmp_path / "pods.csv", POD_HEADER, rows)
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: unterminated quote starting on line 3")
    assert "fields" not in message


def test_unterminated_quote_past_the_field_limit_names_its_start_line(tmp_path: Path) -> None:
    # The quote swallows more than csv's 131,072-character field limit; the reader fails far below.
    rows = [GOOD_POD, 'p1,1000,512,1,500,",LS,Running,0,1,0']
    rows += [f"q{i:05d},1000,512,1,500,,LS,Running,0,1,0" for i in range(4000)]
    path = write(tmp_path / "pods.csv", POD_HEADER, rows)
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: unterminated quote starting on line 3")
    assert "field larger than field limit" in message  # the reader's own words, kept as the detail


def test_unterminated_quote_in_the_header(tmp_path: Path) -> None:
    path = write(tmp_path / "nodes.csv", 'sn,"cpu_milli,memory_mib,gpu,model', ["n0,64000,1024,2,T4"])
    with pytest.raises(TraceError, match=rf"{path}:1: unterminated quote starting on line 1"):
        load_nodes(path)


def test_single_line_rows_keep_their_own_line_after_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "pods.csv", POD_HEADER, [GOOD_POD, "", "", "p1,1000,512,1,1200,,LS,Running,0,1,0"])
    with pytest.raises(TraceError, match=rf"{path}:5: gpu_milli must be in 1..1000"):
        load_pods(path)
