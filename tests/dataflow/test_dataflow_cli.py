"""`finesched job plan` (tables, json, --cluster) and `finesched job submit` (against a local stand-in server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from finesched.cli import app

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
CLUSTER = str(ROOT / "examples" / "cluster.yaml")
runner = CliRunner(env={"COLUMNS": "250"})  # wide enough that rich tables keep each cell on one line


def test_plan_prints_regions_groups_slots_and_fractions() -> None:
    result = runner.invoke(app, ["job", "plan", str(JOBS / "batch-shuffle.yaml")], terminal_width=200)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Job default/nightly-report (batch, sources apart): 9" in " ".join(out.split())
    assert "default slot (specs unknown)" in out and "1/n of the users" in out
    for fragment in ("region-2", "hash-join", "0.5", "1Gi", "external-sort"):
        assert fragment in out


def test_plan_json_uses_the_python_api_names() -> None:
    result = runner.invoke(app, ["job", "plan", str(JOBS / "streaming-etl.yaml"), "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["job"] == "analytics/etl" and doc["slots_needed"] == 4 and doc["component_slots"] == 6
    assert doc["groups"] == {"region-0": ["orders-source", "enrich", "orders-sink", "clicks-source", "sessionize"]}
    assert doc["slot_requests"]["region-0"]["cpu"] == 4000  # 0.5 + 0.5 + 1 + 0.25 + 0.5 + 1 + 0.25
    assert doc["fractions"]["session-window"][1] == pytest.approx(2 / 3)  # 1Gi of 1.5Gi managed off-heap
    assert doc["quotas"]["session-window"] == 2**30
    # one subtask-level region too: every source subtask hangs off the virtual source
    [region] = doc["subtask_regions"]
    assert len(region) == 4 + 4 + 2 + 2 + 2 and region[0] == "orders-source#0"


def test_plan_options_override_the_manifest() -> None:
    args = ["job", "plan", str(JOBS / "streaming-etl.yaml"), "-o", "json", "--separate-sources"]
    doc = json.loads(runner.invoke(app, args).stdout)
    assert len(doc["regions"]) == 2 and doc["slots_needed"] == 4 + 2  # the seed's sum over components


def test_plan_trim_partial_pipelines() -> None:
    args = ["job", "plan", str(JOBS / "streaming-etl.yaml"), "-o", "json", "--trim-partial-pipelines"]
    doc = json.loads(runner.invoke(app, args).stdout)
    assert doc["trim_partial_pipelines"] is True
    # slots 2 and 3 hold only orders-source and enrich (parallelism 4): 0.5 + 0.5 + 1 cpu
    assert [s["request"]["cpu"] for s in doc["slots"]] == [4000, 4000, 2000, 2000]
    assert doc["slots"][3]["tasks"] == ["orders-source", "enrich"]
    assert doc["slots"][3]["quotas"] == {"read-orders": 0, "parse-orders": 0, "lookup-customer": 512 * 2**20}
    table = runner.invoke(app, [*args[:-3], "--trim-partial-pipelines"])
    assert table.exit_code == 0 and "Partial pipelines" in table.stdout


def test_plan_with_a_cluster_places_the_gang() -> None:
    args = ["job", "plan", str(JOBS / "gpu-inference.yaml"), "--cluster", CLUSTER, "-o", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    placement = json.loads(result.stdout)["placement"]
    assert placement["status"] == "Bound" and len(placement["slots"]) == 2
    for slot in placement["slots"]:
        assert slot["binding"]["devices"]["gpu"][0]["resources"]["gpu-core"] == "100"  # as the binding view writes it
        assert slot["quotas"] == {"read-frames": 0, "decode": 0, "resnet": 2**30, "write-tags": 0}
    table = runner.invoke(app, args[:-2], terminal_width=200)
    assert table.exit_code == 0 and "Gang placement: Bound" in table.stdout and "resnet=1Gi" in table.stdout


def test_plan_reports_a_gang_that_does_not_fit_as_pending(tmp_path: Path) -> None:
    small = tmp_path / "small.yaml"
    small.write_text(
        "apiVersion: finesched.io/v1alpha1\nkind: Node\nmetadata: {name: tiny}\nspec: {allocatable: {cpu: 1}}\n"
    )
    result = runner.invoke(app, ["job", "plan", str(JOBS / "batch-shuffle.yaml"), "-c", str(small), "-o", "json"])
    assert result.exit_code == 0, result.output
    placement = json.loads(result.stdout)["placement"]
    assert placement["status"] == "Pending" and "none placed" in placement["reason"]
    assert all(slot["binding"] is None for slot in placement["slots"])


def _write_job(tmp_path: Path, tasks: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(f"apiVersion: finesched.io/v1alpha1\nkind: Job\nmetadata: {{name: bad}}\nspec:\n  tasks: {tasks}\n")
    return str(path)


@pytest.mark.parametrize(
    ("tasks", "fragment"),
    [
        pytest.param(
            "[{id: a, parallelism: 0, operators: [{id: x}]}]",
            "spec.tasks[0].parallelism: 0 task a: parallelism must be >= 1",
            id="zero-parallelism",
        ),
        pytest.param(
            "[{id: a, operators: [{id: x, resources: {cpu: 1}}, {id: y}]}]",
            "spec.tasks[0].operators[1].resources: operator y declares no resources",
            id="mixed-specs",
        ),
        pytest.param(
            "[{id: a, operators: [{id: x, resources: {cpu: lots}}]}]",
            "spec.tasks[0].operators[0].resources.cpu",
            id="bad-quantity",
        ),
    ],
)
def test_bad_job_file_exits_1_with_the_field_path(tmp_path: Path, tasks: str, fragment: str) -> None:
    result = runner.invoke(app, ["job", "plan", _write_job(tmp_path, tasks)], terminal_width=300)
    assert result.exit_code == 1
    assert fragment in result.stderr and "Traceback" not in result.output


def test_a_file_without_one_job_is_refused() -> None:
    result = runner.invoke(app, ["job", "plan", CLUSTER], terminal_width=300)
    assert result.exit_code == 1 and "expected one Job document, found 0" in result.stderr


def test_bad_output_is_a_usage_error() -> None:
    result = runner.invoke(app, ["job", "plan", str(JOBS / "batch-shuffle.yaml"), "-o", "xml"])
    assert result.exit_code == 2 and "--output must be one of table, wide, json" in result.stderr


# submit -----------------------------------------------------------------------------------------------
class _Server:
    """A stand-in for the control plane on 127.0.0.1: records requests, answers with `status` and `body`."""

    def __init__(self, status: int, body: dict[str, Any]):
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                owner.requests.append((self.path, dict(self.headers), json.loads(self.rfile.read(length))))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


ANSWER = {
    "job": "ml/image-tagging",
    "status": "Bound",
    "reason": "",
    "slots": [
        {
            "workload": "ml/image-tagging-region-0-0",
            "group": "region-0",
            "binding": {
                "node": "a100-0",
                "cpuset": "0-3",
                "devices": {"gpu": [{"minor": 2, "resources": {"gpu-core": 100}}]},
                "numa": [0],
            },
            "quotas": {"resnet": 1073741824},
        },
        {"workload": "ml/image-tagging-region-0-1", "group": "region-0", "binding": None, "quotas": {"resnet": 1}},
    ],
}


@pytest.fixture
def server() -> Iterator[_Server]:
    stand_in = _Server(201, ANSWER)
    yield stand_in
    stand_in.close()


def test_submit_posts_the_manifest_with_the_token_and_prints_the_slots(server: _Server) -> None:
    args = ["job", "submit", str(JOBS / "gpu-inference.yaml"), "--server", server.url + "/", "--token", "s3cret"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    [(path, headers, body)] = server.requests
    assert path == "/v1/jobs" and headers["Authorization"] == "Bearer s3cret"
    assert body["kind"] == "Job" and body["metadata"] == {"name": "image-tagging", "namespace": "ml"}
    assert [t["id"] for t in body["spec"]["tasks"]] == ["frames", "infer", "tags-sink"]
    for fragment in ("Job ml/image-tagging", "Bound", "a100-0", "gpu 2: 100% core", "resnet=1Gi"):
        assert fragment in result.stdout


def test_submit_reads_server_and_token_from_the_environment(server: _Server) -> None:
    env = {"FINESCHED_SERVER": server.url, "FINESCHED_TOKEN": "from-env"}
    result = runner.invoke(app, ["job", "submit", str(JOBS / "gpu-inference.yaml"), "-o", "json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == ANSWER
    assert server.requests[0][1]["Authorization"] == "Bearer from-env"


def test_submit_refused_by_the_server_exits_1_with_its_reason() -> None:
    refusing = _Server(403, {"detail": "job ml/image-tagging belongs to another tenant"})
    try:
        args = ["job", "submit", str(JOBS / "gpu-inference.yaml"), "--server", refusing.url]
        result = runner.invoke(app, args, terminal_width=300)
    finally:
        refusing.close()
    assert result.exit_code == 1
    assert "refused the job (403): job ml/image-tagging belongs to another tenant" in result.stderr


def test_submit_without_a_server_or_with_bad_input_sends_nothing(tmp_path: Path, server: _Server) -> None:
    result = runner.invoke(app, ["job", "submit", str(JOBS / "gpu-inference.yaml")], env={"FINESCHED_SERVER": ""})
    assert result.exit_code == 2 and "--server (or FINESCHED_SERVER) is required" in result.stderr
    bad = _write_job(tmp_path, "[{id: a, parallelism: 0, operators: [{id: x}]}]")
    result = runner.invoke(app, ["job", "submit", bad, "--server", server.url], terminal_width=300)
    assert result.exit_code == 1 and "parallelism must be >= 1" in result.stderr
    assert server.requests == []


def test_submit_to_an_unreachable_server_exits_1() -> None:
    closed = _Server(201, {})
    url = closed.url
    closed.close()  # nothing listens on that port any more
    result = runner.invoke(
        app, ["job", "submit", str(JOBS / "gpu-inference.yaml"), "--server", url], terminal_width=300
    )
    assert result.exit_code == 1 and f"cannot reach {url}/v1/jobs" in result.stderr
