"""schemathesis against a real server, with every check (`--checks all`): no 5xx, every status and
body as the OpenAPI document says, schema-violating input refused, OPTIONS and 405 with the real
`Allow`, authentication required where declared.

schemathesis runs as its own command (its pytest plugin does not support this pytest), over every
operation of /openapi.json but the SSE watch (a stream that never ends, tested on its own) and the
token revocation (it would revoke the fuzzer's own token; tests/server/test_server_tokens.py), with
tests/server/schemathesis.toml (why some operations may answer 422 to schema-valid input). The
example count is kept small so this runs in about a minute; a large run is a command line:

    schemathesis --config-file tests/server/schemathesis.toml run URL/openapi.json \\
        -H "Authorization: Bearer TOKEN" --checks all --exclude-path /v1/events/watch \\
        --exclude-name "DELETE /v1/tokens/{token_id}" --max-examples 100
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from manifests import node, workload
from server_harness import inprocess_server

from finesched.server.api.auth_limit import FailedAuthLimiter
from finesched.server.loop.loop import LoopConfig

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")


def test_every_check_passes_on_every_operation(tmp_path: Path) -> None:
    # schemathesis sends hundreds of requests without a token, each expecting a 401: the limit of
    # failed authentications per address (tested on its own) is raised out of its way
    unlimited = FailedAuthLimiter(burst=10**9)
    with inprocess_server(
        f"sqlite:///{tmp_path / 'fuzz.db'}", LoopConfig(idle_wait_s=0.05), auth_limiter=unlimited
    ) as api:
        api.admin.post("/v1/nodes", json=node("n1", gpus=1))
        api.admin.post("/v1/workloads", json=[workload("w1"), workload("w2", namespace="team-b")])
        done = subprocess.run(
            [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", f"{api.base}/openapi.json",
             "--header", f"Authorization: {api.admin.headers['Authorization']}",
             "--checks", "all", "--exclude-path", "/v1/events/watch", "--exclude-name", "DELETE /v1/tokens/{token_id}",
             "--max-examples", "8", "--seed", "1", "--generation-deterministic"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        selected = re.search(r"Selected: (\d+)/", done.stdout)
        tested = re.search(r"Tested: (\d+)", done.stdout)
        assert selected and tested and tested.group(1) == selected.group(1), done.stdout[-3000:]
        assert int(tested.group(1)) >= 33  # every operation of the API but the watch
        cases = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
        assert cases and cases.group(1) == cases.group(2) and int(cases.group(1)) > 1000, done.stdout[-3000:]
