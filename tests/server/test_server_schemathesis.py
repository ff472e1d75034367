"""Property-based API fuzzing with schemathesis against a real server: no request may cause a 5xx.

schemathesis runs as its own command (its pytest plugin does not support this pytest), over every
operation of /openapi.json but the SSE watch (a stream that never ends, tested on its own).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from manifests import node, workload
from server_harness import inprocess_server

from finesched.server.loop import LoopConfig

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def test_no_server_errors(tmp_path: Path) -> None:
    with inprocess_server(f"sqlite:///{tmp_path / 'fuzz.db'}", LoopConfig(idle_wait_s=0.05)) as api:
        api.admin.post("/v1/nodes", json=node("n1", gpus=1))
        api.admin.post("/v1/workloads", json=[workload("w1"), workload("w2", namespace="default")])
        done = subprocess.run(
            [str(SCHEMATHESIS), "run", f"{api.base}/openapi.json",
             "--header", f"Authorization: {api.admin.headers['Authorization']}",
             "--checks", "not_a_server_error", "--exclude-path", "/v1/events/watch",
             "--phases", "examples,coverage,fuzzing", "--max-examples", "30", "--seed", "1",
             "--generation-deterministic"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        selected = re.search(r"Selected: (\d+)/", done.stdout)
        tested = re.search(r"Tested: (\d+)", done.stdout)
        assert selected and tested and tested.group(1) == selected.group(1), done.stdout[-3000:]
        assert int(tested.group(1)) >= 30  # every operation of the API but the watch
