"""A fragmented cluster built through the API, for the dry-run defragmentation tests (server, CLI,
console): one node, two GPUs each 30 % used, the mover another tenant's workload that allows moves."""

from __future__ import annotations

from typing import Any

import pytest
from manifests import node, workload
from server_harness import Api

from finesched.sched.defrag_plan import find_defragmentation

MOVABLE = {"allowed": True}
WHOLE_GPU = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1}


def _planner_missing() -> bool:
    try:
        return find_defragmentation(None, None, None, 0.0)[1] == "the planner is not written yet"  # type: ignore[arg-type]
    except Exception:  # a real planner reads its arguments
        return False


#: Until the planner is merged (sched/defrag_plan.py answers that it is not written), no plan has moves.
needs_planner = pytest.mark.skipif(
    _planner_missing(), reason="the defragmentation planner (sched/defrag_plan.py) is not merged yet"
)


def share(core: int) -> dict[str, Any]:
    """A GPU share of `core` % (core and memory), 1 cpu, 1Gi."""
    return {"cpu": "1", "memory": "1Gi", "gpu-core": core, "gpu-memory-ratio": core}


def fragmented(api: Api) -> None:
    """n1 with two GPUs, each 30 % used (the default profile spreads shares over the cards): team-a's
    share stays where it is, team-b's allows moves. A whole GPU fits nowhere beside 1.4 idle GPUs."""
    assert api.admin.post("/v1/nodes", json=node("n1", gpus=2)).status_code == 201
    api.admin.post("/v1/workloads", json=workload("pinned", requests=share(30))).raise_for_status()
    api.wait_phase("team-a/pinned", ("Bound",))
    mover = workload("mover", namespace="team-b", requests=share(30), migration=MOVABLE)
    api.admin.post("/v1/workloads", json=mover).raise_for_status()
    bound = api.wait_phase("team-b/mover", ("Bound",))
    (pinned_gpu,) = api.admin.get("/v1/workloads/team-a/pinned").json()["status"]["binding"]["devices"]["gpu"]
    assert bound["status"]["binding"]["devices"]["gpu"][0]["minor"] != pinned_gpu["minor"]  # fragmented
