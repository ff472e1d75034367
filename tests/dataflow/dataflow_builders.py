"""Small builders for dataflow jobs in tests: dicts in the manifest's shape, parsed into a Job."""

from __future__ import annotations

from typing import Any

from finesched.model.job import Job

MiB = 2**20


def op(op_id: str, **resources: Any) -> dict[str, Any]:
    """An operator; keyword resources use manifest names (cpu, taskHeap, managedOffHeap, gpu, ...)."""
    return {"id": op_id, "resources": resources} if resources else {"id": op_id}


def uses(op_id: str, on: bool = False, off: bool = False, weight: int | None = None) -> dict[str, Any]:
    """An operator without resources that uses managed memory (S2.4's unknown case)."""
    out: dict[str, Any] = {"id": op_id, "usesManagedMemory": {"onHeap": on, "offHeap": off}}
    if weight is not None:
        out["weight"] = weight
    return out


def task(task_id: str, *ops: dict[str, Any], p: int = 1, group: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": task_id, "parallelism": p, "operators": list(ops) or [op(f"{task_id}.op")]}
    if group is not None:
        out["slotSharingGroup"] = group
    return out


def edge(source: str, target: str, kind: str = "pipelined", pattern: str = "all-to-all") -> dict[str, Any]:
    return {"from": source, "to": target, "type": kind, "pattern": pattern}


def blocking(source: str, target: str) -> dict[str, Any]:
    return edge(source, target, "blocking")


def make_job(tasks: list[dict[str, Any]], edges: list[dict[str, Any]] | tuple[()] = (), **spec: Any) -> Job:
    return Job.model_validate({"name": "j", "tasks": tasks, "edges": list(edges), **spec})


def chain(*ids: str, **task_fields: Any) -> list[dict[str, Any]]:
    """Tasks `ids` with default operators (unknown specs)."""
    return [task(i, **task_fields) for i in ids]
