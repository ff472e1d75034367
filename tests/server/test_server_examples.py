"""Every example in `examples/` runs as the documentation (README.md, docs/) and the example's own
header say, on a fresh control plane: no tenant but the implicit `default`, an admin's token as
`finesched up` prints one, and a tenant's token where the docs run one (`FINESCHED_TOKEN=$TEAM_A`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from server_harness import FINESCHED, inprocess_server

from docs_pages import all_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").rglob("*.yaml"))
#: A placeholder the reader replaces (JOB.yaml, NAME, [--option ...]): such a line is a form, not a command.
PLACEHOLDER = re.compile(r"\[|\b[A-Z]{2,}\b(?!=)")


def documented_commands() -> list[str]:
    """The `finesched ...` commands on examples/ that the documentation shows (code blocks and inline
    code, README.md then docs/) and that each example's header comment gives, in that order; `a && b`
    as two commands."""
    readme = all_text()
    lines = [ln for block in re.findall(r"```(?:sh|text)\n(.*?)```", readme, flags=re.S) for ln in block.splitlines()]
    lines += re.findall(r"`((?:[A-Z_]+=\S+ )?finesched [^`]*)`", readme)
    for example in EXAMPLES:
        lines += re.findall(r"^#\s*(?:Try:\s*)?(finesched .*)$", (ROOT / example).read_text(), flags=re.M)
    commands = []
    for line in lines:
        if "examples/" not in line.split(" # ")[0]:
            continue
        for part in line.split(" && "):  # `finesched job submit examples/... && finesched describe job ...`
            command = part.split("  #")[0].split(" # ")[0].strip().removeprefix("$ ")
            bare = command.replace("$FINESCHED_SERVER", "").replace("$TEAM_A", "")
            if "finesched " in command and not PLACEHOLDER.search(bare):
                commands.append(command)
    return list(dict.fromkeys(commands))


def test_every_example_is_named_by_a_documented_command() -> None:
    named = " ".join(documented_commands())
    readme = all_text()
    for example in EXAMPLES:  # run-demo.yaml is `make run`'s: submitted as the docs say, below
        assert example in named or (example == "examples/run-demo.yaml" and f"submits `{example}`" in readme), example


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_example_runs_as_documented_on_a_fresh_server(db_url: str) -> None:
    commands = documented_commands()
    first = "finesched submit -f examples/cluster.yaml -f examples/workloads.yaml"  # the documented order
    assert first in commands
    commands = [first, *(c for c in commands if c != first), "finesched submit -f examples/run-demo.yaml"]
    with inprocess_server(db_url, tenants=()) as api:  # a new server: the examples make their tenants
        env = {**os.environ, "COLUMNS": "80", "FINESCHED_SERVER": api.base, "FINESCHED_TOKEN": api.token("admin")}
        team_a: str | None = None
        for command in commands:
            run_env = dict(env)
            words = command.replace("$FINESCHED_SERVER", api.base).split()
            if words[0] == "FINESCHED_TOKEN=$TEAM_A":  # as the docs: a token of tenant team-a
                team_a = team_a or api.token("tenant", tenant="team-a")
                run_env["FINESCHED_TOKEN"] = team_a
                words = words[1:]
            assert words[0] == "finesched", command
            done = subprocess.run([*FINESCHED, *words[1:]], capture_output=True, text=True, timeout=120, env=run_env,
                                  cwd=ROOT)  # fmt: skip
            assert done.returncode == 0, f"{command}: {done.stderr}"
        assert team_a is not None  # the docs' tenant-token line ran
        # the control-plane page's curl: POST /v1/plan with the YAML file as it is
        answer = api.admin.post("/v1/plan", content=(ROOT / "examples/what-if.yaml").read_bytes(),
                                headers={"content-type": "application/yaml"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        planned = {r["workload"]: r for r in answer.json()["results"]}
        assert set(planned) == {"team-a/what-if-infer", "team-a/what-if-train", "team-a/what-if-huge"}
        # as the file's comments say, beside the documented workloads: two fit, one fits nowhere
        assert planned["team-a/what-if-infer"]["node"] and planned["team-a/what-if-train"]["node"], planned
        huge = planned["team-a/what-if-huge"]
        assert huge["node"] is None and "insufficient cpu" in huge["error"], huge
        assert (
            api.admin.get("/v1/jobs/default/clicks").status_code == 200
        )  # two-regions.yaml, where a fresh cluster has room
