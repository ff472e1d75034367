"""A fragmented cluster built through the API, for the dry-run defragmentation tests (server, CLI,
console): one node, two GPUs each 30 % used, the mover another tenant's workload that allows moves."""

from __future__ import annotations

from typing import Any

from manifests import node, workload
from server_harness import Api

MOVABLE = {"allowed": True}
WHOLE_GPU = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1}


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
